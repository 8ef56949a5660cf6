"""Minimal repros from the tenth round of user testing: today's GPU split-reduction rule
(``_split_decision`` with ``_GPU_SPLIT_DEVICES`` patched to include "cpu"), channels-last
convolutions (``_CHANNELS_LAST_DEVICES`` patched to include "cpu", with and without
``conv_channels_last_weights``) and ``coil bench --paired``; see FINDINGS_10.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed); the plain tests are compact versions of what was
verified to match eager (values and strides). CPU only, both kernel backends ("cpp" and
"triton" through its interpreter).
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
import coil.ir.lowering as L
from coil.config import patch

from report_helpers import assert_grads_match, assert_outputs_match, backward_both, run_on_copies

BACKENDS = ["cpp", "triton"]


@pytest.fixture
def gpu_plan(monkeypatch):
    """Plan CPU graphs with the GPU split rule, for a 4-SM GPU (rows around 4 and row
    lengths around 16384 cross both thresholds with small tensors)."""
    monkeypatch.setattr(L, "_GPU_SPLIT_DEVICES", ("cuda", "cpu"))
    with patch(gpu_sm_count=4):
        yield






# -- verified to work (compact versions of what was tried; FINDINGS_10.md lists more) -----

def _nan_inf_rows(rows, n):
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(rows * n)) * 3
    x[0, 5] = float("nan")
    x[-1, 7] = float("inf")
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [3, 4, 5])      # below / at / above the SM count
@pytest.mark.parametrize("n", [16383, 16384, 32768])  # around GPU_SPLIT_MIN_RNUMEL
def test_gpu_plan_row_reductions_around_the_thresholds(gpu_plan, backend, rows, n):
    x = _nan_inf_rows(rows, n)
    y = torch.randn(rows, n, generator=torch.Generator().manual_seed(7)) * 4

    def f(a, b):
        return (a.sum(-1), a.amax(-1, keepdim=True), torch.softmax(b, -1), b.argmax(-1),
                (b + 100).var(-1), torch.logsumexp(b, -1), (b > 0).sum(-1), (b > 3).any(-1),
                F.cross_entropy(b, torch.arange(rows) * 7))
    out, ref, _, _ = run_on_copies(f, (x, y), backend)
    assert_outputs_match(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_plan_low_precision_and_strided_inputs(gpu_plan, backend):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 32768, generator=g)
    t = torch.randn(32768, 3, generator=g)

    def f(a, b):
        return (a.half().sum(-1), a.bfloat16().amax(-1), torch.softmax(a.half(), -1),
                b.t().sum(-1), torch.softmax(b.t(), -1), a[:, ::2].mean(-1),
                a.view(5, 128, 256).var((1, 2)), (a.sin() * 2).sum(-1).relu())
    out, ref, _, _ = run_on_copies(f, (x, t), backend)
    assert_outputs_match(out, ref, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weights", [True, False])
def test_channels_last_conv_variants_train(channels_last, backend, weights):
    """Grouped, depthwise, dilated, strided, 1x1 and transposed convolutions and a weight
    computed in the graph (weight * mask): outputs, strides and gradients match eager."""
    torch.manual_seed(0)
    mask = (torch.rand(8, 2, 3, 3) > 0.5).float()

    def f(x, w1, w2, w3, wt, b):
        h = F.conv2d(x, w1, b, padding=2, dilation=2, groups=4)
        h = F.conv2d(torch.relu(h), w2, stride=2, groups=8)
        h = F.conv2d(h, w3 * 1.5)
        return F.conv_transpose2d(h, wt, stride=2), F.conv2d(x, w1 * mask[:, :2], padding=1, groups=4)

    args = (torch.randn(2, 8, 12, 12, requires_grad=True),
            torch.randn(8, 2, 3, 3, requires_grad=True), torch.randn(16, 1, 3, 3, requires_grad=True),
            torch.randn(4, 16, 1, 1, requires_grad=True), torch.randn(4, 3, 2, 2, requires_grad=True),
            torch.randn(8, requires_grad=True))
    out, ref, a_out, a_ref = run_on_copies(f, args, backend, conv_channels_last=True, conv_channels_last_training=True,
                                  conv_channels_last_weights=weights)
    assert_outputs_match(out, ref, atol=1e-4, rtol=1e-4)
    backward_both(out, ref)
    assert_grads_match(a_ref, a_out, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weights", [True, False])
def test_channels_last_weight_mutated_between_calls(channels_last, backend, weights):
    torch.manual_seed(0)
    m = nn.Conv2d(8, 16, 3, padding=1).eval()
    x = torch.randn(2, 8, 12, 12)
    coil.reset()
    c = coil.compile(m, options={"cpu_backend": backend, "conv_channels_last": True, "conv_channels_last_training": True,
                                 "conv_channels_last_weights": weights})
    with torch.no_grad():
        assert_outputs_match((c(x),), (m(x),), atol=1e-4, rtol=1e-4)
        m.weight.mul_(2)
        assert_outputs_match((c(x),), (m(x),), atol=1e-4, rtol=1e-4)
        m.weight.data = torch.randn(16, 8, 3, 3).contiguous(memory_format=torch.channels_last)
        assert_outputs_match((c(x),), (m(x),), atol=1e-4, rtol=1e-4)


# -- defects ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weights", [True, False])
def test_weight_norm_conv_gradients_channels_last(channels_last, backend, weights):
    """Fixed: channels-last training with a weight-normalized convolution gave wrong
    gradients for g and v. convolution_backward's grad_weight is channels-last, and it
    was handed as it was to the extern aten._weight_norm_interface_backward, traced with
    a contiguous input (ATen's CPU kernel read it as if contiguous); extern ops outside
    the channels-last set now get their 4-D inputs in the traced strides
    (GraphLowering._traced_layout_input)."""
    torch.manual_seed(0)

    def f(x, v, g):
        return F.conv2d(x, torch._weight_norm(v, g, 0))

    args = (torch.randn(1, 2, 4, 4), torch.randn(2, 2, 3, 3, requires_grad=True),
            torch.randn(2, 1, 1, 1, requires_grad=True))
    out, ref, a_out, a_ref = run_on_copies(f, args, backend, conv_channels_last=True, conv_channels_last_training=True,
                                  conv_channels_last_weights=weights)
    assert_outputs_match(out, ref, atol=1e-5, rtol=1e-5)
    backward_both(out, ref)
    assert_grads_match(a_ref, a_out, atol=1e-5, rtol=1e-5)
