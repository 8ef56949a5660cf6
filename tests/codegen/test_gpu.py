"""GPU smoke tests (skipped without CUDA): real Triton compilation, autotuning, the fast
launch path, fp16/bf16, split/looped/persistent reductions, scatter, RNG.
Run on the GPU machine: ``pytest -q tests/codegen/test_gpu.py``."""
import pytest
import torch
import torch.nn.functional as F

from codegen_helpers import aten_graph
from coil.codegen import compile_aten_graph
from coil.backends.registry import coil_backend_entry  # torch.compile(backend=...) without the entry point (GPU machine: coil on PYTHONPATH)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _check(fn, *args, atol=1e-4, rtol=1e-4, calls=3):
    gm = aten_graph(fn, *args)
    c = compile_aten_graph(gm, list(args), torch.device("cuda"))
    ref = fn(*args)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    for _ in range(calls):  # first call autotunes, later calls use the fast launcher
        out = c(*args)
        for o, e in zip(out, ref):
            torch.testing.assert_close(o, e, atol=atol, rtol=rtol)
    return c


def r(*s, dtype=torch.float32):
    return torch.randn(*s, device="cuda").to(dtype)


def _cases():
    return {
        "softmax": (lambda x: torch.softmax(x, -1), (r(512, 1000),)),
        "layer_norm_bf16": (lambda x, w, b: F.layer_norm(x, (768,), w, b),
                            (r(256, 768, dtype=torch.bfloat16), r(768, dtype=torch.bfloat16),
                             r(768, dtype=torch.bfloat16))),
        "gelu_addmm": (lambda x, w, b: F.gelu(x @ w + b), (r(64, 128), r(128, 256), r(256))),
        "sum_first_split": (lambda x: x.sum(0), (r(16384, 256),)),
        "full_sum_split": (lambda x: x.sum(), (r(1 << 20),)),
        "looped_rows": (lambda x: (x.logsumexp(-1), x.argmax(-1)), (r(64, 50257),)),
        "cross_entropy": (lambda l, t: F.cross_entropy(l, t),
                          (r(128, 32000), torch.randint(0, 32000, (128,), device="cuda"))),
        "embedding_backward": (lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, 1000, -1, False),
                               (r(8, 64, 32), torch.randint(0, 1000, (8, 64), device="cuda"))),
        "sum_first_tall": (lambda x: x.sum(0), (r(8192, 4096),)),
        "sum_first_outer_looped": (lambda x: (x.sum(0), x.amax(0)), (r(3000, 333),)),
        "rms_norm": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                     (r(1024, 4096), r(4096))),
        "cat_pad_index": (lambda x, i: (torch.cat([x, x * 2], 1), F.pad(x, (1, 2)), x[i]),
                          (r(64, 32), torch.randint(0, 64, (16,), device="cuda"))),
        # one-exp online softmax (rows > 4096, >= 4096 rows: not split), with -inf lanes
        "cross_entropy_online": (lambda l, t: F.cross_entropy(l, t, reduction="none"),
                                 (_special_rows(4096, 4099), torch.randint(0, 4099, (4096,), device="cuda"))),
        "softmax_online": (lambda x: torch.softmax(x, -1), (_special_rows(4096, 4099),)),
        "cross_entropy_bf16": (lambda l, t: F.cross_entropy(l.float(), t),
                               (r(4096, 4099, dtype=torch.bfloat16),
                                torch.randint(0, 4099, (4096,), device="cuda"))),
        # 2-byte streams: wider block candidates (16 elements per thread)
        "gelu_bias_bf16": (lambda x, b: F.gelu(x + b), (r(2048, 4096, dtype=torch.bfloat16),
                                                       r(4096, dtype=torch.bfloat16))),
        # ragged split reductions and middle-dim reductions split like leading ones
        "sum_first_odd_rows": (lambda x: x.sum(0), (r(8193, 1024),)),
        "full_sum_odd": (lambda x: x.sum(), (r(1000003),)),
        "sum_middle": (lambda x: x.sum(1), (r(16, 4096, 128),)),
        # 2-D tiled pointwise kernels (codegen/tiling.py): transposes, fp32 and bf16
        "transpose_add_tiled": (lambda x, y: (x.t() * 2).contiguous() + y,
                                (r(3000, 4099), r(4099, 3000))),
        "nchw_to_nhwc_tiled_bf16": (lambda x: x.permute(0, 2, 3, 1).contiguous() * 2,
                                    (r(8, 64, 56, 56, dtype=torch.bfloat16),)),
    }


