"""Compile a generated C++ kernel and launch it cheaply from Python.

``CppLauncher(source, func_name, n_args, has_checks)`` starts the build at once on a shared thread pool;
with ``batch=True`` (what the backend uses) the first ``wait()`` compiles every pending kernel together,
one source per CPU core (docs/cpp_backend.md, "Building and caching"). A call goes through a Python
function generated for the kernel's arity over a ctypes function whose ``argtypes`` are set once; a kernel
that bounds-checks indirect indices fills an ``int64[4]`` error record and returns nonzero, and the
launcher raises ``coil.exc.KernelIndexError`` (an IndexError and a RuntimeError)."""
from __future__ import annotations

import ctypes
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional, Sequence

from coil.exc import KernelIndexError
from coil.runtime import cpp_build

_PRELUDE: Optional[str] = None
_pool: Optional[ThreadPoolExecutor] = None
_pending: list = []
_pending_lock = threading.Lock()


def prelude() -> str:
    """The text of ``prelude.h`` (inlined into every source so it is in the cache key)."""
    global _PRELUDE
    if _PRELUDE is None:
        with open(os.path.join(os.path.dirname(__file__), "prelude.h")) as f:
            _PRELUDE = f.read()
    return _PRELUDE


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="coil-cxx")
    return _pool


class CppLauncher:
    """A compiled (or compiling) C++ kernel callable as ``launcher(*tensors)``."""

    def __init__(self, source: str, func_name: str, n_args: int, has_checks: bool, describe: str = "",
                 batch: bool = False, check_origins: Sequence = (), n_sizes: int = 0):
        self.source, self.func_name, self.n_args = source, func_name, n_args
        #: int64 size arguments after the tensors (dynamic shapes)
        self.n_sizes, self.has_checks = n_sizes, has_checks
        #: per bounds-check site ``#n``: the user's line it checks (``"m.py:5 in f: ..."``)
        #: or None; read only when a check fails
        self.check_origins = list(check_origins)
        self.describe = describe or func_name
        self.symbol = func_name  # the compiled function: one copy's, for every copy of a body
        self._future: Optional[Future] = None
        self._call: Optional[Callable] = None
        if batch:
            with _pending_lock:
                _pending.append(self)
        else:
            self._future = _executor().submit(cpp_build.build, source)

    def wait(self) -> "CppLauncher":
        """Finish the build; raises :class:`coil.runtime.cpp_build.CppBuildError`."""
        if self._call is None:
            if self._future is None:
                _flush()
            fn = getattr(self._future.result(), self.symbol)
            fn.argtypes = ([ctypes.c_void_p] * self.n_args + [ctypes.c_int64] * self.n_sizes + [ctypes.c_void_p])
            fn.restype = ctypes.c_int64
            self._call = self._make_call(fn)
        return self

    def _make_call(self, fn) -> Callable:
        names = [f"a{i}" for i in range(self.n_args)]
        ptrs = ", ".join([f"{n}.data_ptr()" for n in names] + [f"n{i}" for i in range(self.n_sizes)])
        names += [f"n{i}" for i in range(self.n_sizes)]
        ns = {"fn": fn}
        if self.has_checks:
            err = (ctypes.c_int64 * 4)()
            ns.update(err=err, err_ptr=ctypes.addressof(err), fail=self._fail)
            src = (f"def call({', '.join(names)}):\n"
                   f"    if fn({ptrs}{', ' if ptrs else ''}err_ptr):\n"
                   f"        fail(err)\n")
        else:
            src = f"def call({', '.join(names)}):\n    fn({ptrs}{', ' if ptrs else ''}None)\n"
        exec(compile(src, f"<coil launcher {self.func_name}>", "exec"), ns)
        return ns["call"]

    def _fail(self, err) -> None:
        idx, size, site = err[1], err[2], err[3]
        for i in range(4):
            err[i] = 0
        msg = (f"index {idx} is out of bounds for dimension with size {size} "
               f"(coil C++ kernel {self.func_name}, check #{site})")
        if (origin := self.check_origins[site] if 0 <= site < len(self.check_origins) else None):
            msg += f" -- from {origin}"
        raise KernelIndexError(msg)

    def __call__(self, *tensors):
        if self._call is None:
            self.wait()
        return self._call(*tensors)


def _flush() -> None:
    """Build all pending (batch) kernels: one source per core, in parallel."""
    with _pending_lock:
        pending = list(_pending)
        _pending.clear()
        reps: dict = {}  # body without its name, comment lines, buffer names -> a launcher
        for la in pending:  # the same body in every layer compiles once
            ps: dict = {}  # parameters p_<buffer> by first use: the signature's order
            key = re.sub(r"\bp_\w+", lambda m: ps.setdefault(m[0], f"p{len(ps)}"), re.sub(
                r"(?m)^[ \t]*//.*\n", "", re.sub(rf"\b{la.func_name}\b", "@K", la.source)))
            la._rep = reps.setdefault(key, la)
            la.symbol = la._rep.func_name
        if not (batch := list(reps.values())):
            return
        n = max(1, min(len(batch), os.cpu_count() or 1))
        chunks: list[list[CppLauncher]] = [[] for _ in range(n)]
        names: list[set] = [set() for _ in range(n)]
        for i, launcher in enumerate(batch):
            j = i % n
            while launcher.func_name in names[j]:  # same name from another graph
                j += 1
                if j == len(chunks):
                    chunks.append([])
                    names.append(set())
            chunks[j].append(launcher)
            names[j].add(launcher.func_name)
        for chunk in chunks:
            if not chunk:
                continue
            fut = _executor().submit(cpp_build.build, prelude() + "\n" + "\n\n".join(l.source for l in chunk) + "\n")
            for l in chunk:
                l._future = fut
        for la in pending:  # (by launcher: two graphs' kernels may share a name)
            la._future = la._rep._future
