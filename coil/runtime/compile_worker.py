"""A process that compiles Triton kernels into Triton's on-disk cache, for compile_pool.

Run as ``python -m coil.runtime.compile_worker``. It reads one JSON job per line on
stdin and answers one JSON line per job on stdout, in order::

    {"id": 7, "path": ".../k3f2a....py", "module": "coil_triton_3f2a..._0",
     "name": "coil_poi_3f2a91c0d4", "args": ["float32", "bfloat16", 12288, 768],
     "config": {"XBLOCK": 1024, "num_warps": 4}, "env": {"TRITON_PTXAS_PATH": "..."}}
    -> {"id": 7, "ok": true, "seconds": 0.41}
    -> {"id": 7, "ok": false, "error": "OutOfResources: ..."}

Each job is ``JITFunction.warmup(*args, grid=(1,), **config)`` (Triton 3.x: torch dtypes stand for 16-byte-aligned
tensors of that dtype; an int is the value the launcher will pass, a dynamic kernel's size hint, which Triton
specializes as it will the real one: divisible by 16, equal to 1, 32-bit): it compiles without launching and writes the
binary to Triton's cache directory, which the parent process shares, so the parent's own compile of the same kernel,
signature and options loads it from disk; the worker also builds the kernel's host launcher into that cache
(:func:`_build_launcher`). The module is imported under the parent's module name, and the parent's ``TRITON_*``
variables at submit time are set first, so that everything Triton hashes is the same in both processes. stdout carries
only the answers (anything else a kernel module prints goes to stderr)."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time


def _load(path: str, module: str, cache: dict):
    if path not in cache:
        spec = importlib.util.spec_from_file_location(module, path)
        mod = sys.modules[module] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        cache[path] = mod
    return cache[path]


def sync_triton_env(env: dict) -> None:
    """Make this process's ``TRITON_*`` variables (but ``TRITON_INTERPRET``) those of the parent at
    submit time, ``env`` (:func:`coil.runtime.compile_pool.triton_env`): Triton reads its settings from
    the environment at each access and hashes some into its cache key."""
    for k in [k for k in os.environ if k.startswith("TRITON_") and k != "TRITON_INTERPRET"]:
        if k not in env:
            del os.environ[k]
    os.environ.update(env)


def _build_launcher(kernel) -> None:
    """Build the host launcher of a compiled kernel here, so that the parent finds it in Triton's cache: Triton versions
    that generate a C launcher per kernel signature compile it with the host C compiler at a signature's first launch,
    in the parent's thread, one kernel after another. Optional: any failure is ignored (the parent builds it)."""
    try:
        import fcntl
        import hashlib
        import tempfile
        from triton.runtime.driver import driver
        # one build per signature across the workers: the others wait, then load it
        sig = repr((sorted(kernel.src.signature.items()), sorted(map(repr, kernel.src.constants.items()))))
        lock = os.path.join(tempfile.gettempdir(), "coil-launcher-"
                            + hashlib.sha256(sig.encode()).hexdigest()[:16] + ".lock")
        with open(lock, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 - another Triton version: the parent builds it
        pass


def run_job(job: dict, modules: dict) -> dict:
    """Compile one (kernel, config); returns the answer dict (never raises)."""
    import torch
    t0 = time.perf_counter()
    if "env" in job:
        sync_triton_env(job["env"])
    try:
        fn = getattr(_load(job["path"], job["module"], modules), job["name"])
        args = [getattr(torch, a) if isinstance(a, str) else a for a in job["args"]]
        kernel = fn.warmup(*args, grid=(1,), **job["config"])
        compiled = time.perf_counter()
        _build_launcher(kernel)
        return {"id": job["id"], "ok": True, "seconds": time.perf_counter() - t0,
                "launcher_s": time.perf_counter() - compiled}
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which compiles itself
        return {"id": job["id"], "ok": False, "error": f"{type(e).__name__}: {str(e)[-500:]}"}


def main() -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # kernel modules or Triton printing must not corrupt the answers
    import torch
    if torch.cuda.is_available():
        torch.cuda.init()
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    modules: dict = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        out.write(json.dumps(run_job(json.loads(line), modules)) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
