"""A frame that only forwards a call (``return f(*args, **kwargs)``: a module's call
frame, a decorator's wrapper) and breaks because the callee breaks splits no graph:
the callee is captured on its own frame. Such a frame logs ``forwarded_call`` and is
not counted as a graph break (OPT's training step under transformers 5.17 counted its
layer-drop ``if`` once per wrapper frame above it: 8 breaks against torch.compile's 2)."""
import functools

import torch

import coil
import coil.capture


def passthrough(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


def keeps_result(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        return out * 2                       # work after the call: a real break
    return wrapper


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    @passthrough
    def forward(self, x):
        x = self.lin(x)
        if x.sum() > 1e9:                    # data-dependent: a graph break
            x = x * 0
        return x.relu()


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    @passthrough
    def forward(self, x):
        return self.inner(x)


class OuterWithWork(Outer):
    @keeps_result
    def forward(self, x):
        return self.inner(x)


def _breaks(model, x):
    coil.reset()
    f = coil.compile(model, backend="eager")
    torch.testing.assert_close(f(x), model(x))
    torch.testing.assert_close(f(x), model(x))
    return coil.capture.stats["graph_breaks"], coil.explain(model, x)


def test_forwarding_frames_are_not_breaks():
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    n, report = _breaks(Outer(), x)
    # only Inner.forward's own frame splits (at its ``if``); the module call frames and
    # the wrappers above it forward the call
    assert n == 1, report


def test_work_after_the_call_is_still_a_break():
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    n, _ = _breaks(OuterWithWork(), x)
    assert n == 2     # Outer's wrapper multiplies the result: its frame is split too


def test_graph_before_the_call_is_still_a_break():
    def f(x):
        return torch.sin(x + 1)

    def g(x):
        y = x * 3                             # a graph before the breaking call
        return h(y)

    def h(y):
        if y.sum() > 0:
            return f(y)
        return f(-y)

    coil.reset()
    x = torch.randn(5)
    c = coil.compile(g, backend="eager")
    torch.testing.assert_close(c(x), g(x))
    assert coil.capture.stats["graph_breaks"] == 2     # g's and h's frames
