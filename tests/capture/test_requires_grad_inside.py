"""Tensors made to require grad inside a compiled function (``t.requires_grad_()``,
``torch.zeros(n, requires_grad=True)``, ``t.retain_grad()``) are graph breaks: the op
runs eagerly and the rest of the frame is captured with the tensor as an input, so the
tensor is a leaf that backward reaches, as in eager (user report 16, defect 1: it used
to be a graph node, cut off from autograd, and its ``.grad`` stayed ``None``)."""
import pytest
import torch
import torch.nn as nn

import coil
from coil.backends.registry import lookup_backend
from coil.exc import GraphBreakInFullgraph

BACKENDS = ["aot_eager", "coil"]


def _copies(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) for a in args]


def _leaf_and_loss(fn, args, backend):
    """(eager, compiled) runs of ``fn(*args) -> (leaf, loss)``, each followed by
    ``loss.backward()``; compares values, leafness, the leaf's grad and the args' grads."""
    runs = []
    for f in (fn, coil.compile(fn, backend=backend)):
        a = _copies(args)
        leaf, loss = f(*a)
        assert loss.requires_grad
        loss.backward()
        runs.append((leaf, loss, a))
    (le, se, ae), (lc, sc, ac) = runs
    torch.testing.assert_close(sc, se)
    torch.testing.assert_close(lc, le)
    assert (lc.is_leaf, lc.requires_grad, lc.retains_grad) == \
        (le.is_leaf, le.requires_grad, le.retains_grad)
    if le.is_leaf or le.retains_grad:
        torch.testing.assert_close(lc.grad, le.grad)
    for x, y in zip(ac, ae):
        assert (x.grad is None) == (y.grad is None)
        if y.grad is not None:
            torch.testing.assert_close(x.grad, y.grad)


def clone_requires_grad(img, w):
    x = img.clone().requires_grad_()
    return x, (x.sin() * w).sum()


def factory_zeros(a):
    x = torch.zeros(3, requires_grad=True)
    return x, (x.exp() * a).sum()


def factory_tensor(a):
    x = torch.tensor([1.0, -2.0, 0.5], requires_grad=True)
    return x, (x * x * a).sum()


def factory_like(a):
    x = torch.ones_like(a, requires_grad=True)
    return x, (x.cos() * a).sum()


def input_requires_grad(a):
    a.requires_grad_()
    return a, (a * a).sum()


def retained(a):
    x = a * 2
    x.retain_grad()
    return x, (x * x).sum()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,shapes", [
    (clone_requires_grad, [(2, 3), (2, 3)]),
    (factory_zeros, [(3,)]),
    (factory_tensor, [(3,)]),
    (factory_like, [(4,)]),
    (input_requires_grad, [(3,)]),
])
def test_leaf_made_inside_gets_grad(fn, shapes, backend):
    _leaf_and_loss(fn, [torch.randn(*s) for s in shapes], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_leaf_made_inside_with_grad_input(backend):
    # another input requires grad: it gets its grad, and so does the new leaf
    _leaf_and_loss(clone_requires_grad,
                   [torch.randn(2, 3), torch.randn(2, 3, requires_grad=True)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_retain_grad_fills_grad(backend):
    _leaf_and_loss(retained, [torch.randn(3, requires_grad=True)], backend)


def forces(a):
    x = a.detach().requires_grad_()
    energy = (x.sin() * 3).sum()
    return -torch.autograd.grad(energy, x)[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_autograd_grad_wrt_detached_leaf(backend, requires_grad):
    a = torch.randn(5, requires_grad=requires_grad)
    torch.testing.assert_close(coil.compile(forces, backend=backend)(a), forces(a))


def test_break_reason_names_the_op_and_line():
    e = coil.explain(clone_requires_grad, torch.randn(2, 3), torch.randn(2, 3))
    assert e.graph_break_count == 1
    reason = str(e.break_reasons[0])
    assert "requires_grad_" in reason and "clone_requires_grad" in reason, reason
    e = coil.explain(factory_zeros, torch.randn(3))
    assert "zeros(..., requires_grad=True)" in str(e.break_reasons[0])


def no_op_requires_grad(a):
    y = (a * 2).requires_grad_()          # already requires grad: eager changes nothing
    z = a.detach().requires_grad_(False)  # already does not
    return y, (y * z).sum()


def test_requires_grad_that_changes_nothing_stays_in_graph():
    a = torch.randn(3, requires_grad=True)
    e = coil.explain(no_op_requires_grad, a)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    _leaf_and_loss(no_op_requires_grad, [a], "aot_eager")


def test_factory_with_requires_grad_false_stays_in_graph():
    e = coil.explain(lambda a: torch.zeros(3, requires_grad=False) + a, torch.randn(3))
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons


def test_fullgraph_refuses():
    with pytest.raises(GraphBreakInFullgraph, match="requires_grad_"):
        coil.compile(clone_requires_grad, backend="eager", fullgraph=True)(
            torch.randn(2, 3), torch.randn(2, 3))


def test_integer_tensor_raises_eager_error():
    f = coil.compile(lambda a: torch.arange(3).requires_grad_() * a, backend="eager")
    with pytest.raises(RuntimeError, match="floating point"):
        f(torch.randn(3))


def attribute_and_parameter(a):
    x = a.clone()
    x.requires_grad = True
    w = nn.Parameter(torch.ones(3))
    return x, (x * w * a).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_attribute_write_and_parameter_still_work(backend):
    _leaf_and_loss(attribute_and_parameter, [torch.randn(3)], backend)


class _FeatureEncoder(nn.Module):
    """wav2vec2's feature encoder: ``hidden.requires_grad = True`` before a loop of convs."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(1 if i == 0 else 4, 4, 3) for i in range(3)])

    def forward(self, x):
        h = x[:, None]
        if self.training:
            h.requires_grad = True
        for conv in self.convs:
            h = torch.nn.functional.gelu(conv(h))
        return h.sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_frame_after_an_attribute_write_is_captured(backend):
    """The write runs alone as plain Python (a trampoline); the loop after it is a graph
    (it ran uncaptured: wav2vec2's training step was 3x slower than eager)."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(sum(n.op == "call_module" or n.op == "call_function" for n in gm.graph.nodes))
        return lookup_backend(backend)(gm, example_inputs)

    m = _FeatureEncoder()
    x = torch.randn(2, 20)
    m(x).backward()
    want = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    out = coil.compile(m, backend=counting)(x)
    out.backward()
    torch.testing.assert_close(out, m(x))
    for p, w in zip(m.parameters(), want):
        torch.testing.assert_close(p.grad, w)
    assert len(graphs) == 2 and graphs[1] >= 6, graphs   # 3 convs + 3 gelus after the break

