"""The compile-worker pool (coil/runtime/compile_pool.py) on CPU: the worker protocol,
taking back queued jobs, waiting for running ones, errors reported not raised, and a
dead worker. Compiling into Triton's cache needs a GPU: tests/codegen/test_gpu.py."""
import json
import os
import subprocess
import sys
import time

import pytest

from coil.config import config, patch
from coil.runtime import compile_pool
from coil.runtime.compile_pool import CLAIMED, CompilePool

KERNEL = '''
import triton
import triton.language as tl

@triton.jit
def coil_poi_test(in_ptr0, out_ptr0, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out_ptr0 + x, tl.load(in_ptr0 + x) * 2.0)
'''


def _job(tmp_path, name="coil_poi_test"):
    path = tmp_path / "kpool.py"
    path.write_text(KERNEL)
    return dict(path=str(path), module="coil_triton_pooltest_0", name=name,
                args=["float32", "float32"], config={"XBLOCK": 128, "num_warps": 4})


def test_worker_answers_each_job_in_order(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("TRITON_INTERPRET", None)
    jobs = [dict(_job(tmp_path), id=1), dict(_job(tmp_path, name="missing"), id=2)]
    out = subprocess.run([sys.executable, "-m", "coil.runtime.compile_worker"],
                         input="".join(json.dumps(j) + "\n" for j in jobs), text=True,
                         capture_output=True, env=env, timeout=120)
    lines = [json.loads(l) for l in out.stdout.splitlines()]
    assert lines[0] == {"ready": True}
    assert [l["id"] for l in lines[1:]] == [1, 2]
    # no GPU here, so even the real kernel fails to compile; both errors are answers
    assert not lines[2]["ok"] and "AttributeError" in lines[2]["error"]
    if not lines[1]["ok"]:
        assert lines[1]["error"]


def test_pool_runs_jobs_and_reports_results(tmp_path):
    pool = CompilePool(2)
    try:
        jobs = [pool.submit(_job(tmp_path)) for _ in range(3)]
        for j in jobs:
            assert j.done.wait(120)
            assert j.result is not None and j.result["id"] == j.id
        # claiming finished jobs neither takes them back nor waits
        assert pool.claim(jobs, 1.0) == (0, 0)
    finally:
        pool.close()


def test_claim_takes_back_jobs_no_worker_started(tmp_path):
    pool = CompilePool(1)  # the worker is still importing torch: nothing has started
    try:
        jobs = [pool.submit(_job(tmp_path)) for _ in range(4)]
        taken, waited = pool.claim(jobs, 0.0)
        assert taken + waited == 4 and taken >= 3
        assert all(j.state == CLAIMED for j in jobs[1:])
        # a taken-back job is skipped by the worker: the pool still serves later jobs
        late = pool.submit(_job(tmp_path))
        assert late.done.wait(120) and late.result["id"] == late.id
        assert all(j.result is None for j in jobs[1:])
    finally:
        pool.close()


def test_dead_worker_breaks_pool_without_hanging(tmp_path):
    pool = CompilePool(1)
    try:
        first = pool.submit(_job(tmp_path))
        assert first.done.wait(120)
        pool._procs[0].kill()
        pool._procs[0].wait()
        job = pool.submit(_job(tmp_path))
        assert job.done.wait(30)  # the serving thread sees EOF and finishes the job
        deadline = time.monotonic() + 10
        while pool.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.alive == 0
        assert pool.submit(_job(tmp_path)).state == CLAIMED  # nothing left to run it
    finally:
        pool.close()


def test_workers_option():
    with patch(autotune_compile_processes=0):
        assert compile_pool.workers() == 0
        assert compile_pool.get_pool() is None
        assert compile_pool.submit("p", "m", "n", [], [{}]) == []
    with patch(autotune_compile_processes=-1):
        assert 1 <= compile_pool.workers() <= 12
    with patch(autotune_compile_processes=3):
        assert compile_pool.workers() == 3


def test_timeout_option_reads_float_from_env():
    from coil.config import _coerce
    assert _coerce("2.5", config.autotune_compile_timeout) == 2.5


def test_idle_pool_closes_and_a_new_one_starts(tmp_path):
    """Workers hold a CUDA context each on a GPU: an idle pool closes itself, and
    get_pool() starts a new one for later compiles."""
    with patch(autotune_compile_idle_s=0.5, autotune_compile_processes=1):
        pool = CompilePool(1)
        try:
            job = pool.submit(_job(tmp_path))
            assert job.done.wait(120)
            deadline = time.monotonic() + 30
            while (not pool.closed or pool.alive) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert pool.closed and pool.alive == 0
            assert pool.submit(_job(tmp_path)).state == CLAIMED  # refused once closed
        finally:
            pool.close()
        old, compile_pool._pool = compile_pool._pool, pool
        try:
            fresh = compile_pool.get_pool()
            assert fresh is not None and fresh is not pool and not fresh.closed
            fresh.close()
        finally:
            compile_pool._pool = old


def test_busy_pool_does_not_close(tmp_path):
    with patch(autotune_compile_idle_s=0.3):
        pool = CompilePool(1)  # still starting: its queued job keeps it open
        try:
            job = pool.submit(_job(tmp_path))
            time.sleep(1.0)
            assert not pool.closed or job.done.is_set()
            assert job.done.wait(120)
        finally:
            pool.close()


def test_prestart_starts_the_pool_once_and_logs_why(tmp_path):
    """A CUDA graph's compile starts the workers before its first kernel exists (they
    import torch and Triton while AOT and lowering run); off when the pool is off."""
    from coil import trace
    old = trace.trace_dir()
    trace.set_dir(str(tmp_path))
    try:
        with patch(autotune_compile_processes=0):
            compile_pool.prestart("test")
            assert compile_pool.get_pool() is None
        with patch(autotune_compile_processes=1):
            compile_pool.prestart("test")
            pool = compile_pool.get_pool()
            assert pool is not None and not pool.closed
            compile_pool.prestart("test")  # already running: nothing new
            assert compile_pool.get_pool() is pool
        with patch(autotune_compile_idle_s=0.2):
            time.sleep(1.5)  # no job yet: still waiting out the grace period
            assert not pool.closed
            pool.close()
    finally:
        trace.set_dir(old)
    records = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert [r["reason"] for r in records if r["event"] == "compile_pool_prestart"] == ["test"]
