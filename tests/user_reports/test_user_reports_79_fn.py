"""Regression tests for trial 79 (tests/user_reports/FINDINGS_79.md): custom autograd.Function outputs."""
import pytest
import torch

import coil

BACKENDS = [("cpp", False), ("cpp", True), ("triton", False), ("triton", True)]


class Neg(torch.autograd.Function):     # a gradient-reversal layer
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -g


class Ident(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 3


class Slice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x[1:]

    @staticmethod
    def backward(ctx, g):
        r = g.new_zeros(g.shape[0] + 1, *g.shape[1:])
        r[1:] = g * 7
        return r


class Pair(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x, y * 2

    @staticmethod
    def backward(ctx, gx, gy):
        return gx * 3, gy * 5


class Halves(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x[:1], x[1:]

    @staticmethod
    def backward(ctx, a, b):
        return torch.cat([a * 2, b * 3])


class Dirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 5


def _compile(fn, backend, dynamic, monkeypatch):
    if backend == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    coil.reset()
    return coil.compile(fn, dynamic=dynamic, options={"cpu_backend": backend})


def _grad(fn, nonleaf=False):
    """``fn``'s outputs and the gradient of a weighted sum of them w.r.t. a 3x2 leaf (``nonleaf``: passed as leaf*1)."""
    leaf = torch.tensor([[1., 2.], [3., 4.], [5., 6.]], requires_grad=True)
    x = leaf * 1 if nonleaf else leaf
    outs = fn(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    sum(((i + 1) * torch.arange(o.numel()).view(o.shape) * o).sum() for i, o in enumerate(outs)).backward()
    return x, outs, leaf.grad


F1_CASES = {
    "view_as": lambda x: Neg.apply(x),
    "input_itself": lambda x: Ident.apply(x),
    "slice": lambda x: Slice.apply(x),
    "view_of_fn_output": lambda x: Neg.apply(x).view(-1),
    "input_and_fresh": lambda x: Pair.apply(x, x),
    "multi_output_views": lambda x: Halves.apply(x),
    "view_of_multi_output_view": lambda x: Halves.apply(x)[1].view(-1),
}


@pytest.mark.parametrize("backend,dynamic", BACKENDS)
@pytest.mark.parametrize("case", list(F1_CASES))
def test_f1_custom_function_view_of_input_runs_its_backward(case, backend, dynamic, monkeypatch):
    """A custom Function returning its input or a view of it (``x.view_as(x)``: a gradient-reversal layer) where that
    input is a graph input: the output was rebuilt in the runtime epilogue as ``as_strided`` of the input, so the
    Function's backward never ran (gradient +1 for eager's -1). Now such an output is computed by the graph (its
    backward is in the compiled one) and still a view of the input, as eager's."""
    fn = F1_CASES[case]
    x0, ref, ref_grad = _grad(fn)
    x, outs, grad = _grad(_compile(fn, backend, dynamic, monkeypatch))
    assert torch.equal(grad, ref_grad)
    for o, r in zip(outs, ref):
        assert torch.equal(o, r) and o.shape == r.shape and o.stride() == r.stride()
        assert (o._base is x) == (r._base is x0)    # a view of the input where eager's is
    with torch.no_grad():
        x.add_(100)             # and later writes to the input show through it
        x0.add_(100)
    assert all(torch.equal(o, r) for o, r in zip(outs, ref))


def test_f1_gradient_reversal_minimal():
    x = torch.ones(3, requires_grad=True)
    coil.reset()
    coil.compile(lambda x: Neg.apply(x))(x).sum().backward()
    assert x.grad.tolist() == [-1.0, -1.0, -1.0]


def test_f1_view_output_refuses_in_place_write():
    """#11: eager refuses an in-place write to a custom Function's view output (its backward would be overridden)."""
    x = torch.ones(3, 2, requires_grad=True)
    coil.reset()
    out = coil.compile(lambda x: Slice.apply(x))(x)
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        out.mul_(2)


@pytest.mark.parametrize("backend,dynamic", BACKENDS)
def test_f3_mark_dirty_input_runs_backward(backend, dynamic, monkeypatch):
    """A Function writing its input in place with ``ctx.mark_dirty`` and returning it: the write happens under no_grad
    (inside ``forward``), so it was replayed as a hidden mutation and the input kept its old history: gradient 1 for
    eager's 5 (torch.compile too)."""
    fn = lambda x: Dirty.apply(x)  # noqa: E731
    x0, ref, ref_grad = _grad(fn, nonleaf=True)
    x, outs, grad = _grad(_compile(fn, backend, dynamic, monkeypatch), nonleaf=True)
    assert torch.equal(grad, ref_grad) and torch.equal(outs[0], ref[0]) and torch.equal(x, x0)
    assert outs[0] is x


@pytest.mark.parametrize("backend,dynamic", BACKENDS)
def test_f3_view_of_returned_intermediate_runs_backward(backend, dynamic, monkeypatch):
    """``h = x * 1; return h, Slice.apply(h)``: the Function's view was rebuilt from the returned ``h``, skipping its
    backward (x.grad [1, 2, 2] for eager's [1, 8, 8]; torch.compile too). Also a view of such an output."""
    for fn in (lambda x: (lambda h: (h, Slice.apply(h)))(x * 1),
               lambda x: (lambda o: (o, o.view(-1)))(Slice.apply(x))):
        _, ref, ref_grad = _grad(fn)
        _, outs, grad = _grad(_compile(fn, backend, dynamic, monkeypatch))
        assert torch.equal(grad, ref_grad)
        assert all(torch.equal(o, r) for o, r in zip(outs, ref))


@pytest.mark.parametrize("fn_cls", [Dirty, Ident])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_f79b_function_returning_its_input_under_callers_no_grad(fn_cls, requires_grad):
    """79b: under the caller's ``no_grad``, eager's ``apply`` returns an input that requires grad as a detached alias
    (not a view, no grad), a ``mark_dirty`` input that does not as itself, and an other input as a view. coil returned a
    view that requires grad for all: a later ``o.add_(1)`` raised "A view was created in no_grad mode"."""
    def f(x):
        return fn_cls.apply(x)

    def run(fn):
        x = torch.arange(3.0, requires_grad=requires_grad) * 1
        with torch.no_grad():
            o = fn(x)
        got = (o is x, o._base is x, o.data_ptr() == x.data_ptr(), o.requires_grad, o._is_view(), o.grad_fn)
        o.add_(1)  # eager's works
        return got, o.detach(), x.detach()
    (want, wo, wx), (got, go, gx) = run(f), run(coil.compile(f))
    assert got == want
    torch.testing.assert_close(go, wo)
    torch.testing.assert_close(gx, wx)