def _special_rows(n, m):
    x = r(n, m) * 4
    x[1, :3000] = float("-inf")
    x[2, 100:200] = 60.0
    return x


NAMES = ["softmax", "layer_norm_bf16", "gelu_addmm", "sum_first_split", "full_sum_split",
         "looped_rows", "cross_entropy", "embedding_backward", "cat_pad_index",
         "sum_first_tall", "sum_first_outer_looped", "rms_norm", "cross_entropy_online",
         "softmax_online", "cross_entropy_bf16", "gelu_bias_bf16", "sum_first_odd_rows",
         "full_sum_odd", "sum_middle", "transpose_add_tiled", "nchw_to_nhwc_tiled_bf16"]


@pytest.mark.parametrize("name", NAMES)
def test_gpu_case(name):
    fn, args = _cases()[name]
    tol = 2e-2 if any(a.dtype == torch.bfloat16 for a in args) else 1e-3
    _check(fn, *args, atol=tol, rtol=tol)


def test_gpu_dropout_rng():
    x = r(1024, 1024).abs() + 1
    gm = aten_graph(lambda x: F.dropout(x, 0.1, training=True), x)
    c = compile_aten_graph(gm, [x], torch.device("cuda"))
    (y,) = c(x)
    assert abs((y != 0).float().mean().item() - 0.9) < 0.01


def test_gpu_autotune_precompiles_in_parallel(monkeypatch, tmp_path):
    """Autotuning compiles its candidates through JITFunction.warmup without errors
    (a Triton API change shows up as autotune_precompile_* events)."""
    from coil import trace
    events = []
    real_log = trace.log
    monkeypatch.setattr(trace, "log", lambda ev, **kw: (events.append((ev, kw)), real_log(ev, **kw)))
    from coil.config import patch
    x = r(4096, 1000)
    with patch(cache_dir=str(tmp_path)):  # no tuning result from an earlier run
        _check(lambda t: torch.softmax(t * 3, -1), x, atol=1e-4, rtol=1e-4)
    bad = [e for e in events if "precompile" in e[0] or e[0] == "autotune_graph_timing_unavailable"]
    assert not bad, bad
    tuned = [kw for ev, kw in events if ev == "autotune"]
    assert tuned, [e[0] for e in events]
    # CUDA-graph timing: a 4096x1000 softmax reads and writes 33 MB, so no config can
    # take under 3 µs (the 4.8 TB/s bound is 7 µs) or over 1 ms
    for t in tuned[0]["timings"]:
        assert 3e-3 < t["ms"] < 1.0, tuned[0]["timings"]


def test_gpu_time_launches_counts_each_launch_once():
    """time_launches divides by the launches it captured: a kernel's time does not
    depend on the budget (graph size) it is timed with."""
    from coil.runtime.triton_runtime import time_launches
    x = r(1 << 24)
    y = torch.empty_like(x)
    small, large = (time_launches(lambda: torch.mul(x, 2, out=y), budget_ms=b) for b in (0.5, 4.0))
    assert 0.5 < small / large < 2.0, (small, large)


def test_gpu_tiled_kernels_are_tiled():
    x, y = r(3000, 4099), r(4099, 3000)
    c = _check(lambda x, y: (x.t() * 2).contiguous() + y, x, y)
    assert [k.name.split("_")[1] for k in c.kernels] == ["til"], [k.name for k in c.kernels]


