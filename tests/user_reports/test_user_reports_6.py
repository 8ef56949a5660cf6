"""Minimal repros from the sixth round of user testing: 2-D tiled Triton transposes
(codegen/tiling.py), channels-last convolutions (``conv_channels_last``, inference and
training), leading split reductions (ir/lowering.py ``_split_factor``) and FloorDiv/Mod
index simplification (ir/symbols.py); see FINDINGS_6.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed); the plain tests are compact versions of patterns
verified to work. CPU only, both kernel backends ("cpp" and "triton" through its
interpreter).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
import coil.ir.graph as G
from report_helpers import (assert_grads_match, assert_outputs_match, backward_both,
                            run_both)

BACKENDS = ["cpp", "triton"]


def _check(fn, args, backend, *, grads=False, atol=1e-4, rtol=1e-4, options=None):
    """Eager vs compiled on copies of ``args``: values, dtype, shape, strides (of every
    non-size-1 dim) and, with ``grads``, the gradients of the floating-point arguments
    (same random cotangents) and their strides."""
    def copies():
        return [a.detach().clone().requires_grad_(grads and a.is_floating_point()) for a in args]

    a_ref, a_out = copies(), copies()
    outs, refs = run_both(fn, a_ref, a_out, backend, options)
    assert_outputs_match(outs, refs, atol, rtol)
    if grads:
        backward_both(outs, refs)
        assert_grads_match(a_ref, a_out, atol * 10, rtol * 10)
    return outs


# -- verified to work (compact versions of what was tried; FINDINGS_6.md lists more) ------

@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_transposes_mixed(backend):
    """odd-size transposes, a 3-D permute plus a contiguous operand, a sliced input with a
    storage offset, an int transpose, a transpose feeding a reduction"""
    torch.manual_seed(0)

    def f(a, b, c, d, i):
        return (a.t().contiguous(), b.permute(0, 2, 1) + c, d.t() * 2, i.t() // 3,
                (a.t() * 2).sum(0))
    base = torch.randn(40, 150)
    _check(f, [torch.randn(33, 127), torch.randn(2, 17, 33), torch.randn(2, 33, 17),
               base[3:36, 5:132], torch.randint(-50, 50, (17, 9))], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cl_conv_function_outputs_views_grads(backend, monkeypatch):
    """channels-last on CPU: a conv output returned, viewed, sliced and permuted; grads"""
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)

    def f(x, w):
        y = F.conv2d(x, w, padding=1, stride=(2, 1), dilation=(1, 2))
        return y, y.flatten(1) * 2, y[:, 1:3].sigmoid(), y.permute(0, 2, 3, 1).relu()
    _check(f, [torch.randn(2, 3, 7, 9), torch.randn(4, 3, 3, 3)], backend, grads=True,
           options={"conv_channels_last": True, "conv_channels_last_training": True})


@pytest.mark.parametrize("backend", BACKENDS)
def test_cl_training_grouped_bn_running_stats(backend, monkeypatch):
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(4, 6, 3, 2, 1, groups=2), nn.BatchNorm2d(6), nn.ReLU()).train()
    m2 = copy.deepcopy(m)
    coil.reset()
    f = coil.compile(m2, options={"cpu_backend": backend, "conv_channels_last": True, "conv_channels_last_training": True})
    x = torch.randn(2, 4, 9, 7)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    r, o = m(xa), f(xb)
    torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
    assert o.stride() == r.stride()
    g = torch.randn_like(r)
    r.backward(g)
    o.backward(g)
    torch.testing.assert_close(xb.grad, xa.grad, atol=1e-3, rtol=1e-3)
    for (n, p), (_, p2) in zip(m.named_parameters(), m2.named_parameters()):
        torch.testing.assert_close(p2.grad, p.grad, atol=1e-3, rtol=1e-3, msg=lambda s: f"{n}: {s}")
        assert p2.grad.stride() == p.grad.stride(), n
    for (n, b), (_, b2) in zip(m.named_buffers(), m2.named_buffers()):
        torch.testing.assert_close(b2, b, atol=1e-5, rtol=1e-4, msg=lambda s: f"{n}: {s}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_leading_split_reductions_odd_shapes(backend):
    """(65536, 7) and (4097, 513): sum/var/amax/argmax over dim 0, an epilogue, bf16"""
    torch.manual_seed(0)
    _check(lambda x: (x.sum(0), x.var(0), x.amax(0), x.argmax(0), (x.mean(0) * 2).sigmoid()),
           [torch.randn(65536, 7) * 2 + 1], backend, atol=1e-3)
    _check(lambda x: (x.sum(0), x.float().sum(0)), [torch.randn(4097, 513).bfloat16()], backend,
           atol=1e-1, rtol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_chains_floordiv_mod(backend):
    def f(x, y):
        return (x.permute(1, 2, 0).reshape(-1, 6) + 1, x.reshape(-1)[::3] * 2,
                x.flatten().as_strided((5, 4), (2, 1), 3) * 3, x.transpose(0, 2).flatten(1).exp(),
                F.pixel_shuffle(y, 2) - 1, x[:1].expand(3, 6, 4).reshape(9, 8).flip(0) * 2)
    _check(f, [torch.randn(3, 6, 4), torch.randn(1, 8, 3, 5)], backend, grads=True)


# -- failures ------------------------------------------------------------------------------

# fixed: codegen/triton/kernel.py reduction() matched lanes by value == max, and NaN != NaN
@pytest.mark.parametrize("op", ["argmax", "argmin", "max_indices"])
@pytest.mark.parametrize("cols", [2, 3000])  # persistent and looped reductions
def test_triton_argmax_with_nan(op, cols):
    torch.manual_seed(0)
    x = torch.randn(3, cols)
    x[0, 0] = x[1, cols // 2] = x[1, cols - 1] = float("nan")
    f = {"argmax": lambda x: x.argmax(1), "argmin": lambda x: x.argmin(1),
         "max_indices": lambda x: x.max(1).indices}[op]
    _check(f, [x], "triton")


def test_cpp_full_sum_of_last_dim_flip():
    torch.manual_seed(0)
    _check(lambda x: x.flip(-1).sum(), [torch.randn(17, 2)], "cpp")


# fixed: codegen/triton/kernel.py to_dtype() now casts through tl.float32 (as eager does)
@pytest.mark.parametrize("dst", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("src", [torch.bool, torch.int32, torch.float64])
def test_triton_cast_to_bf16_from_non_fp32(src, dst):
    torch.manual_seed(0)
    x = torch.randn(4) * 10
    x = x > 0 if src == torch.bool else x.to(src)
    _check(lambda x: x.to(dst), [x], "triton")
