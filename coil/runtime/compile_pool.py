"""Compiling Triton kernels in worker processes, ahead of their first launch (GPU only).

Triton's compilation mostly holds the GIL, so every launcher, as soon as code generation creates it, queues one job per
candidate config (:func:`submit`) to a few ``python -m coil.runtime.compile_worker`` processes that compile into
Triton's on-disk cache, which this process shares. Nothing here can change results: a worker only fills a cache whose
keys Triton computes, and a differing key is a miss. :func:`claim` runs before the launcher compiles: jobs not started
are taken back, running ones waited for (``config.autotune_compile_timeout``). docs/codegen.md ("Compile-worker pool")
gives the design and the ``compile_pool_*`` events."""
from __future__ import annotations

import contextlib
import atexit
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Optional

from coil import trace
from coil.config import config

QUEUED, RUNNING, DONE, CLAIMED = "queued", "running", "done", "claimed"


class _Job:
    __slots__ = ("id", "payload", "state", "done", "result", "pool")

    def __init__(self, jid: int, payload: dict, pool: "CompilePool"):
        self.id, self.payload, self.state, self.pool = jid, payload, QUEUED, pool
        self.done, self.result = threading.Event(), None


class CompilePool:
    """``workers`` compile-worker subprocesses fed from one FIFO queue by one thread
    each. :meth:`submit` never blocks; :meth:`claim` takes back or waits for jobs."""

    def __init__(self, workers: int):
        self._lock = threading.Lock()
        self._queue: "queue.Queue[_Job]" = queue.Queue()
        self._next, self._procs = 0, []
        self._ready, self.alive = threading.Event(), 0
        #: jobs queued or running; time of the last submit or finished job
        self._pending, self._last = 0, time.monotonic()
        self.closed = False
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        for _ in range(workers):
            try:
                p = subprocess.Popen([sys.executable, "-m", "coil.runtime.compile_worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
            except OSError as e:
                trace.log("compile_pool_broken", stage="runtime", error=str(e))
                break
            self._procs.append(p)
            self.alive += 1
            threading.Thread(target=self._serve, args=(p,), daemon=True).start()
        atexit.register(self.close)
        threading.Thread(target=self._stop_when_idle, daemon=True).start()
        trace.log("compile_pool_start", stage="runtime", workers=len(self._procs))

    def _stop_when_idle(self) -> None:
        """Close the workers (and their CUDA contexts, ~0.5 GB of GPU memory each) once no job was queued or running for
        ``config.autotune_compile_idle_s`` seconds; :func:`get_pool` starts a new pool for later compiles."""
        while not self.closed:
            idle = max(0.1, config.autotune_compile_idle_s)
            time.sleep(min(1.0, idle))
            with self._lock:
                if (stop := self._pending == 0 and time.monotonic() - self._last > idle):
                    self.closed = True  # submit() now refuses, before the workers go
            if stop:
                trace.log("compile_pool_stop", stage="runtime", reason="idle", idle_s=idle)
                self.close()

    def submit(self, payload: dict) -> _Job:
        with self._lock:
            job = _Job(self._next, payload, self)
            self._next += 1
            if not (refuse := self.alive == 0 or self.closed):
                self._pending += 1
                self._last = time.monotonic()
        if refuse:
            job.state = CLAIMED
            job.done.set()
        else:
            self._queue.put(job)
        return job

    def wait_ready(self, timeout: float) -> bool:
        """Wait until a worker has started (imported torch and Triton); True if one has."""
        return self._ready.wait(timeout)

    def claim(self, jobs: list[_Job], timeout: float) -> tuple[int, int]:
        """Take back the jobs no worker has started; wait for the running ones (until
        ``timeout`` seconds in all). Returns (taken back, waited for)."""
        taken = waited = 0
        running = []
        with self._lock:
            for j in jobs:
                if j.state == QUEUED:
                    j.state = CLAIMED
                    self._pending -= 1
                    taken += 1
                elif j.state == RUNNING:
                    running.append(j)
        deadline = time.monotonic() + timeout
        for j in running:
            waited += 1
            if not j.done.wait(max(0.0, deadline - time.monotonic())):
                break
        return taken, waited

    def _serve(self, proc: subprocess.Popen) -> None:
        try:
            if not (ready := proc.stdout.readline()):
                raise EOFError("worker exited while starting")
            self._ready.set()
            while True:
                if (job := self._queue.get()) is None:
                    return
                with self._lock:
                    if job.state != QUEUED:  # taken back by its launcher
                        continue
                    job.state = RUNNING
                try:
                    proc.stdin.write(json.dumps(dict(job.payload, id=job.id)) + "\n")
                    proc.stdin.flush()
                    if not (line := proc.stdout.readline()):
                        raise EOFError("worker exited")
                    job.result = json.loads(line)
                finally:
                    with self._lock:
                        job.state = DONE
                        self._pending -= 1
                        self._last = time.monotonic()
                    job.done.set()
                r = job.result or {}
                trace.log("compile_pool_job", stage="runtime", kernel=job.payload["name"], config=job.payload["config"],
                          seconds=r.get("seconds"), launcher_s=r.get("launcher_s"), error=r.get("error"))
        except Exception as e:  # noqa: BLE001 - a dead worker: the launchers compile themselves
            with self._lock:
                self.alive -= 1
            trace.log("compile_pool_broken", stage="runtime", error=f"{type(e).__name__}: {e}")

    def close(self) -> None:
        self.closed = True
        for _ in self._procs:
            self._queue.put(None)
        for p in self._procs:
            with contextlib.suppress(OSError):
                p.stdin.close()
        for p in self._procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()
        self._procs, self.alive = [], 0


_pool: Optional[CompilePool] = None
_pool_lock = threading.Lock()


def workers() -> int:
    """Worker processes to use: ``config.autotune_compile_processes``; a negative value means all CPU cores but two (one
    for the compiling thread), at most 12; 0 turns the pool off. (8 workers of a 16-core H200 host were the bottleneck
    of a 6-layer Qwen2 training step's first call: 570 jobs, 110 worker-seconds.)"""
    n = config.autotune_compile_processes
    return max(0, n) if n >= 0 else min(12, max(1, (os.cpu_count() or 2) - 2))


#: seconds a prestarted pool waits for its first job on top of the idle timeout
PRESTART_GRACE_S = 120.0


def prestart(reason: str) -> None:
    """Start the pool now (without waiting for it), ahead of the first kernel: a worker takes seconds to import torch
    and Triton and open a CUDA context, which then overlap the capture, AOT and lowering stages instead of delaying the
    first compile jobs (about 10 s on an H200 host). The pool then waits ``PRESTART_GRACE_S`` seconds longer than
    ``config.autotune_compile_idle_s`` for its first job. Logged as ``compile_pool_prestart`` with ``reason``."""
    started = _pool is None or _pool.closed
    if (pool := get_pool()) is not None and started:
        with pool._lock:  # a long AOT stage before the first job is not idleness
            pool._last = time.monotonic() + PRESTART_GRACE_S
        trace.log("compile_pool_prestart", stage="runtime", reason=reason)


def get_pool() -> Optional[CompilePool]:
    """The process's pool, started on first use; None when turned off."""
    global _pool
    if workers() == 0:
        return None
    with _pool_lock:
        if _pool is None or _pool.closed:
            _pool = CompilePool(workers())
        return _pool if _pool.alive > 0 else None


def submit(path: str, module: str, name: str, args: list, configs: list[dict]) -> list:
    """Queue one compile job per config of kernel ``name`` (module file ``path``, to be imported as
    ``module``; ``args``: per argument, its torch dtype's name for a tensor, its value for an int). Returns
    the job handles for :func:`claim` (empty when the pool is off)."""
    if (pool := get_pool()) is None:
        return []
    env = triton_env()
    return [pool.submit(dict(path=path, module=module, name=name, args=args, config=c, env=env)) for c in configs]


def triton_env() -> dict:
    """This process's ``TRITON_*`` environment (but ``TRITON_INTERPRET``), sent with each job: Triton's
    cache key hashes settings that it reads from there (``TRITON_PTXAS_PATH``, ``TRITON_LIBDEVICE_PATH``,
    ...), and other libraries change them after the workers started (torch.compile points Triton at torch's
    own ptxas at its first compile), which made every binary compiled ahead miss this process's cache."""
    return {k: v for k, v in os.environ.items() if k.startswith("TRITON_") and k != "TRITON_INTERPRET"}


def claim(name: str, jobs: list) -> None:
    """Before compiling ``jobs``' kernel in this process: take back the jobs no worker
    has started and wait for the running ones (logged as ``compile_pool_claim``)."""
    if not jobs:
        return
    t0 = time.perf_counter()
    taken, waited = jobs[0].pool.claim(jobs, config.autotune_compile_timeout)
    failed = [j.result.get("error") for j in jobs if j.result and not j.result.get("ok")]
    trace.log("compile_pool_claim", stage="runtime", kernel=name, jobs=len(jobs), taken_back=taken, waited=waited,
              wait_s=round(time.perf_counter() - t0, 4), errors=failed[:2])
