"""Regressions from new-user trial 60 (FINDINGS_60.md): a Python float argument that changes between calls under
``torch.inference_mode()`` (BatchNorm with ``momentum=None``); and a few of the programs that matched eager
(a CNN with BatchNorm switched between train / eval / no_grad / inference_mode with channels_last inputs, hooks added
and removed after compiling, modules mutating attributes and buffers, checkpoint, autocast regions, dataclass and
OrderedDict outputs, requires_grad toggled between calls).
"""

import collections
import copy
import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; crash): under torch.inference_mode(), a Python float that changed between calls (so the recompile
# passes it as a 0-d float64 tensor read with ``.item()``) failed to compile with DataDependentOutputException: the
# capture made that tensor inside inference mode, and a fake of an inference tensor keeps no ``item_memo`` (torch's
# FakeTensor refuses to memoize on inference tensors), so AOT traced without the SymFloat. BatchNorm with
# ``momentum=None`` (factor ``1 / num_batches_tracked``) hit it on its second call under inference_mode.
# ---------------------------------------------------------------------------------------------------------------

def test_changing_float_argument_under_inference_mode(coil_reset):
    def f(x, s):
        return x * (1.0 / s)

    cf = coil.compile(f)
    with torch.inference_mode():
        for s in (1.0, 2.0, 3.0):
            x = torch.randn(3)
            torch.testing.assert_close(cf(x, s), f(x, s))


def test_batchnorm_cumulative_average_under_inference_mode(coil_reset):
    m1 = nn.BatchNorm1d(3, momentum=None)
    m2 = copy.deepcopy(m1)
    cm = coil.compile(m2)
    for _ in range(3):
        x = torch.randn(4, 3)
        with torch.inference_mode():
            a, b = m1(x), cm(x)
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(m2.running_mean, m1.running_mean)
        torch.testing.assert_close(m2.running_var, m1.running_var)


def test_float_attribute_and_random_draw_under_inference_mode_dynamic(coil_reset):
    import random

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.temperature = 1.0

        def forward(self, x):
            return (x / self.temperature).softmax(-1) * random.random()

    m = M()
    cm = coil.compile(m, dynamic=True)
    with torch.inference_mode():
        for i, t in enumerate((0.5, 0.7, 1.3)):
            m.temperature = t
            x = torch.randn(2, 4 + i)
            random.seed(i)
            a = m(x)
            random.seed(i)
            torch.testing.assert_close(cm(x), a)


# ---------------------------------------------------------------------------------------------------------------
# Programs that matched eager
# ---------------------------------------------------------------------------------------------------------------

class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 4, 3, stride=2)
        self.bn2 = nn.BatchNorm2d(4, momentum=None)

    def forward(self, x):
        return self.bn2(self.c2(F.relu(self.bn(self.c1(x))))).mean((2, 3))


def test_cnn_batchnorm_mode_switches_channels_last(coil_reset):
    torch.manual_seed(0)
    m1 = _CNN()
    m2 = copy.deepcopy(m1)
    cm = coil.compile(m2)
    for step, mode in enumerate(["train", "eval", "nograd", "infer", "train"]):
        x = torch.randn(2, 3, 8, 8)
        if step % 2:
            x = x.to(memory_format=torch.channels_last)
        for m in (m1, m2):
            m.train(mode != "eval")
        ctx = {"nograd": torch.no_grad, "infer": torch.inference_mode}.get(mode, torch.enable_grad)
        with ctx():
            a, b = m1(x), cm(x)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
        if mode == "train":
            a.sum().backward()
            b.sum().backward()
    for k, v in m1.state_dict().items():
        torch.testing.assert_close(m2.state_dict()[k], v, atol=1e-5, rtol=1e-4)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, atol=1e-5, rtol=1e-4)


def test_hooks_added_and_removed_after_compiling(coil_reset):
    m1 = nn.Linear(3, 3)
    m2 = copy.deepcopy(m1)
    cm = coil.compile(m2)
    x = torch.randn(2, 3)
    torch.testing.assert_close(cm(x), m1(x))
    hs = [m.register_forward_hook(lambda mod, a, o: o * 2) for m in (m1, m2)]
    torch.testing.assert_close(cm(x), m1(x))
    hp = [m.register_forward_pre_hook(lambda mod, a, k: ((a[0] + 1,), k), with_kwargs=True) for m in (m1, m2)]
    torch.testing.assert_close(cm(x), m1(x))
    for h in hs + hp:
        h.remove()
    torch.testing.assert_close(cm(x), m1(x))


