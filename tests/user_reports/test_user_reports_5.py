"""Minimal repros from the fifth round of user testing: channels-last training
(``conv_channels_last`` with saved activations NHWC, aot ``_saved_layouts``), exact fake
strides for outputs with size-1 dims (ir/graph.py ``_output_spec``), FloorDiv pulling
exact multiples out of sums (ir/symbols.py), more aggressive leading split reductions
(ir/lowering.py ``_split_factor``) and multi-reader values realized in eager's layout
(ir/graph.py ``_maybe_realize``); see FINDINGS_5.md.

Each test is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed) or a plain test for a pattern verified to work.
CPU only, both kernel backends ("cpp" and "triton" through its interpreter).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
from report_helpers import assert_grads_match, assert_outputs_match, backward_both, run_both, strides_agree
import coil.ir.graph as G

BACKENDS = ["cpp", "triton"]


def _check(fn, args, backend, *, grads=False, atol=1e-4, rtol=1e-4, exact_strides=False):
    """Eager vs compiled on copies of ``args``: values, dtype, shape, strides (of every
    non-size-1 dim, or all of them with ``exact_strides``) and, with ``grads``, the
    gradients of the floating-point arguments (same random cotangents) and their strides."""
    def copies():
        return [a.detach().clone().requires_grad_(grads and a.is_floating_point()) for a in args]

    def same(a, b):
        if exact_strides:
            return a.stride() == b.stride()
        return strides_agree(a, b)

    a_ref, a_out = copies(), copies()
    outs, refs = run_both(fn, a_ref, a_out, backend)
    assert_outputs_match(outs, refs, atol, rtol, same)
    if grads:
        backward_both(outs, refs)
        assert_grads_match(a_ref, a_out, atol * 10, rtol * 10, same)
    return outs


def _train(make, xshape, backend, monkeypatch, *, steps=3, input_grad=True, cl_input=False,
           atol=1e-4, rtol=1e-4, outputs=True):
    """``steps`` SGD(momentum) steps of an eager model and a channels-last compiled copy
    (CPU allowed): outputs and their strides, parameter and input gradients with their
    strides, buffers (BatchNorm running stats) after every step; zero_grad in between."""
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    m = make().train()
    m2 = copy.deepcopy(m)
    coil.reset()
    f = coil.compile(m2, options={"cpu_backend": backend, "conv_channels_last": True, "conv_channels_last_training": True})
    o1 = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9)
    fmt = torch.channels_last if cl_input else torch.contiguous_format
    for step in range(steps):
        x = torch.randn(*xshape)
        xa = x.clone(memory_format=fmt).requires_grad_(input_grad)
        xb = x.clone(memory_format=fmt).requires_grad_(input_grad)
        o1.zero_grad()
        o2.zero_grad()
        r, o = m(xa), f(xb)
        rs = r if isinstance(r, (tuple, list)) else (r,)
        os_ = o if isinstance(o, (tuple, list)) else (o,)
        for i, (a, b) in enumerate(zip(os_, rs)):
            assert a.shape == b.shape and a.dtype == b.dtype, (step, i)
            if outputs:
                torch.testing.assert_close(a, b, atol=atol, rtol=rtol,
                                           msg=lambda s: f"step {step} output {i}: {s}")
            assert all(p == q for p, q, n in zip(a.stride(), b.stride(), b.shape) if n != 1), \
                (step, i, a.stride(), b.stride())
        torch.manual_seed(100 + step)
        cots = [torch.randn_like(t) for t in rs]
        torch.autograd.backward(list(rs), cots)
        torch.autograd.backward(list(os_), cots)
        if outputs:
            if input_grad:
                torch.testing.assert_close(xb.grad, xa.grad, atol=atol * 10, rtol=rtol * 10)
                assert xb.grad.stride() == xa.grad.stride(), (step, xb.grad.stride(), xa.grad.stride())
            for (n, p), (_, p2) in zip(m.named_parameters(), m2.named_parameters()):
                if p.grad is None:
                    assert p2.grad is None, n
                    continue
                torch.testing.assert_close(p2.grad, p.grad, atol=atol * 10, rtol=rtol * 10,
                                           msg=lambda s: f"step {step} grad {n}: {s}")
                assert p2.grad.stride() == p.grad.stride(), (step, n)
        for (n, b), (_, b2) in zip(m.named_buffers(), m2.named_buffers()):
            if not outputs and step > 0:
                break  # (the parameters differ after a step on dropout gradients)
            torch.testing.assert_close(b2, b, atol=1e-5, rtol=1e-4, msg=lambda s: f"step {step} {n}: {s}")
        o1.step()
        o2.step()


# -- channels-last training: verified to work ---------------------------------------------

class _Res(nn.Module):
    """stem (conv+bias, BN, ReLU, maxpool), a downsampling residual block, adaptive pool,
    flatten, linear"""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))
        self.c1, self.b1 = nn.Conv2d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16)
        self.down = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = self.stem(x)
        h = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        h = F.relu(h + self.down(x))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cl_training_resnet_input_grad(backend, monkeypatch):
    _train(_Res, (2, 3, 16, 16), backend, monkeypatch)


def test_cl_training_channels_last_model_and_input(monkeypatch):
    """model.to(channels_last) and a channels-last input: parameter gradients keep the
    parameters' NHWC strides, the input gradient the input's."""
    _train(lambda: _Res().to(memory_format=torch.channels_last), (2, 3, 16, 16), "cpp",
           monkeypatch, cl_input=True, steps=2)


class _Depthwise(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=2)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.pw = nn.Conv2d(8, 12, 1)

    def forward(self, x):
        h = F.relu6(self.bn(self.dw(F.relu(self.c1(x)))))
        return F.avg_pool2d(self.pw(h), 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cl_training_groups_dilation_depthwise(backend, monkeypatch):
    _train(_Depthwise, (2, 4, 12, 12), backend, monkeypatch, steps=2)


class _UpCat(nn.Module):
    """stride-2 conv, transposed conv with output_padding/groups, nearest and bilinear
    upsampling, channel concat, a chunk (GLU) of a conv output"""

    def __init__(self):
        super().__init__()
        self.c, self.bn = nn.Conv2d(4, 8, 3, 2, 1), nn.BatchNorm2d(8)
        self.t = nn.ConvTranspose2d(8, 4, 3, 2, 1, output_padding=1, groups=2)
        self.c2 = nn.Conv2d(8, 6, 3, padding=1)

    def forward(self, x):
        h = F.relu(self.bn(self.c(x)))
        u = torch.cat([self.t(h), F.interpolate(h, scale_factor=2)[:, :4]], 1)
        a, b = self.c2(u).chunk(2, 1)
        return a * b.sigmoid(), F.interpolate(h, size=(7, 5), mode="bilinear")


@pytest.mark.parametrize("backend", BACKENDS)
def test_cl_training_transposed_upsample_concat(backend, monkeypatch):
    _train(_UpCat, (2, 4, 10, 10), backend, monkeypatch, steps=2)


class _Pools(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.c2 = nn.Conv2d(3, 6, 3), nn.Conv2d(6, 6, 1)

    def forward(self, x):
        h = self.c(x)
        p, idx = F.max_pool2d(h, 2, 2, return_indices=True)
        return (self.c2(F.max_pool2d(h, 3, 2, ceil_mode=True)).sum((2, 3)),
                F.avg_pool2d(h, 3, 2, padding=1, count_include_pad=False),
                F.adaptive_avg_pool2d(h, (3, 2)), F.adaptive_max_pool2d(h, 2),
                F.max_unpool2d(p * 2, idx, 2, 2, output_size=h.shape[-2:]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cl_training_pools(backend, monkeypatch):
    _train(_Pools, (2, 3, 13, 11), backend, monkeypatch, steps=2)


class _PartialWithBreak(nn.Module):
    """linear -> view as an image -> conv/BN -> graph break (print) -> conv on a slice,
    outputs a permuted activation; the 1x1-spatial conv output is a user output"""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 48)
        self.c, self.bn = nn.Conv2d(3, 5, 3, padding=1), nn.BatchNorm2d(5)
        self.c2 = nn.Conv2d(4, 6, 4)

    def forward(self, x):
        h = torch.tanh(self.l(x)).view(-1, 3, 4, 4)
        h = F.gelu(self.bn(self.c(h)))
        print("", end="")  # graph break
        g = self.c2(h[:, 1:])  # (N, 6, 1, 1)
        return g, h.permute(0, 2, 3, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cl_training_partial_convs_and_graph_break(backend, monkeypatch):
    _train(_PartialWithBreak, (6, 16), backend, monkeypatch, steps=2)


class _Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 4, 3)

    def forward(self, x):
        return self.c2(F.dropout(F.dropout2d(F.relu(self.bn(self.c(x))), 0.3), 0.2))


def test_cl_training_dropout_shapes_and_bn_stats(monkeypatch):
    """dropout (coil's numbers differ): shapes and strides, BN running stats of the first
    step (BN runs before the dropouts)"""
    _train(_Dropout, (2, 3, 10, 10), "triton", monkeypatch, steps=2, outputs=False)


# -- reductions: verified to work ----------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,fn", [
    ((2048, 1024), lambda x: (x.sum(0), x.var(0, keepdim=True))),
    ((4096, 1000), lambda x: x.mean(0)),
    ((3, 2048, 700), lambda x: (x.sum(1), x.var((0, 1)))),
    ((2049, 33), lambda x: (x.sum(0), x.var(0), x.amax(0))),  # ragged split of few outputs
], ids=["2048x1024", "4096x1000", "3x2048x700", "2049x33"])
def test_leading_split_reductions_with_grads(backend, shape, fn):
    torch.manual_seed(0)
    _check(fn, [torch.randn(*shape) * 2 + 1], backend, grads=True, atol=1e-3, rtol=1e-4)


# -- index expressions / size-1 outputs: verified to work ---------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_view_chains_floordiv(backend):
    def f(x):
        a = torch.roll(x.t().reshape(36), 5).view(4, 9)
        b = F.pixel_shuffle(x.view(1, 4, 3, 3).flip(2), 2)
        c = x.flip(1).unfold(1, 2, 2).reshape(6, 3, 2).transpose(1, 2).reshape(-1)
        return a * 2, b + 1, c * 3
    _check(f, [torch.randn(6, 6)], backend, grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_size1_outputs_exact_strides(backend):
    """keepdim reductions, unsqueeze, expand of a size-1 dim, argmax keepdim: every
    stride (size-1 dims included) is eager's"""
    def f(x):
        return (x.sum(-1, keepdim=True), x.mean(0, keepdim=True), (x * 2).unsqueeze(1),
                (x + 1)[:, :, :1].expand(4, 1, 5), x.amax(1, keepdim=True))
    _check(f, [torch.randn(4, 1, 5)], backend, exact_strides=True)


# -- failures ------------------------------------------------------------------------------

# fixed (lead, same day): regression test
@pytest.mark.parametrize("backend", BACKENDS)
def test_floordiv_pulls_multiple_out_of_negative_rest(backend):
    # index into x: (30 - i) // 6 became 5 + (-i) // 6; C++ '/' and Triton '//' truncate
    _check(lambda x: x.expand(6, 6).reshape(36).flip(0)[5:] * 2, [torch.randn(6, 1)], backend)


# fixed (lead, same day): regression test
@pytest.mark.parametrize("backend", BACKENDS)
def test_mod_drops_multiple_from_negative_rest(backend):
    _check(lambda x: x.expand(6, 6).reshape(36).flip(0)[5:] * 2, [torch.randn(1, 6)], backend)


# fixed (lead, same day): regression test
def test_triton_mean_over_empty_dim():
    _check(lambda a: (a * 2).mean(0), [torch.randn(0, 3, 4)], "triton")


@pytest.mark.xfail(strict=True, reason="ir/graph.py _output_spec: outputs take FakeTensor's strides, "
                   "which differ from eager's on size-1 dims (sigmoid of a (2,3,1,1) channels-last "
                   "tensor: fake (3,1,3,3), eager (3,1,1,1))")
@pytest.mark.parametrize("backend", BACKENDS)
def test_size1_dims_strides_follow_fake_not_eager(backend):
    w = torch.randn(2, 3, 1, 1).to(memory_format=torch.channels_last)
    _check(lambda w: w.sigmoid(), [w], backend, exact_strides=True)