def test_gpu_channels_last_resnet_block(monkeypatch):
    """config.conv_channels_last on CUDA: values match and no extern output needs a
    layout copy (cuDNN returns what _extern_layout predicted)."""
    import coil
    from codegen_helpers import count_layout_copies
    copies = count_layout_copies(monkeypatch)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1, bias=False),
                            torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
                            torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(64, 128, 1)).cuda().eval()
    x = r(8, 64, 56, 56)
    coil.reset()
    f = coil.compile(m, options={"conv_channels_last": True, "conv_channels_last_training": True})
    with torch.no_grad():
        # (TF32 convolutions may pick other algorithms for NHWC than for NCHW)
        torch.testing.assert_close(f(x), m(x), atol=2e-2, rtol=2e-2)
    assert copies == [], copies


def test_gpu_compile_pool_fills_triton_cache(monkeypatch, tmp_path):
    """Worker processes compile a kernel's candidate configs without errors (a Triton
    API change shows up as compile_pool_job errors), and the launcher claims them."""
    from coil import trace
    from coil.config import patch
    from coil.runtime import compile_pool
    events = []
    real_log = trace.log
    monkeypatch.setattr(trace, "log", lambda ev, **kw: (events.append((ev, kw)), real_log(ev, **kw)))
    with patch(cache_dir=str(tmp_path), autotune_compile_processes=2):
        pool = compile_pool.get_pool()
        assert pool is not None and pool.wait_ready(120)
        _check(lambda t: torch.softmax(t * 5 + 1, -1), r(8192, 777))
    jobs = [kw for ev, kw in events if ev == "compile_pool_job"]
    claims = [kw for ev, kw in events if ev == "compile_pool_claim"]
    assert jobs and all(j["error"] is None for j in jobs), jobs
    assert claims and claims[0]["errors"] == [], claims
    stages = [kw.get("duration_ms") for ev, kw in events
              if ev == "stage" and kw.get("stage") == "autotune_compile"]
    print("pool jobs", [(j["config"], j["seconds"]) for j in jobs], "claims", claims, stages)


def test_gpu_batchnorm_training_step_matches_eager():
    """A conv + BatchNorm training step through coil on CUDA: the running statistics
    (copied back with one torch._foreach_copy_), the counter and the gradients (no
    zero-filled gradients for the buffers' outputs) match eager's over two steps."""
    import copy

    import coil
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.Conv2d(8, 4, 3), torch.nn.BatchNorm2d(4)).cuda().train()
    ref = copy.deepcopy(m)
    coil.reset()
    cm = coil.compile(m)
    for _ in range(2):
        x = r(4, 3, 12, 12)
        cm(x).square().mean().backward()
        ref(x).square().mean().backward()
    for (n, a), b in zip(m.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=n)
    for (n, a), b in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_gpu_gelu_ndtr_matches_eager_forward_and_backward(dtype):
    """Exact GELU through the Triton ``_ndtr`` polynomial (compiled, FMA on): values and
    the backward against eager's CUDA erf kernels, special values included."""
    import coil
    x = (torch.randn(64, 513, device="cuda") * 3).to(dtype)
    x.view(-1)[:7] = torch.tensor([float("nan"), -float("inf"), float("inf"), -6.0, -5.55,
                                   0.0, -0.0]).to(dtype)
    xr, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ref, out = F.gelu(xr), coil.compile(F.gelu)(xc)
    torch.testing.assert_close(out, ref, equal_nan=True)
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(g)
    torch.testing.assert_close(xc.grad, xr.grad, equal_nan=True)


