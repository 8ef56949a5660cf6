"""Build and load C++ kernels: system compiler → shared object → ctypes, with a disk cache.

The C++ code generator (``coil/codegen/cpp``) produces source text; this module turns it into callable functions and
knows nothing about kernels. docs/cpp_backend.md ("Building and caching") gives the design; in short:

- **Compiler** ``$CXX`` or the first of ``g++``, ``c++``, ``clang++``; flags :data:`DEFAULT_FLAGS` plus
  ``config.cpp_extra_flags``. Kernels keep IEEE semantics (no ``-ffast-math``, no ``-fno-trapping-math``, no fused
  multiply-adds: ``-ffp-contract=off``, fuzz s1006 #412); ``-fwrapv`` because eager's int64 results wrap;
  ``-fno-tree-loop-if-convert`` because GCC 12 merged two masked blocks into one (fuzz s202 #16952). The doc names the
  wrong results each flag prevents.
- **Cache** sha256 of (source, compiler path, its ``--version``, flags) names ``<cache_dir>/cpp/<key[:2]>/<key>.so``,
  written to a temporary file and renamed; a warm call never starts the compiler; a second build of one key in a process
  returns the loaded library.
- **Failures** :class:`CompilerNotFound` and :class:`CppCompileError` (both :class:`CppBuildError`), which the code
  generator turns into a logged extern fallback.
- **Threads** OpenMP kernels use :func:`num_threads` threads, in torch's own libgomp."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Optional, Sequence

import torch

from coil import trace
from coil.exc import CoilError
from coil.config import config

__all__ = ["CppBuildError", "CompilerNotFound", "CppCompileError", "compiler", "compile_flags", "cache_key",
           "cache_root", "build", "num_threads", "stats"]

DEFAULT_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
                 "-fno-strict-aliasing", "-fwrapv", "-fno-tree-loop-if-convert", "-ffp-contract=off",
                 "-fno-math-errno", "-Wno-unused-variable", "-Wno-unused-but-set-variable")


class CppBuildError(CoilError):
    """A C++ kernel could not be built; ``reason`` is a one-line summary."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason, self.detail = reason, detail
        super().__init__(reason + (f"\n{detail}" if detail else ""))


class CompilerNotFound(CppBuildError):
    """No C++ compiler on this machine (set ``CXX`` or install g++)."""


class CppCompileError(CppBuildError):
    """The compiler rejected the source; ``detail`` holds its stderr."""


_lock = threading.Lock()
_compiler: Optional[tuple[str, str]] = None  # (path, version text)
_loaded: dict[str, ctypes.CDLL] = {}
#: Counters for tests and the compile log: compiler invocations, disk hits, memory hits.
stats = {"compiles": 0, "disk_hits": 0, "memory_hits": 0}


def compiler() -> tuple[str, str]:
    """The C++ compiler ``(path, version text)``; raises :class:`CompilerNotFound`.

    ``$CXX`` wins when set (it may be a name on PATH or a path). Asked once per
    process (the answer is cached until :func:`_reset_compiler`)."""
    global _compiler
    with _lock:
        if _compiler is not None:
            return _compiler
        candidates = [env] if (env := os.environ.get("CXX")) else ["g++", "c++", "clang++"]
        for name in candidates:
            if (path := shutil.which(name) if name else None) is None:
                continue
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise CompilerNotFound(f"C++ compiler {path!r} could not run: {e}") from e
            if out.returncode != 0:
                raise CompilerNotFound(f"C++ compiler {path!r} --version failed", out.stderr[-2000:])
            _compiler = (path, out.stdout.strip())
            return _compiler
        raise CompilerNotFound(
            f"no C++ compiler found (tried {', '.join(c for c in candidates if c)}); "
            "install g++ or set CXX, or use options={'cpu_backend': 'triton'}")


def _reset_compiler() -> None:
    """Forget the detected compiler (tests that change ``CXX``)."""
    global _compiler
    with _lock:
        _compiler = None


def compile_flags() -> list[str]:
    """The full flag list: defaults, then ``config.cpp_extra_flags``."""
    return [*DEFAULT_FLAGS, *shlex.split(config.cpp_extra_flags or "")]


def cache_root() -> str:
    """``<config.cache_dir or ~/.cache/coil>/cpp``."""
    return os.path.join(config.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "coil"), "cpp")


def cache_key(source: str, flags: Sequence[str]) -> str:
    """sha256 hex of the source, compiler path and version, and the flags."""
    path, version = compiler()
    return hashlib.sha256(b"".join(p.encode() + b"\1" for p in (source, path, version, "\0".join(flags)))).hexdigest()


def num_threads() -> int:
    """OpenMP threads for kernels: ``config.cpp_threads`` or ``torch.get_num_threads()``."""
    return config.cpp_threads if config.cpp_threads > 0 else max(1, torch.get_num_threads())


def _compile_to(source: str, flags: list[str], so_path: str) -> None:
    path, _ = compiler()
    d = os.path.dirname(so_path)
    os.makedirs(d, exist_ok=True)
    fd, tmp_so = tempfile.mkstemp(suffix=".so", dir=d)
    os.close(fd)
    src_path, tmp_src = so_path[:-3] + ".cpp", tmp_so[:-3] + ".cpp"
    try:
        with open(tmp_src, "w") as f:
            f.write(source)
        cmd = [path, *flags, tmp_src, "-o", tmp_so]
        t0 = time.perf_counter()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise CompilerNotFound(f"C++ compiler {path!r} could not run: {e}") from e
        with _lock:
            stats["compiles"] += 1
        if out.returncode != 0:
            raise CppCompileError(f"C++ compile failed (exit {out.returncode}): {shlex.join(cmd)}", out.stderr[-6000:])
        trace.log("cpp_compile", stage="codegen", so=so_path, duration_ms=round((time.perf_counter() - t0) * 1e3, 2))
        os.replace(tmp_src, src_path)  # keep the source next to the object for reading
        os.replace(tmp_so, so_path)
    finally:
        for p in (tmp_so, tmp_src):
            if os.path.exists(p):
                os.unlink(p)


def build(source: str) -> ctypes.CDLL:
    """Compile ``source`` (unless cached) and return the loaded library.

    Raises :class:`CompilerNotFound` or :class:`CppCompileError`. Repeated calls with
    the same source and flags return the same ``ctypes.CDLL`` object."""
    flags = compile_flags()
    key = cache_key(source, flags)
    if (lib := _loaded.get(key)) is not None:
        with _lock:
            stats["memory_hits"] += 1
        return lib
    so = os.path.join(cache_root(), key[:2], key + ".so")
    if os.path.exists(so):
        with _lock:
            stats["disk_hits"] += 1
    else:
        _compile_to(source, flags, so)
    try:
        lib = ctypes.CDLL(so)
    except OSError as e:
        raise CppCompileError(f"could not load compiled kernel {so}: {e}") from e
    with _lock:
        return _loaded.setdefault(key, lib)
