"""aot_eager under torch's capture: dynamic shapes, input mutation, aliasing."""
import torch
import torch.nn as nn

from coil.aot.backend import aot_eager


def _compile(fn, **kw):
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(fn, backend=aot_eager, **kw)


def test_dynamic_shapes_training_two_sizes():
    def f(x, w):
        return (x @ w).relu().sum(0) * x.shape[0]

    c = _compile(f, dynamic=True)
    w = torch.randn(4, 3, requires_grad=True)
    for n in (5, 7, 9):
        x = torch.randn(n, 4)
        out, ref = c(x, w), f(x, w)
        torch.testing.assert_close(out, ref)
        (g,) = torch.autograd.grad(out.sum(), w)
        (rg,) = torch.autograd.grad(ref.sum(), w)
        torch.testing.assert_close(g, rg)


def test_input_mutation_and_view_output_through_dynamo():
    def f(x, buf):
        buf.add_(x.sum())
        x[:, 0].mul_(2)
        return x.t(), buf * 2

    x, buf = torch.randn(3, 4), torch.randn(2)
    xr, br = x.clone(), buf.clone()
    c = _compile(f, dynamic=False)
    out_t, out_b = c(x, buf)
    ref_t, ref_b = f(xr, br)
    torch.testing.assert_close(x, xr)
    torch.testing.assert_close(buf, br)
    torch.testing.assert_close(out_t, ref_t)
    assert out_t._base is x


def test_batchnorm_module_buffers_through_dynamo():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU())
    ref = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU())
    ref.load_state_dict(m.state_dict())
    c = _compile(m, dynamic=False)
    for _ in range(3):
        x = torch.randn(8, 5)
        torch.testing.assert_close(c(x), ref(x))
    for (name, b), r in zip(m.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, r, msg=name)


def test_dynamic_shapes_outputs_that_are_views():
    """Symbolic sizes: a view of an input, of another output and of an input with a
    size-dependent offset are rebuilt with each call's sizes (they were as_strided with
    the trace's SymInts: "SymIntArrayRef expected to contain only concrete integers")."""
    def f(x):
        z = x.exp()
        return z, z.t(), x.t(), x[1:]

    c = _compile(f, dynamic=True)
    for shape in ((4, 5), (3, 2)):
        x = torch.randn(*shape)
        out, ref = c(x), f(x)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r)
            assert o.stride() == r.stride() and o.storage_offset() == r.storage_offset()
        assert out[2]._base is x and out[3]._base is x and out[1]._base is out[0]


def test_dynamic_shapes_training_mutation_from_grad_input():
    """Symbolic sizes: ``y.mul_(x)`` with ``x`` requiring grad. The capture's fake ``y``
    requires grad after its trace; faked from the real input it does not ("Mixing fake
    modes NYI" in trace_joint). A bool output makes the mutated ``y``'s missing gradient
    zeros of the call's shape (not the traced symbolic one)."""
    def f(x, y):
        y.mul_(x)
        return x.sin() + y, x > 0

    c = _compile(f, dynamic=True)
    for shape in ((4, 5), (3, 2)):
        x, y = torch.randn(*shape, requires_grad=True), torch.randn(*shape)
        xr, yr = x.detach().clone().requires_grad_(), y.clone()
        out, ref = c(x, y), f(xr, yr)
        torch.testing.assert_close(out[0], ref[0])
        torch.testing.assert_close(y, yr)
        out[0].sum().backward()
        ref[0].sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