def test_gpu_ndtr_gelu_ulp_against_float64():
    """x·Φ(x) in fp32 from the compiled kernel within the fit's bounds (2.4 ulp right of
    0, 14 ulp on (-3, 0)) of float64 truth, and closer than eager's erf form on the left."""
    import numpy as np
    x = torch.linspace(-5.5, 6.0, 1 << 20, device="cuda")
    c = compile_aten_graph(aten_graph(F.gelu, x), [x], torch.device("cuda"))
    out = c(x)[0].double().cpu()
    xd = x.double().cpu()
    truth = xd * torch.special.ndtr(xd)
    ulp = torch.from_numpy(np.spacing(truth.float().abs().numpy())).double()
    err = (out - truth).abs() / ulp
    left = (xd > -3) & (xd < 0)
    assert err[xd > 0].max() <= 4, err[xd > 0].max()
    assert err[left].max() <= 20, err[left].max()
    eager = (F.gelu(x).double().cpu() - truth).abs() / ulp
    assert eager[left].max() > err[left].max()


def test_gpu_relu_clamp_signed_zero_match_eager():
    """Eager's CUDA clamp(-0.0, min=0) and relu6 give +0.0 (max.f32), relu keeps -0.0;
    its CPU clamp keeps -0.0. coil follows the device's eager (coil/ir/lowering.py _clamp)."""
    import coil
    x = torch.tensor([-0.0, 0.0, float("nan"), -1.5, 2.5, 7.0] * 70, device="cuda")
    for f in (torch.relu, lambda t: t.clamp(min=0), F.relu6, lambda t: t.clamp(-1, 1)):
        coil.reset()
        out, ref = coil.compile(f)(x), f(x)
        torch.testing.assert_close(out, ref, equal_nan=True)
        assert torch.equal(out.signbit(), ref.signbit())


@pytest.mark.parametrize("entry", ["coil", "torch"])
def test_gpu_autotune_sliced_input_ids_gpt2(entry, tmp_path):
    """GPT-2 (2 layers, bf16) called with input ids that are a slice of a larger tensor
    (``ids[:, :128]`` of ``(8, 512)``): the fused embedding kernel indexes the ids with
    the view's strides, so autotuning's timed launches must run on copies with the same
    layout (triton_runtime.scratch_copies), not on smaller contiguous clones (an illegal
    memory access before). Through coil.compile and torch.compile(backend="coil")."""
    transformers = pytest.importorskip("transformers")
    import coil
    from coil.config import patch
    cfg = transformers.GPT2Config(n_layer=2, n_embd=768, n_head=12, n_positions=512,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    m = transformers.GPT2Model(cfg).cuda().to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")[:, :128]
    assert not ids.is_contiguous()
    coil.reset()
    with patch(cache_dir=str(tmp_path), autotune=True), torch.no_grad():
        f = coil.compile(m) if entry == "coil" else torch.compile(m, backend=coil_backend_entry)
        out = f(input_ids=ids).last_hidden_state
        torch.cuda.synchronize()
        ref = m(input_ids=ids).last_hidden_state
    torch.testing.assert_close(out.float(), ref.float(), atol=0.1, rtol=0.05)


def test_gpu_dynamic_kernels_compile_in_the_pool_ahead_of_their_first_launch(monkeypatch, tmp_path):
    """A dynamic kernel queues its first bucket's candidates to the compile pool when code
    generation creates it, with its size arguments' hint values (Triton specializes them
    as it will the first call's): every compile of the first call then loads the workers'
    binary from Triton's disk cache. (GPT-2's dynamic recompile compiled 138 candidate
    sets in the calling thread, 34.6 s on an H200.)"""
    import triton

    import coil
    from coil.config import patch
    from coil.runtime import compile_pool
    knobs = getattr(getattr(triton, "knobs", None), "compilation", None)
    if knobs is None or not hasattr(knobs, "listener"):
        pytest.skip("this Triton has no compilation listener")
    compiles, claimed = [], []
    monkeypatch.setattr(knobs, "listener", lambda **kw: compiles.append(
        (getattr(kw.get("src"), "name", None), kw.get("cache_hit"))))
    real_claim = compile_pool.claim

    def claim_after_workers(name, jobs):  # deterministic: the workers finish first
        for j in jobs:
            assert j.done.wait(300)
        claimed.extend(jobs)
        real_claim(name, jobs)
    monkeypatch.setattr(compile_pool, "claim", claim_after_workers)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))  # workers inherit it
    if compile_pool._pool is not None:
        compile_pool._pool.close()
    fn = lambda x, y: torch.softmax(x * y - 0.75, -1) * 1.25
    with patch(cache_dir=str(tmp_path), autotune_compile_processes=2):
        pool = compile_pool.get_pool()
        try:
            assert pool is not None and pool.wait_ready(120)
            coil.reset()
            f = coil.compile(fn, dynamic=True)
            x, y = r(512, 1000), r(1000)
            torch.testing.assert_close(f(x, y), fn(x, y))
        finally:
            pool.close()
    assert claimed and all(j.result and j.result["ok"] for j in claimed), [j.result for j in claimed]
    assert any(isinstance(j.payload["args"][-1], int) for j in claimed)  # a dynamic kernel's
    names = {j.payload["name"] for j in claimed}
    hits = [hit for name, hit in compiles if name in names]
    assert hits and all(hits), compiles


