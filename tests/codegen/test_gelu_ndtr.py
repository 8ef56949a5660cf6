"""GELU lowered whole through ``ops.ndtr`` (coil/ir/lowering_activations.py).

Forward and backward, exact and tanh forms, fp32/fp64/bf16, against eager on both CPU
backends (Triton under its interpreter, and C++); the Triton ``_ndtr`` polynomial
against float64 truth in ulps; the IR's reference interpreter; and that
``gelu(x + b)`` stays one kernel.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import coil
from codegen_helpers import check, compile_fn

SPECIAL = [float("nan"), -float("inf"), -6.0, -5.55, 0.0, -0.0, 7.0, -1e-30]


def _input(dt, shape=(8, 33), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 3).to(dt)
    x.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL).to(dt)
    return x


@pytest.mark.parametrize("backend", ["triton", "cpp"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_gelu_forward_backward_matches_eager(backend, approximate, dt):
    x = _input(dt)
    f = lambda v: F.gelu(v, approximate=approximate)  # noqa: E731
    cf = coil.compile(f, options={"cpu_backend": backend})
    xr, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ref, out = f(xr), cf(xc)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, equal_nan=True)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(dt)
    ref.backward(g)
    out.backward(g)
    torch.testing.assert_close(xc.grad, xr.grad, equal_nan=True)


def test_triton_ndtr_gelu_within_a_few_ulp_of_the_true_value():
    """x·Φ(x) in fp32 on a dense grid against float64 truth: the bounds are the fit's
    (2.4 / 14 ulp with FMA) plus the interpreter's unfused multiply-adds."""
    x64 = torch.linspace(-5.5, 6.0, 20001, dtype=torch.float64)
    x = x64.float()
    out = compile_fn(lambda v: F.gelu(v), x)(x)[0].double()
    truth = x.double() * torch.special.ndtr(x.double())
    ulp = torch.from_numpy(np.spacing(truth.float().abs().numpy())).double()
    err = (out - truth).abs() / ulp
    assert err[x > 0].max() <= 6, err[x > 0].max()
    assert err[(x > -3) & (x < 0)].max() <= 40, err[(x > -3) & (x < 0)].max()
    # eager's formula, x·(1 + erf(x/√2))/2 in fp32, for scale: far worse on the left
    eager_err = (F.gelu(x).double() - truth).abs() / ulp
    assert eager_err[(x > -3) & (x < 0)].max() > err[(x > -3) & (x < 0)].max()


def test_gelu_special_values_match_eager():
    """nan -> nan, -inf -> nan (eager: -inf·0), tiny values keep their sign (zeros: the test below)."""
    x = torch.tensor(SPECIAL)
    out = compile_fn(lambda v: F.gelu(v), x)(x)[0]
    ref = F.gelu(x)
    torch.testing.assert_close(out, ref, equal_nan=True)
    keep = ~ref.isnan() & (ref != 0)
    assert torch.equal(torch.signbit(out[keep]), torch.signbit(ref[keep]))


@pytest.mark.parametrize("backend", ["triton", "cpp"])
@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_gelu_zero_results_have_eagers_sign(backend, dt):
    """A zero GELU (of -0.0, or of x below about -5.5, where it underflows) has the sign eager's kernel for a contiguous
    tensor gives it, which depends on the CPU: +0.0 from oneDNN's fp32 kernel on AVX2, -0.0 from ATen's (x·0.5·(+0.0));
    the lowering asks eager (coil gave -0.0 for fp32 on an AVX2 machine). Both forms, forward and backward."""
    x = torch.tensor([-0.0, 0.0, -100.0, -1e38, -20.0, -1e-45, 1.0, -1.0] * 2, dtype=dt)
    g = torch.tensor([1.0] * 8 + [-1.0] * 8, dtype=dt)
    for approximate in ("none", "tanh"):
        def f(v, d):
            return F.gelu(v, approximate=approximate), torch.ops.aten.gelu_backward(d, v, approximate=approximate)
        for out, ref in zip(coil.compile(f, options={"cpu_backend": backend})(x, g), f(x, g)):
            zero = ref == 0
            assert torch.equal(out[zero].signbit(), ref[zero].signbit()), (approximate, out, ref)


def test_gelu_bias_bf16_is_one_kernel():
    x, b = _input(torch.bfloat16, (16, 64)), _input(torch.bfloat16, (64,), seed=2)
    check(lambda v, c: F.gelu(v + c), x, b, kernels=1, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward_reference_interpreter(approximate):
    """aten.gelu_backward's lowering run by the IR's reference interpreter (torch ops)."""
    from coil.ir.graph import GraphLowering
    from coil.ir.reference import run_reference
    from codegen_helpers import aten_graph
    x, g = _input(torch.float32), torch.randn(8, 33, generator=torch.Generator().manual_seed(3))
    fn = lambda gr, v: torch.ops.aten.gelu_backward(gr, v, approximate=approximate)  # noqa: E731
    gl = GraphLowering(aten_graph(fn, g, x), [g, x], torch.device("cpu")).lower()
    out = run_reference(gl, [g, x])[0]
    torch.testing.assert_close(out, fn(g, x), equal_nan=True)


def test_gelu_backward_is_lowered_whole_and_accurate():
    """Core ATen decomposes ``gelu_backward`` with erf, which the C++ backend ran as libm's scalar double erf per
    element (DeBERTa's CPU training step: its largest kernel). It is kept whole, so the lowering's ndtr form runs;
    its fp32 gradient on a dense grid is as close to float64 truth as eager's."""
    from coil.aot.decompositions import get_decompositions
    assert torch.ops.aten.gelu_backward.default not in get_decompositions()
    x64 = torch.linspace(-8.0, 8.0, 40001, dtype=torch.float64)
    x = x64.float().requires_grad_(True)
    cf = coil.compile(lambda v: F.gelu(v).sum(), options={"cpu_backend": "cpp"})
    cf(x).backward()
    truth = torch.special.ndtr(x64) + x64 * torch.exp(-0.5 * x64 * x64) / (2 * np.pi) ** 0.5
    xe = x.detach().clone().requires_grad_(True)
    F.gelu(xe).sum().backward()
    err, eager_err = (x.grad.double() - truth).abs().max(), (xe.grad.double() - truth).abs().max()
    assert err <= max(2 * eager_err, 1e-6), (err, eager_err)
