"""Reductions whose loads are contiguous along a kept dim (channels-last ``x.mean((2, 3))``, ``instance_norm``, a pool
followed by ``instance_norm``, ``x.sum(0)``) run on the C++ backend in the outer-reduction form
(``CppKernel._reduction_x_lanes``): blocks of consecutive x, r outside, an ``omp simd`` loop over the block's lanes
inside (FINDINGS_68 item 4: channels-last reductions were 2.5-6x slower than eager). Values against eager for odd
channel counts, H*W of 1 and 49, float64 and bfloat16, keepdim and other dim sets; and the loop structure."""
import re

import pytest
import torch
import torch.nn.functional as F

from codegen_helpers import compile_fn

FNS = {
    "mean23": lambda x: x.mean((2, 3)),
    "sum23_keepdim": lambda x: x.sum((2, 3), keepdim=True),
    "amax23": lambda x: x.amax((2, 3)),
    "var23": lambda x: x.var((2, 3)),
    "instance_norm": lambda x: F.instance_norm(x),
    "adaptive_avg_pool": lambda x: F.adaptive_avg_pool2d(x, 1),
    "centered": lambda x: x - x.mean((2, 3), keepdim=True),
    "bn_stats": lambda x: x.sum((0, 2, 3)),
    "sum2": lambda x: x.sum(2),
    "softmax_hw": lambda x: x.flatten(2).softmax(-1),
}


def _cl(n, c, h, w, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, h, w, generator=g).to(dtype).to(memory_format=torch.channels_last)


def _check(fn, x, tol):
    outs, refs = compile_fn(fn, x, backend="cpp")(x), fn(x)
    for out, ref in zip(outs, refs if isinstance(refs, tuple) else (refs,)):
        assert (out.dtype, out.shape) == (ref.dtype, ref.shape)
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("c,hw", [(3, 7), (7, 7), (8, 1), (64, 7), (65, 7), (16, 1)])
@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_channels_last_reductions_match_eager(name, c, hw):
    if name == "instance_norm" and hw == 1:
        pytest.skip("eager raises: instance_norm needs more than one spatial element")
    _check(FNS[name], _cl(2, c, hw, hw), 1e-4)


@pytest.mark.parametrize("name", ["mean23", "sum23_keepdim", "instance_norm", "var23", "amax23"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-9), (torch.bfloat16, 2e-2)])
def test_channels_last_reductions_other_dtypes(name, dtype, tol):
    _check(FNS[name], _cl(2, 24, 7, 7, dtype), tol)


def test_pool_then_instance_norm_and_long_columns():
    x = _cl(2, 32, 14, 14)
    _check(lambda t: F.instance_norm(F.avg_pool2d(t, 2)), x, 1e-4)
    g = torch.randn(5000, 48, generator=torch.Generator().manual_seed(1))   # Kahan-blocked lanes over long columns
    _check(lambda t: (t.sum(0), t.var(0), t.softmax(0)), g, 1e-4)


def _kernels(fn, x):
    return [k.source for k in compile_fn(fn, x, backend="cpp").kernels]


def test_outer_reduction_loop_structure():
    """Channels-last mean: r outside, the innermost loop an ``omp simd`` over 32-64 lanes of consecutive channels
    (``x0 = x0b + l``: no division per element); NCHW keeps the lanes along r."""
    (src,) = _kernels(FNS["mean23"], _cl(2, 64, 7, 7))
    m = re.search(r"for \(int64_t r0 = rb0; r0 < re0; \+\+r0\) \{\s*#pragma omp simd\s*"
                  r"for \(int64_t l = 0; l < (32|64); \+\+l\) \{\s*int64_t x0 = x0b \+ l;", src)
    assert m, src
    inner = src[m.end():src.index("}", m.end())]
    assert "/" not in inner and "%" not in inner, inner
    (nchw,) = _kernels(FNS["mean23"], torch.randn(2, 64, 7, 7))
    assert "_xl[" not in nchw and "_lane[" in nchw


def test_instance_norm_channels_last_is_one_lane_blocked_kernel():
    """Both statistics and the NCHW store in one kernel; the store loop is a tile with r innermost."""
    (src,) = _kernels(FNS["instance_norm"], _cl(2, 64, 7, 7))
    assert len(re.findall(r"double acc\d+_xl\[(32|64)\]", src)) == 2, src
    assert re.search(r"for \(int64_t l = 0; l < (32|64); \+\+l\) \{\s*int64_t x0 = x0b \+ l;\s*"
                     r"for \(int64_t r0 = rb0; r0 < re0; \+\+r0\)", src), src


def test_floordiv_drops_a_common_factor():
    """``(g*y) // (g*c) -> y // c``: the first element of each channels-last row (instance_norm's shift, read through a
    ``(1, N*C, H, W)`` view) indexes as ``x // (H*W*C)``, so the normalization kernel splits its loop (no division per
    element) and hoists the row's statistics (channels-last instance_norm of (8, 64, 56, 56): 9.1 -> 2.9 ms)."""
    from coil.ir.symbols import XINDEX, FloorDiv, simplify_index
    assert simplify_index(FloorDiv(3136 * FloorDiv(XINDEX, 3136), 200704), {XINDEX: 1605632}) == FloorDiv(XINDEX, 200704)
    assert FloorDiv(6 * XINDEX + 3, 4).args == (6 * XINDEX + 3, 4)   # no common factor: unchanged
    cases = [(FloorDiv(6 * XINDEX + 4, 4), lambda v: (6 * v + 4) // 4), (FloorDiv(12 * XINDEX + 8, 6), lambda v: (12 * v + 8) // 6),
             (FloorDiv(3136 * XINDEX, 200704), lambda v: 3136 * v // 200704)]
    for e, ref in cases:
        assert all(int(e.subs(XINDEX, v)) == ref(v) for v in range(0, 1000, 7)), e


def test_a_broadcast_gate_is_computed_once_on_the_cpu():
    """A squeeze-excitation block's ``x * sigmoid(gate)`` with a (N, C, 1, 1) gate computed the sigmoid once per
    element of x (1.5x eager's time on the C++ backend, FINDINGS_68 item 4); a transcendental value that every reader
    broadcasts to 16x its elements or more is now realized first, and the wide kernel only multiplies."""
    def f(x, g):
        return x * torch.sigmoid(g)

    x, g = torch.randn(2, 8, 7, 7).to(memory_format=torch.channels_last), torch.randn(2, 8, 1, 1)
    c = compile_fn(f, x, g, backend="cpp")
    assert "buf0 = empty_strided((2, 8, 1, 1)" in c.source, c.source
    torch.testing.assert_close(c(x, g)[0], f(x, g))
    c = compile_fn(lambda x, g: x * torch.sigmoid(g), x, torch.randn(2, 8, 7, 1), backend="cpp")  # 7x: fused
    assert "empty_strided((2, 8, 7, 1)" not in c.source, c.source
