"""Dynamic kernels' candidate configs compile in the compile pool ahead of their first
launch (docs/dynamic_shapes.md, "Launch"; coil/runtime/compile_pool.py): the jobs a
``DynamicTritonLauncher`` queues when code generation creates it are the ones its first
call claims (same key, module, compiled name, argument dtypes, size values and
configs), copies of one body tune once per bucket, and a tuned bucket is read back from
disk at any size in it. On CPU a "cuda" launcher is built with the pool, the GPU name
and the timing faked; tests/codegen/test_gpu.py checks that the workers' binaries are
Triton cache hits on an H200."""
import json
import os

import pytest
import torch

import coil
from coil.config import patch
from coil.runtime import compile_pool, compile_worker, triton_dynamic
from coil.runtime import triton_runtime as rt
from coil.runtime.triton_dynamic import DynamicTritonLauncher, _bucket

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def NAME(in_ptr0, out_ptr0, xnumel, s0, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out_ptr0 + x, tl.load(in_ptr0 + x % s0, x < xnumel), x < xnumel)
'''


class FakeGPU:
    """A "cuda" launcher's runtime on CPU: the pool's submit/claim and the timing are
    recorded, nothing compiles."""

    def __init__(self, monkeypatch):
        self.submitted, self.claimed, self.timed = [], [], 0
        self.ms = iter(range(100, 0, -1))  # later candidates time faster: the last one wins
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
        monkeypatch.setattr(rt, "_pool_jobs", {})
        monkeypatch.setattr(rt, "_tuned_in_process", {})
        monkeypatch.setattr(compile_pool, "submit", self._submit)
        monkeypatch.setattr(compile_pool, "claim", lambda name, jobs: self.claimed.append(jobs))
        monkeypatch.setattr(rt.TritonLauncher, "_precompile", lambda self, args: None)
        monkeypatch.setattr(rt, "time_launches", self._time)

    def _submit(self, path, module, name, args, configs):
        jobs = [object() for _ in configs]
        self.submitted.append(dict(path=path, module=module, name=name, args=args, configs=configs,
                                   jobs=jobs))
        return jobs

    def _time(self, launch):
        self.timed += 1
        return float(next(self.ms))

    def launcher(self, name="triton_poi_0_buf1", numel=12000, row=4000):
        return DynamicTritonLauncher(name, SOURCE.replace("NAME", name), numel, 1, 2, "cuda",
                                     arg_dtypes=[torch.float32, torch.bfloat16], size_hints=[numel, row])

    @staticmethod
    def first_call(la, numel=12000, row=4000):
        args = (torch.randn(row), torch.empty(numel, dtype=torch.bfloat16), numel, row)
        return la._for_bucket(_bucket(numel, 1), args)


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    with patch(cache_dir=str(tmp_path), autotune=True, autotune_min_elements=16384):
        yield FakeGPU(monkeypatch)


def test_dynamic_launcher_queues_its_hint_bucket_and_its_first_call_claims_those_jobs(gpu):
    la = gpu.launcher()
    [job] = gpu.submitted
    canonical, compiled = rt.canonical_source(SOURCE.replace("NAME", "triton_poi_0_buf1"), "triton_poi_0_buf1")
    assert (job["path"], job["module"]) == rt.module_location(canonical, False)
    assert job["name"] == compiled == la.compiled_name
    # tensors by dtype; ints by the value the first call passes (Triton specializes on it)
    assert job["args"] == ["float32", "bfloat16", 12000, 4000]
    cands = rt.launch_configs(16384, 1, False, True)
    assert job["configs"] == cands and len(cands) > 1  # it will autotune: every candidate
    gpu.launcher("triton_poi_7_buf9")  # the same body in another layer: nothing more queued
    assert len(gpu.submitted) == 1
    gpu.first_call(la)
    assert gpu.claimed == [job["jobs"]] and gpu.timed == len(cands)
    assert rt._pool_jobs[la.key] == []  # claimed once


def test_copies_of_a_body_tune_each_bucket_once(gpu):
    a, b = gpu.launcher(), gpu.launcher("triton_poi_7_buf9")
    chosen = gpu.first_call(a)
    timed = gpu.timed
    assert gpu.first_call(b, numel=15000) == chosen and gpu.timed == timed  # same bucket
    # another bucket runs the nearest tuned bucket's config (one tuning serves all sizes)
    assert gpu.first_call(b, numel=40000) == chosen and gpu.timed == timed


RED_SOURCE = SOURCE.replace("xnumel, s0, XBLOCK: tl.constexpr", "xnumel, rnumel, s0, XBLOCK: tl.constexpr, "
                            "RBLOCK: tl.constexpr")


def test_new_bucket_of_a_reduction_tunes_when_no_tuned_config_is_among_its_candidates(gpu, monkeypatch):
    """A pointwise kernel runs the nearest tuned config in any bucket (any XBLOCK suits
    it: LLaMA's L=400 timed a pointwise kernel's candidates again, 0.6 s); a reduction's
    config must be one of the bucket's candidates, else the bucket tunes."""
    la = gpu.launcher()
    chosen = gpu.first_call(la)
    timed = gpu.timed
    cands = [{"XBLOCK": 64, "num_warps": 1}, {"XBLOCK": 128, "num_warps": 1}]
    monkeypatch.setattr(triton_dynamic, "launch_configs", lambda *a, **k: [dict(c) for c in cands])
    assert chosen not in cands
    assert gpu.first_call(la, numel=140000) == chosen and gpu.timed == timed
    red = DynamicTritonLauncher("triton_red_0_buf1", RED_SOURCE.replace("NAME", "triton_red_0_buf1"), 12000,
                                16, 2, "cuda", arg_dtypes=[torch.float32, torch.bfloat16],
                                size_hints=[12000, 16, 4000])
    args = (torch.randn(4000), torch.empty(12000, dtype=torch.bfloat16), 12000, 16, 4000)
    red._tuned.append(((14, 5), {"XBLOCK": 8, "RBLOCK": 16, "num_warps": 2}))  # not a candidate
    assert red._for_bucket(_bucket(140000, 16), args[:2] + (140000, 16, 4000)) == cands[1]
    assert gpu.timed == timed + 2


def test_first_launch_of_a_class_queues_the_other_classes_binaries_and_claims_its_own(gpu, monkeypatch):
    """A dynamic kernel's binary is per Triton specialization class of its int arguments
    (``xnumel`` divisible by 16 or not): LLaMA's first length whose ``4 * L`` was not
    compiled every kernel again (2.6 s on an H200). After a class's first launch the
    classes ``other_sizes`` reach are queued to the pool; their first launch claims it."""
    la = DynamicTritonLauncher("triton_poi_0_buf1", SOURCE.replace("NAME", "triton_poi_0_buf1"), 12000, 1,
                               2, "cuda", arg_dtypes=[torch.float32, torch.bfloat16],
                               size_hints=[12000, 4000], other_sizes=[[12003, 4001], [192000, 64000]])
    monkeypatch.setattr(rt.TritonLauncher, "_launch_first", lambda self, slow, a, **kw: ("kernel", slow))
    queued = len(gpu.submitted)
    args = (torch.randn(4000), torch.empty(12000, dtype=torch.bfloat16), 12000, 4000)
    assert la(*args) == "kernel"
    cfg = la.chosen
    [job] = gpu.submitted[queued:]  # 192000 is in 12000's class: only 12003's is queued
    assert job["args"] == ["float32", "bfloat16", 12003, 4001] and job["configs"] == [cfg]
    claimed = len(gpu.claimed)
    odd = (torch.randn(4000), torch.empty(12003, dtype=torch.bfloat16), 12003, 4000)
    assert la(*odd) == "kernel"
    assert gpu.claimed[claimed] == job["jobs"]  # the binary compiled ahead is waited for
    assert len(gpu.submitted) == queued + 1


def test_tuned_bucket_is_read_from_disk_at_any_size_and_queues_only_its_config(gpu, monkeypatch):
    chosen = gpu.first_call(gpu.launcher())
    assert chosen == rt.launch_configs(16384, 1, False, True)[-1]
    # a later process: nothing tuned in memory; the tune file is per bucket, not per size
    # (it was keyed by the first call's exact sizes: every new size re-tuned)
    monkeypatch.setattr(rt, "_tuned_in_process", {})
    monkeypatch.setattr(rt, "_pool_jobs", {})
    timed = gpu.timed
    la = gpu.launcher(numel=10000)
    assert gpu.submitted[-1]["configs"] == [chosen]
    assert gpu.first_call(la, numel=9000) == chosen and gpu.timed == timed


def test_small_dynamic_kernel_queues_only_its_first_config_and_claims_it(gpu):
    with patch(autotune_min_elements=1 << 30):
        la = gpu.launcher()
        assert gpu.submitted[0]["configs"] == rt.launch_configs(16384, 1, False, True)[:1]
        # no autotuning: the first launch compiles, so the claim comes first (it never
        # came: a worker and this process compiled the same config at once)
        assert gpu.first_call(la) == gpu.submitted[0]["configs"][0]
    assert gpu.claimed == [gpu.submitted[0]["jobs"]] and gpu.timed == 0


def test_worker_passes_dtype_names_as_dtypes_and_ints_as_values(tmp_path):
    path = tmp_path / "kfake.py"
    path.write_text("CALLS = []\n\n\nclass K:\n    def warmup(self, *args, grid, **cfg):\n"
                    "        CALLS.append((args, grid, cfg))\n\n\nk = K()\n")
    modules = {}
    job = dict(id=3, path=str(path), module="coil_fake_worker_module", name="k",
               args=["float32", "bfloat16", 12000, 1], config={"XBLOCK": 1024, "num_warps": 4})
    assert compile_worker.run_job(json.loads(json.dumps(job)), modules)["ok"]
    [(args, grid, cfg)] = modules[str(path)].CALLS
    assert args == (torch.float32, torch.bfloat16, 12000, 1) and grid == (1,)
    assert cfg == {"XBLOCK": 1024, "num_warps": 4}


def test_codegen_size_hints_are_the_first_calls_int_arguments(monkeypatch):
    """The hints a dynamic launcher queues pool jobs with are the values (and the tensor
    dtypes the dtypes) the wrapper's first call passes, so the workers compile the
    binary of that call's Triton specialization."""
    made = []

    class Spy(DynamicTritonLauncher):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.hints, self.first = (kw["arg_dtypes"], kw["size_hints"]), None
            made.append(self)

        def __call__(self, *args):
            if self.first is None:
                self.first = args
            return super().__call__(*args)

    monkeypatch.setattr(triton_dynamic, "DynamicTritonLauncher", Spy)
    coil.reset()
    with patch(cpu_backend="triton"):
        f = coil.compile(lambda x, y: torch.softmax(x * y, -1) + 1, dynamic=True)
        x, y = torch.randn(6, 48, dtype=torch.float64), torch.randn(48)
        torch.testing.assert_close(f(x, y), torch.softmax(x * y, -1) + 1)
    assert made and all(k.first is not None for k in made)
    for k in made:
        dtypes, sizes = k.hints
        assert [a.dtype for a in k.first if isinstance(a, torch.Tensor)] == dtypes
        assert [a for a in k.first if isinstance(a, int)] == sizes and len(sizes) >= 2
    try:  # and Triton specializes the job's arguments (dtypes as its MockTensors) the same
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
        from triton.runtime.jit import MockTensor
    except ImportError:
        return
    for k in made:
        job = [MockTensor.wrap_dtype(d) for d in k.hints[0]] + k.hints[1]
        specs = [[native_specialize_impl(BaseBackend, a, False, True, True) for a in args]
                 for args in (job, k.first)]
        assert specs[0] == specs[1]


def test_static_copy_created_before_its_body_was_tuned_takes_the_result(gpu, monkeypatch):
    """Code generation creates every layer's launcher before the first call tunes any:
    each copy of a body used to time the candidates again at its own first call."""
    src = SOURCE.replace("NAME", "triton_poi_1_buf2")
    a, b = (rt.TritonLauncher(n, src.replace("triton_poi_1_buf2", n), 40000, 1, False, "cuda",
                              arg_dtypes=[torch.float32, torch.bfloat16])
            for n in ("triton_poi_1_buf2", "triton_poi_4_buf8"))
    assert len(gpu.submitted) == 1 and a.chosen is None and b.chosen is None
    monkeypatch.setattr(rt.TritonLauncher, "_choose", lambda self, cfg: (
        setattr(self, "chosen", cfg), setattr(self, "_call", lambda *args: None)))
    args = (torch.randn(4000), torch.empty(40000, dtype=torch.bfloat16), 40000, 4000)
    a._autotune(args)
    timed = gpu.timed
    b(*args)
    assert b.chosen == a.chosen and gpu.timed == timed


def test_copies_of_a_body_with_headers_naming_their_buffers_share_one_compiled_source():
    """Kernel headers name the fused nodes (``# pointwise ... nodes=['buf13']``): the
    same body in twelve layers was twelve modules, compiles and tunings (after one name, still
    twelve modules and tunings: the key hashed the header)."""
    src = [f"# pointwise numel=512*s14 nodes=['buf{b}']\n" + SOURCE.replace("NAME", f"triton_poi_{i}_buf{b}")
           for i, b in ((4, 13), (10, 28))]
    a, b = (rt.canonical_source(s, f"triton_poi_{i}_buf{n}")
            for s, (i, n) in zip(src, ((4, 13), (10, 28))))
    assert a == b  # one module, launcher key, pool job and tuning (the source too, not only the name)
    other = rt.canonical_source(src[0].replace("x % s0", "x // s0"), "triton_poi_4_buf13")
    assert other[1] != a[1]


def test_worker_compiles_under_the_parents_triton_env_at_submit_time(tmp_path, monkeypatch):
    """torch.compile sets TRITON_PTXAS_PATH in the parent after the workers started; Triton
    hashes it into the cache key, so a worker compiling without it filled keys the parent
    never reads (11 in-process compiles, 1.4 s, at LLaMA's first odd length on an H200)."""
    path = tmp_path / "kenv.py"
    path.write_text("import os\nSEEN = []\n\n\nclass K:\n    def warmup(self, *args, grid, **cfg):\n"
                    "        SEEN.append({k: v for k, v in os.environ.items() if k.startswith('TRITON_')})\n\n\n"
                    "k = K()\n")
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/opt/torch/bin/ptxas")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    env = compile_pool.triton_env()
    assert env == {k: v for k, v in os.environ.items() if k.startswith("TRITON_") and k != "TRITON_INTERPRET"}
    assert env["TRITON_PTXAS_PATH"] == "/opt/torch/bin/ptxas" and "TRITON_INTERPRET" not in env
    # the worker's own environment: a stale variable the parent no longer has, no ptxas path
    monkeypatch.delenv("TRITON_PTXAS_PATH")
    monkeypatch.setenv("TRITON_STALE_SETTING", "1")
    modules = {}
    job = dict(id=1, path=str(path), module="coil_fake_env_module", name="k", args=[], config={}, env=env)
    assert compile_worker.run_job(job, modules)["ok"]
    [seen] = modules[str(path)].SEEN
    assert seen["TRITON_PTXAS_PATH"] == "/opt/torch/bin/ptxas" and "TRITON_STALE_SETTING" not in seen
    assert seen["TRITON_INTERPRET"] == "1"  # the worker's own, kept
