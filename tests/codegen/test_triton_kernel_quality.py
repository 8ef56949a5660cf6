"""Triton kernel-quality rewrites (fewer instructions or passes per element) keep
results equal to eager: run under the Triton interpreter on CPU tensors."""
import pytest
import torch
import torch.nn.functional as F

from codegen_helpers import check


def _rows(special):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4099, generator=g) * 5   # odd length: not split, looped
    x[1, :3000] = float("-inf")               # running max starts at -inf
    x[2] = float("-inf")                      # all -inf
    x[3, 100:200] = 60.0                      # max rises mid-row
    x[4, ::3] = -1e30                         # huge finite negatives
    if special == "nan":
        x[5, 4000] = float("nan")
    if special == "posinf":
        x[6, 10] = float("inf")
    return x


@pytest.mark.parametrize("special", ["plain", "nan", "posinf"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "cross_entropy"])
def test_online_softmax_one_exp_update(op, special):
    """The online sum-of-exp update uses one exp per element
    (``exp(-|x - m_prev|)``); rows with -inf, NaN, +inf and rising maxima match eager."""
    x = _rows(special)
    t = torch.randint(0, 4099, (8,), generator=torch.Generator().manual_seed(2))
    fns = {"softmax": lambda a, b: torch.softmax(a, -1),
           "log_softmax": lambda a, b: torch.log_softmax(a, -1),
           "cross_entropy": lambda a, b: F.cross_entropy(a, b, reduction="none")}
    c = check(fns[op], x, t, atol=1e-5, rtol=1e-5)
    src = c.kernels[0].source
    assert "_e = tl.exp(-tl.abs(" in src, src
    first_loop = src.split("for roffset")[1].split("_res = ")[0]
    assert first_loop.count("tl.exp(") == 1, first_loop


def _per_thread(cfg):
    return cfg["XBLOCK"] * cfg.get("RBLOCK", 1) // (32 * cfg["num_warps"])


def test_bf16_streams_get_wider_blocks():
    """GPU candidates for kernels streaming only 2-byte data hold twice the elements per
    thread of fp32 kernels in their first guess (the same bytes per thread)."""
    from coil.runtime.triton_runtime import candidate_configs
    n = 32768 * 4096
    f32 = candidate_configs(n, 1, False, gpu=True, elem_bytes=4)
    bf16 = candidate_configs(n, 1, False, gpu=True, elem_bytes=2)
    assert _per_thread(f32[0]) == 8 and _per_thread(bf16[0]) == 16, (f32, bf16)
    assert len(bf16) <= 3 and dict(XBLOCK=1024, num_warps=4) in bf16   # old best stays
    red32 = candidate_configs(8192, 32000, False, gpu=True, elem_bytes=4)
    red16 = candidate_configs(8192, 32000, False, gpu=True, elem_bytes=2)
    # looped reductions: one row per program and 16 warps first (H200 sweep, session 6),
    # 2-byte rows with twice the elements per thread
    assert _per_thread(red32[0]) == 4 and _per_thread(red16[0]) == 8 and len(red16) <= 4
    per16 = candidate_configs(32768, 4096, True, gpu=True, elem_bytes=2)
    assert _per_thread(per16[0]) == 16 and len(per16) <= 4
    # CPU (interpreter): one config whatever the dtype
    assert candidate_configs(n, 1, False, gpu=False, elem_bytes=2) == \
        candidate_configs(n, 1, False, gpu=False, elem_bytes=4)


def test_stream_elem_bytes_and_bf16_store():
    """The backend reports 2-byte streams for bf16 gelu(x + b) and 4 for fp32; the bf16
    store writes the rounding itself, not a round trip through fp32."""
    x, b = torch.randn(64, 256), torch.randn(256)
    fn = lambda a, c: F.gelu(a + c)
    c16 = check(fn, x.bfloat16(), b.bfloat16(), kernels=1, atol=1e-2, rtol=1e-2)
    c32 = check(fn, x, b, kernels=1)
    assert c16.kernels[0].launcher.elem_bytes == 2
    assert c32.kernels[0].launcher.elem_bytes == 4
    src = c16.kernels[0].source
    store = [l for l in src.splitlines() if "tl.store(" in l][0]
    assert ".to(tl.float32).to(tl.bfloat16)" not in store and "to(tl.bfloat16)" in store, src


def test_interpreter_bf16_cast_rounds_to_nearest_even():
    """fp32 -> bf16 under the Triton interpreter rounds like the GPU (and eager); the
    interpreter alone truncates (conformance op ``bfloat16``: -8.4784 -> -8.4375)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4096, generator=g) * 10
    x[:3] = torch.tensor([-8.4784, float("nan"), float("-inf")])
    c = check(lambda a: (a * 3).bfloat16(), x, atol=0, rtol=0)
    out = c(x)[0]
    assert torch.equal(out.float().nan_to_num(), (x * 3).bfloat16().float().nan_to_num())


def test_tune_cache_key_includes_candidate_set():
    """A stored autotune winner is only reused for the same candidate set: changing
    candidate_configs (e.g. wider bf16 blocks) re-tunes unchanged kernel sources."""
    from coil.runtime.triton_runtime import TritonLauncher
    la = TritonLauncher.__new__(TritonLauncher)
    la.gpu, la.key = False, "abc"
    la.configs = [dict(XBLOCK=1024, num_warps=4)]
    p1 = la._tune_path()
    la.configs = [dict(XBLOCK=2048, num_warps=4), dict(XBLOCK=1024, num_warps=4)]
    assert la._tune_path() != p1 and "kabc." in p1


def test_persistent_reductions_on_few_programs_get_more_warps():
    """A persistent reduction whose grid cannot fill the GPU (a loss's final mean over
    256 rows: one program) gets 2 elements per thread, not 8: it is latency-bound and is
    below autotune_min_elements, so its first candidate is what runs."""
    from coil.runtime.triton_runtime import FEW_PROGRAMS, candidate_configs
    tiny = candidate_configs(1, 256, True, gpu=True)
    assert _per_thread(tiny[0]) == 2, tiny
    many = candidate_configs(FEW_PROGRAMS * 4, 1024, True, gpu=True)
    assert _per_thread(many[0]) == 8, many  # grids that fill the GPU keep 8
