"""Open defects from a new-user trial of ~560 programs (both CPU backends, static with automatic
dynamic over several sizes including 1 and 0, and ``dynamic=True``; Python-level capture,
closures, module hooks, context managers, forward AD, complex views, RNG, losses, pooling,
interpolation, autograd under dynamic shapes). FINDINGS_22.md has the table; each defect below
is a strict xfail. CPU only (the Triton backend through ``TRITON_INTERPRET=1``)."""
import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn as nn
import torch.nn.functional as F

import coil


def _compile(fn, backend="cpp", **kw):
    coil.reset()
    return coil.compile(fn, options={"cpu_backend": backend}, **kw)


# --- silent wrong -------------------------------------------------------------------------

def test_method_of_local_class_reads_closure_at_each_call():
    def make():
        s = [2.0]

        class P:
            def run(self, x):
                return x * s[0]
        return P(), s

    p, s = make()
    f = lambda x: p.run(x)  # noqa: E731
    cf = _compile(f)
    x = torch.ones(2)
    cf(x)
    s[0] = 5.0
    torch.testing.assert_close(cf(x), f(x))  # eager [5, 5], coil [2, 2]


def test_forward_of_local_module_appends_to_closure_list():
    def make():
        log = []

        class M(nn.Module):
            def forward(self, x):
                log.append(1)
                return x * 2
        return M(), log

    m, log = make()
    cm = _compile(m)
    cm(torch.ones(2))
    cm(torch.ones(2))
    assert log == [1, 1]  # coil: []


def test_forward_hook_closure():
    def make():
        s = [2.0]
        log = []

        def hook(mod, args, out):
            log.append(1)
            return out * s[0]
        return hook, s, log

    hook, s, log = make()
    torch.manual_seed(0)
    m = nn.Linear(3, 3)
    m.register_forward_hook(hook)
    cm = _compile(m)
    x = torch.ones(1, 3)
    cm(x)
    assert log == [1]  # coil: []
    s[0] = 5.0
    torch.testing.assert_close(cm(x), m(x))


def test_dual_tensor_input_keeps_its_tangent():
    """A forward-AD dual tensor passed to a compiled function: eager's result carries the
    tangent (2 cos x); coil's result has no tangent (``unpack_dual(...).tangent`` is None).
    torch.compile(aot_eager) keeps it."""
    g = lambda d: d.sin() * 2  # noqa: E731
    x = torch.randn(3)
    cg = _compile(g)
    with fwAD.dual_level():
        d = fwAD.make_dual(x, torch.ones_like(x))
        expected = fwAD.unpack_dual(g(d)).tangent
        got = fwAD.unpack_dual(cg(d)).tangent
    assert got is not None
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_multilabel_margin_loss_stops_at_minus_one(backend):
    f = lambda x, t: F.multilabel_margin_loss(x, t)  # noqa: E731
    x = torch.tensor([[0.1, 0.2, 0.4, 0.8]])
    t = torch.tensor([[3, 0, -1, 1]])
    torch.testing.assert_close(_compile(f, backend)(x, t), f(x, t))  # eager 0.85, coil 2.05


# --- error where eager runs ---------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_random_from_to(backend):
    f = lambda x: x.clone().random_(0, 5)  # noqa: E731
    out = _compile(f, backend)(torch.ones(3, 4))
    assert out.shape == (3, 4) and out.dtype == torch.float32
    assert ((out >= 0) & (out < 5) & (out == out.floor())).all()


def test_fork_rng_on_the_second_call():
    def f(x):
        with torch.random.fork_rng():
            y = x * 2
        return y
    cf = _compile(f)
    x = torch.ones(2)
    for _ in range(3):
        torch.testing.assert_close(cf(x), f(x))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("view", ["real", "imag", "view_as_real"])
def test_inplace_on_real_view_of_complex_intermediate(backend, view):
    fns = {
        "real": lambda z: z.clone().real.mul_(3),
        "imag": lambda z: z.clone().imag.add_(1),
        "view_as_real": lambda z: torch.view_as_real(z.clone()).mul_(2),
    }
    f = fns[view]
    z = torch.randn(2, 3, dtype=torch.complex64)
    torch.testing.assert_close(_compile(f, backend)(z), f(z))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_affine_grid_with_grad_dynamic(backend):
    f = lambda t: F.affine_grid(t, [t.shape[0], 1, 3, 4], align_corners=False)  # noqa: E731
    cf = _compile(f, backend, dynamic=True)
    t1 = torch.randn(2, 2, 3, requires_grad=True)
    t2 = t1.detach().clone().requires_grad_()
    out = cf(t2)
    exp = f(t1)
    torch.testing.assert_close(out, exp)
    out.sum().backward()
    exp.sum().backward()
    torch.testing.assert_close(t2.grad, t1.grad)


def test_forward_ad_inside_compiled_function():
    def f(x):
        with fwAD.dual_level():
            d = fwAD.make_dual(x, torch.ones_like(x))
            return fwAD.unpack_dual(d.sin()).tangent
    x = torch.randn(3)
    torch.testing.assert_close(_compile(f)(x), f(x))