def test_gpu_dynamic_row_length_of_another_divisibility_in_one_bucket():
    """A dynamic kernel's direct launch must keep Triton's specialization of its size
    arguments: ``x * y + 1`` with y broadcast along rows of 256 (divisible by 16: Triton
    may load y with vectors that never cross a row) and then of 250 in the same size
    bucket, which must not reuse the 256 binary."""
    import coil
    fn = lambda x, y: x * y + 1
    coil.reset()
    f = coil.compile(fn, dynamic=True)
    for n in (256, 250, 256, 250, 1000, 1001):
        x, y = r(64, n), r(n)
        for _ in range(3):  # the first call in a bucket goes through the JIT
            torch.testing.assert_close(f(x, y), fn(x, y))


def test_cpu_group_in_a_gpu_graph_is_not_interpreted():
    """Whisper's and wav2vec2's layerdrop: ``torch.rand([]) < p`` on the CPU, in a graph
    whose tensors are on CUDA. Its kernel went to the Triton backend, which ran it in
    Triton's CPU interpreter (~10 ms a call); the random op now runs as ATen's and the
    comparison in a CPU kernel."""
    def fn(x):
        keep = torch.rand([]) < 2.0
        return x * 2, keep

    x = r(64, 64)
    gm = aten_graph(fn, x)
    c = compile_aten_graph(gm, [x], torch.device("cuda"))
    for _ in range(3):
        y, keep = c(x)
        torch.testing.assert_close(y, x * 2)
        assert keep.device.type == "cpu" and bool(keep)
    assert [k.name.split("_")[0] for k in c.kernels].count("triton") == 1, [k.name for k in c.kernels]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_gpu_kernel_reading_a_cpu_scalar(dtype):
    """DeBERTa-v2's ``x / torch.sqrt(torch.tensor(d, dtype=torch.float) * scale)``: a 0-d CPU tensor (computed in a
    CPU kernel, or a CPU input) read by a CUDA kernel. Triton refused the host pointer ("Pointer argument (at 1)
    cannot be accessed from Triton (cpu tensor?)") and the whole graph fell back to ATen ops; the wrapper now
    copies the scalar to the kernel's device."""
    from coil import config

    def fn(x, s):
        scale = torch.sqrt(torch.tensor(64, dtype=torch.float) * 3).to(x.dtype)
        return x / scale + s, (x * s).sum(-1)

    x, s = r(128, 64, dtype=dtype), torch.tensor(1.5, dtype=dtype)
    with config.patch(strict_codegen=True):   # a kernel that fails to compile raises instead of falling back
        gm = aten_graph(fn, x, s)
        c = compile_aten_graph(gm, [x, s], torch.device("cuda"))
        for v in (1.5, -2.25):
            s = torch.tensor(v, dtype=dtype)
            out, ref = c(x, s), fn(x, s)
            for o, e in zip(out, ref):
                torch.testing.assert_close(o, e, atol=1e-2, rtol=1e-2)
