"""A graph break inside the body of a loop (a data-dependent ``if`` in every layer of a
``ModuleList``): the resume function receives the loop's iterator on its stack. It is read
lazily through its source (``ResumedIteratorVariable``) and a break inside a resume
function resumes from the user's code, so one resume function, compiled a bounded number
of times, runs every later iteration captured. The loop's rest used to run eagerly
("iteration over tuple_iterator": whisper's and wav2vec2's encoder layers on the H200)."""
import pytest
import torch
import torch.nn as nn

import coil
from coil.backends.registry import lookup_backend


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        x = self.lin(x).relu()
        if x.sum() > 1e9:            # data-dependent: a graph break in every layer
            x = x * 0
        return x + 1


class Stack(nn.Module):
    def __init__(self, n, kind):
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(n)])
        self.kind = kind

    def forward(self, x):
        if self.kind == "plain":
            for layer in self.layers:
                x = layer(x)
        elif self.kind == "enumerate":
            for i, layer in enumerate(self.layers):
                x = layer(x) * (i + 1) / (i + 2)
        elif self.kind == "zip":
            for layer, s in zip(self.layers, tuple(0.5 + k / 10 for k in range(len(self.layers)))):
                x = layer(x) * s
        else:                        # range
            for i in range(len(self.layers)):
                x = self.layers[i](x)
        return x.sum()


@pytest.mark.parametrize("kind", ["plain", "enumerate", "zip", "range"])
@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_break_in_every_layer_keeps_the_loop_captured(kind, backend):
    calls = []

    def counting(gm, example_inputs):
        n = sum(1 for node in gm.graph.nodes if node.op == "call_function"
                and "linear" in str(node.target))
        calls.append(n)
        return lookup_backend(backend)(gm, example_inputs)

    torch.manual_seed(0)
    m = Stack(12, kind)
    x = torch.randn(4, 8)
    want = m(x)
    want.backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    f = coil.compile(m, backend=counting)
    for _ in range(2):
        m.zero_grad()
        got = f(x)
        got.backward()
    torch.testing.assert_close(got, want)
    for p, g in zip(m.parameters(), grads):
        torch.testing.assert_close(p.grad, g)
    # every layer's linear ran in a compiled graph, from a bounded number of compiles
    # (no recompile per position: the loop had 12)
    assert len(calls) <= 8, calls
    assert sum(calls) >= 2, calls


def test_iterator_shorter_on_a_later_call_recompiles():
    torch.manual_seed(0)
    m = Stack(5, "plain")
    x = torch.randn(4, 8)
    f = coil.compile(m)
    torch.testing.assert_close(f(x), m(x))
    del m.layers[3:]
    torch.testing.assert_close(f(x), m(x))


def test_list_appended_to_inside_a_loop_with_a_break():
    """A list iterator (live over its list) is not read lazily: CPython's loop sees the
    items appended, and so does the compiled function."""
    def f(x):
        items = [1.0, 2.0]
        for v in items:
            x = x * v
            if x.sum() > 0 and len(items) < 4:
                items.append(v + 1)
        return x, items

    x = torch.ones(3)
    got, want = coil.compile(f)(x), f(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]


class _Breaks:
    """An object whose dunder methods graph-break inside (they call ``dict.keys`` of a live
    ``OrderedDict``, as transformers' ``ModelOutput.__getitem__`` does)."""

    def __init__(self, t):
        import collections
        self.d = collections.OrderedDict(a=t)

    def __getitem__(self, k):
        return [self.d[n] for n in self.d.keys()][k]

    def __add__(self, other):
        return self[0] + other

    def __lt__(self, other):
        return bool(self[0].sum() < other)

    def __getattr__(self, name):
        if name == "first":
            return self[0]
        raise AttributeError(name)


def _head(x=None, y=None):
    return torch.relu(x) * 2 if y is None or y else x


@pytest.mark.parametrize("form", ["subscript", "binary", "compare", "attribute"])
def test_break_in_an_operator_below_a_pending_call_keeps_the_rest_captured(form):
    """``f(x=obj[0])``: the break inside ``obj.__getitem__`` leaves a NULL and ``f`` on the
    stack below the subscript's operands. A one-instruction trampoline runs the operator and
    consumes the NULL (``resume._pack_stack``); the frame resumes captured after it (whisper's
    decoder, after ``encoder_outputs[0]``, used to run eagerly)."""
    def fn(obj, x):
        if form == "subscript":
            h = _head(x=obj[0], y=None)
        elif form == "binary":
            h = _head(x=obj + x, y=None)
        elif form == "compare":
            h = _head(x=x, y=obj < 1e9)
        else:
            h = _head(x=obj.first, y=None)
        return (h + 1).sin()

    graphs = []

    def counting(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op.startswith("call")])
        return lookup_backend("coil")(gm, example_inputs)

    x = torch.randn(4, 8)
    obj = _Breaks(torch.randn(4, 8))
    f = coil.compile(fn, backend=counting)
    for _ in range(2):
        torch.testing.assert_close(f(obj, x), fn(obj, x))
    assert any("sin" in t for g in graphs for t in g), graphs     # the rest ran in a graph


def test_boolean_mask_subscript_inside_call_arguments_keeps_the_rest_captured():
    """``F.mse_loss(pred[mask], y[mask])``: the mask subscript (a data-dependent shape) breaks
    with ``mse_loss`` and a NULL below it on the stack; values and gradients equal eager's."""
    import torch.nn.functional as F

    lin = nn.Linear(6, 6)

    def fn(x, y):
        pred = lin(x)
        mask = y > 0
        return F.mse_loss(pred[mask], y[mask]) * 2 + pred.sin().mean()

    torch.manual_seed(0)
    x, y = torch.randn(5, 6), torch.randn(5, 6)
    want = fn(x, y)
    want.backward()
    gw = lin.weight.grad.clone()
    lin.weight.grad = None
    got = coil.compile(fn)(x, y)
    got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(lin.weight.grad, gw)
