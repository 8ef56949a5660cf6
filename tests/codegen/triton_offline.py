"""Test helper: compiling generated Triton kernels for a GPU target without a GPU (``sm_90`` by default).

Triton's CPU interpreter runs kernels that the real compiler rejects (``libdevice.fmod``
of int64 tensors ran under the interpreter and failed with ``CompilationError`` on an
H200), so CPU tests of the Triton backend can pass while every GPU run falls back to ATen
ops. :func:`compile_offline` closes that gap: it runs the real front end and back end
(``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``, ptxas included)
on a kernel's source.

The compile runs in a child process (``python triton_offline.py``, one JSON
list of jobs on stdin, one JSON list of answers on stdout): Triton decides at import time
whether its own library functions are interpreted, and a process running the
interpreter (every CPU test process) cannot also compile.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

#: Triton's signature spelling of each torch dtype a kernel pointer can have.
_TRITON_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
                 "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
                 "bool": "i1"}


#: Elements per block offline compiles use at most (by shrinking XBLOCK; default configs)
OFFLINE_BLOCK_ELEMENTS = 2048


def kernel_job(kernel, config: Optional[dict] = None) -> dict:
    """The job for one :class:`coil.codegen.backend.GeneratedKernel` of the Triton backend: its source, name,
    argument dtypes and launch config. Default config: the launcher's chosen or first one with XBLOCK shrunk
    to at most :data:`OFFLINE_BLOCK_ELEMENTS` elements per block (RBLOCK is kept: a persistent reduction's
    block holds its row). The CPU interpreter's configs are sized for NumPy (64 x 1024 tiles), which ptxas
    takes minutes to allocate registers for, and the kernel's text does not depend on XBLOCK."""
    launcher = kernel.launcher
    cfg = dict(config or launcher.chosen or launcher.configs[0])
    if config is None:
        per_row = cfg.get("RBLOCK", 1)
        cfg["XBLOCK"] = max(1, min(cfg["XBLOCK"], OFFLINE_BLOCK_ELEMENTS // per_row))
    return dict(source=kernel.source, name=kernel.name, config=cfg,
                dtypes=[str(d).replace("torch.", "") for d in launcher.arg_dtypes])


def compile_offline(jobs: list[dict], arch: int = 90, timeout: float = 600.0) -> list[Optional[str]]:
    """Compile each job (:func:`kernel_job`) for CUDA ``sm_<arch>``; per job None when it
    compiled, else the compiler's error text. Raises ``RuntimeError`` if the child process
    fails as a whole (e.g. Triton has no CUDA back end here)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(arch)],
                          input=json.dumps(jobs), capture_output=True, text=True,
                          timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"offline Triton compile failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _compile_one(job: dict, index: int, arch: int, workdir: str) -> Optional[str]:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = os.path.join(workdir, f"k{index}.py")
    with open(path, "w") as f:
        f.write(job["source"])
    name = f"coil_offline_{index}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
        fn = getattr(mod, job["name"])
        cfg = dict(job["config"])
        num_warps = cfg.pop("num_warps", 4)
        signature, constexprs = {}, {}
        for i, arg in enumerate(fn.arg_names):
            if arg in cfg:
                signature[arg], constexprs[arg] = "constexpr", cfg[arg]
            elif i < len(job["dtypes"]):
                signature[arg] = "*" + _TRITON_TYPES[job["dtypes"][i]]
            else:  # size arguments (dynamic shapes) follow the tensors
                signature[arg] = "i64"
        triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": num_warps})
        return None
    except Exception as e:  # noqa: BLE001 - the answer for this job
        return f"{type(e).__name__}: {e}"[-3000:]


def main() -> int:
    """Child process: compile the jobs read from stdin, print the answers."""
    import tempfile
    import warnings

    warnings.simplefilter("ignore")
    arch = int(sys.argv[1]) if len(sys.argv) > 1 else 90
    jobs = json.loads(sys.stdin.read())
    with tempfile.TemporaryDirectory() as d:
        answers = [_compile_one(j, i, arch, d) for i, j in enumerate(jobs)]
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