def test_module_mutating_attributes_and_buffers(coil_reset):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.n = 0
            self.cache = None
            self.register_buffer("ema", torch.zeros(3))
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            self.n += 1
            self.ema.mul_(0.9).add_(x.mean(0) * 0.1)
            y = self.lin(x) if self.cache is None else self.lin(x) + self.cache
            self.cache = y.detach()
            return y * self.n - self.ema, self.ema

    m1 = M()
    m2 = copy.deepcopy(m1)
    cm = coil.compile(m2)
    for _ in range(3):
        x = torch.randn(2, 3)
        a, b = m1(x), cm(x)
        torch.testing.assert_close(b[0], a[0])
        assert b[1] is m2.ema
    assert m2.n == m1.n == 3
    torch.testing.assert_close(m2.ema, m1.ema)
    torch.testing.assert_close(m2.cache, m1.cache)


def test_tensor_hooks_and_checkpoint_sequential(coil_reset):
    from torch.utils.checkpoint import checkpoint_sequential
    torch.manual_seed(0)
    seq1 = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4), nn.LayerNorm(4))
    seq2 = copy.deepcopy(seq1)

    def f(m, x):
        x.register_hook(lambda g: g * 10)
        h = checkpoint_sequential(m, 2, x * 2.0, use_reentrant=False)
        h.register_hook(lambda g: g.clamp(max=0.1))
        return h.pow(2).mean()

    x1 = torch.randn(5, 4, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    a, b = f(seq1, x1), coil.compile(f)(seq2, x2)
    a.backward()
    b.backward()
    torch.testing.assert_close(b, a)
    torch.testing.assert_close(x2.grad, x1.grad)
    for p1, p2 in zip(seq1.parameters(), seq2.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad)


def test_nested_autocast_regions(coil_reset):
    lin = nn.Linear(8, 8)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
            with torch.autocast("cpu", enabled=False):
                z = y.float() @ x.t()
            s = F.softmax(y, -1)
        return y, z, s

    x1 = torch.randn(4, 8, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    a, b = f(x1), coil.compile(f)(x2)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype
        torch.testing.assert_close(v, u)
    sum(t.float().sum() for t in a).backward()
    sum(t.float().sum() for t in b).backward()
    torch.testing.assert_close(x2.grad, x1.grad)


def test_dataclass_with_ordereddict_output(coil_reset):
    @dataclasses.dataclass
    class O:
        loss: torch.Tensor
        extra: dict

    def f(x):
        od = collections.OrderedDict(b=x.exp(), a=x.detach() * 2)
        return O(loss=x.pow(2).sum(), extra={"od": od, "t": (x[0], None, 3.5)})

    x = torch.randn(3, requires_grad=True)
    a, b = f(x), coil.compile(f)(x)
    assert type(b.extra["od"]) is collections.OrderedDict and list(b.extra["od"]) == ["b", "a"]
    assert not b.extra["od"]["a"].requires_grad and b.extra["t"][0].requires_grad and b.extra["t"][1:] == (None, 3.5)
    torch.testing.assert_close(b.loss, a.loss)
    torch.testing.assert_close(b.extra["od"]["b"], a.extra["od"]["b"])


def test_requires_grad_toggled_between_calls(coil_reset):
    w = torch.randn(4)

    def f(x):
        return (x * w).sin().sum(0)

    cf = coil.compile(f)
    for rgx, rgw in [(False, False), (True, False), (False, True), (True, True)]:
        w.requires_grad_(rgw)
        w.grad = None
        x1 = torch.randn(3, 4, requires_grad=rgx)
        x2 = x1.detach().clone().requires_grad_(rgx)
        b = cf(x2)
        gw = None
        if b.requires_grad:
            b.sum().backward()
            gw, w.grad = w.grad, None
        a = f(x1)
        assert a.requires_grad == b.requires_grad
        torch.testing.assert_close(b, a)
        if a.requires_grad:
            a.sum().backward()
            if rgx:
                torch.testing.assert_close(x2.grad, x1.grad)
            if rgw:
                torch.testing.assert_close(gw, w.grad)
