"""Regression tests for trial 79 (tests/user_reports/FINDINGS_79.md): outputs that alias inputs."""
import pytest
import torch

import coil


def _compiled(fn, dynamic=False):
    coil.reset()
    return coil.compile(fn, dynamic=dynamic)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("view", ["t", "select", "expand"])
def test_f1b_view_of_requires_grad_input_under_callers_no_grad_has_no_grad_fn(view, dynamic):
    """Called under ``torch.no_grad()``, a view of a requires-grad input came back with ``AsStridedBackward0`` (the
    epilogue made every aliased output that requires grad with grad enabled), so a later backward wrote ``.grad`` of
    the frozen tensor. Eager's view requires grad and has no ``grad_fn``."""
    fn = {"t": lambda w: w.t(), "select": lambda w: w[0], "expand": lambda w: w.expand(2, 2, 3)}[view]
    w = torch.ones(2, 3, requires_grad=True)
    with torch.no_grad():
        ref, out = fn(w), _compiled(fn, dynamic)(w)
    assert out.grad_fn is None and out.requires_grad == ref.requires_grad and out._base is w
    assert torch.equal(out, ref)
    if out.requires_grad:
        (out * 2).sum().backward()
    assert w.grad is None


def test_f1b_parameter_view_read_under_no_grad():
    """The report's form: a compiled function returning ``W.t()`` of a global parameter, called under no_grad."""
    w = torch.nn.Parameter(torch.ones(2, 3))
    with torch.no_grad():
        wt = _compiled(lambda: w.t())()
    y = torch.randn(4, 3, requires_grad=True)
    (y @ wt).sum().backward()
    assert wt.grad_fn is None and w.grad is None and y.grad is not None


def test_f1b_enable_grad_region_keeps_its_grad_fn():
    """An aliased output made in the program's own ``enable_grad()`` region keeps its ``grad_fn`` under the caller's
    no_grad (the case the epilogue's grad-enabled view was for)."""
    def f(x):
        with torch.enable_grad():
            return x.t()
    x = torch.ones(2, 3, requires_grad=True)
    with torch.no_grad():
        out = _compiled(f)(x)
    assert out.grad_fn is not None
    out.sum().backward()
    assert torch.equal(x.grad, torch.ones(2, 3))


@pytest.mark.parametrize("dynamic", [False, True])
def test_f4_view_made_under_programs_no_grad_carries_no_gradient(dynamic):
    """``with torch.no_grad(): v = x[0]; return v``: coil's ``v`` was an ``as_strided`` with a ``grad_fn``, so a
    backward through it added to ``x.grad``; eager's ``v`` has no ``grad_fn`` and an in-place op on it under grad mode
    raises."""
    def f(x):
        with torch.no_grad():
            v = x[0]
        return v
    x = torch.ones(3, 2, requires_grad=True)
    v = _compiled(f, dynamic)(x)
    assert v.grad_fn is None and v.requires_grad and v._base is x
    (v * x[0]).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[1., 1.], [0., 0.], [0., 0.]]))
    with pytest.raises(RuntimeError, match="no_grad mode"):
        v.mul_(2)


@pytest.mark.parametrize("with_base", [False, True])
def test_f4_view_of_intermediate_made_under_no_grad(with_base):
    """The same of an intermediate (``y = x * 2``, ``y[0]`` under no_grad). Returned alone, the joint trace asked
    autograd for the gradient of an output without a ``grad_fn`` and the compile failed (now a non-differentiable
    output); returned with ``y``, it was rebuilt from ``y`` with a ``grad_fn``. Eager's gradients either way."""
    def f(x):
        y = x * 2
        with torch.no_grad():
            v = y[0]
        return (v, y) if with_base else v
    x = torch.ones(3, 2, requires_grad=True)
    out = _compiled(f)(x)
    v = out[0] if with_base else out
    assert v.grad_fn is None and torch.equal(v, torch.full((2,), 2.))
    (v * x * 2).sum().backward()
    assert torch.equal(x.grad, torch.full((3, 2), 4.))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("src,dst,view", [
    (torch.float16, torch.bfloat16, lambda v: v),
    (torch.float32, torch.int32, lambda v: v),
    (torch.int8, torch.bool, lambda v: v),
    (torch.float32, torch.uint8, lambda v: v[:, 1:].t()),
])
def test_f2_dtype_view_output_shares_the_inputs_version_counter(src, dst, view, dynamic):
    """``x.view(dtype)`` returned was a tensor ``set_`` on ``x``'s storage with a version counter of its own: a write
    to either was not seen by the other's ``_version``. It is made by view ops now."""
    def f(x):
        return view(x.view(dst))
    x = torch.arange(8).view(4, 2).to(src)
    ref = f(x.clone())
    out = _compiled(f, dynamic)(x)
    assert torch.equal(out, ref) and out.stride() == ref.stride() and out.dtype == dst
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and out.grad_fn is None
    v = out._version
    x.add_(1) if src != torch.int8 else x.mul_(2)
    assert out._version > v
    v = x._version
    out.zero_()
    assert x._version > v and not x.any()


def test_f2_stale_saved_dtype_view_raises_as_eager():
    """The report's form: autograd saved the bitcast view for ``w``'s gradient, then the input was overwritten; eager
    raises "modified by an inplace operation", coil's backward silently used the new values."""
    def f(x):
        return x.view(torch.bfloat16)
    x = torch.full((3,), 1.5, dtype=torch.float16)
    v = _compiled(f)(x)
    w = torch.ones(3, dtype=torch.bfloat16, requires_grad=True)
    y = (w * v).sum()
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("part", ["real", "imag", "conj_imag", "slice"])
def test_f5_views_of_a_conjugate_input(part, dynamic):
    """``z.real`` / ``z.imag`` of a ``.conj()`` input raised in the epilogue (``view_as_real`` of an unresolved
    conjugate), and ``z[1:]`` came back unconjugated (``as_strided`` kept the input's conj bit and the epilogue
    toggled it again). The views are taken from the storage's values, then get eager's lazy bits."""
    fn = {"real": lambda z: z.real, "imag": lambda z: z.imag, "conj_imag": lambda z: z.conj().imag,
          "slice": lambda z: z[1:]}[part]
    z = torch.tensor([1 + 2j, 3 - 4j, -5 + 6j], dtype=torch.complex64).conj()
    ref, out = fn(z), _compiled(fn, dynamic)(z)
    assert torch.equal(out.resolve_conj().resolve_neg(), ref.resolve_conj().resolve_neg())
    assert (out.is_conj(), out.is_neg()) == (ref.is_conj(), ref.is_neg())
    assert out.untyped_storage().data_ptr() == z.untyped_storage().data_ptr()


@pytest.mark.parametrize("outs", ["imag,z0", "z,imag,z0", "z0.imag,z1", "imag,zt"])
def test_f5_imag_of_a_conjugate_input_that_requires_grad_with_another_view(outs):
    """``z.imag`` of a ``.conj()`` of a tensor that requires grad, returned with another view of ``z``: computed and
    then set onto the input's storage (``OutputInfo.shares``), it lost eager's neg bit and came back with its sign
    flipped (a follow-up trial of the #5 fix). The lazy bits are set on such outputs too."""
    fn = {"imag,z0": lambda z: (z.imag, z[0]), "z,imag,z0": lambda z: (z, z.imag, z[0]),
          "z0.imag,z1": lambda z: (z[0].imag, z[1]), "imag,zt": lambda z: (z.imag, z.t())}[outs]
    w = torch.tensor([[1 + 2j, 3 - 4j], [-5 + 6j, 7 + 1j]], requires_grad=True)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            for got, want in zip(_compiled(fn)(w.conj()), fn(w.conj())):
                assert torch.equal(got.resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg())


def test_f5_conjugate_input_after_a_plain_one():
    """The same compiled function called with a plain complex tensor, then with a conjugate view."""
    def f(z):
        return z.imag
    cf = _compiled(f)
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert torch.equal(cf(z), f(z))
    assert torch.equal(cf(z.conj()).resolve_neg(), f(z.conj()).resolve_neg())


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("case", ["add", "cumsum", "views", "slice"])
def test_f6_out_into_a_fresh_empty_tensor_resized_to_more_dims(case, dynamic):
    """``o = torch.empty(0); torch.add(x, 1, out=o); return o`` raised "dimensionality of sizes (2) must match
    dimensionality of strides (1)" in the epilogue: the analysis read ``o``'s layout from its FunctionalTensor
    wrapper, which keeps the (0,) it had before the out= op resized it."""
    def f(x):
        o = torch.empty(0)
        torch.cumsum(x, 0, out=o) if case == "cumsum" else torch.add(x, 1, out=o)
        return {"views": (o, o.t(), o[1:]), "slice": o[1:]}.get(case, o)
    x = torch.randn(4, 2)
    ref, out = f(x), _compiled(f, dynamic)(x)
    for r, o in zip(ref if isinstance(ref, tuple) else (ref,), out if isinstance(out, tuple) else (out,)):
        assert torch.allclose(o, r) and o.shape == r.shape and o.stride() == r.stride()


@pytest.mark.parametrize("dynamic", [False, True])
def test_f79b_imag_of_a_conjugate_input_that_requires_grad_is_over_its_memory(dynamic):
    """79b: ``z.imag`` of a ``.conj()`` input that requires grad, the only output of a program that writes nothing.
    It is computed (to have a grad_fn) and set onto the input's storage (``OutputInfo.shares``), but the runtime's
    fast path for programs whose outputs are all computed returned it as computed: a later write to ``z`` did not
    show through it (eager's is a view, with a lazy neg bit)."""
    def f(z):
        return z.imag

    res = []
    for fn in (f, coil.compile(f, dynamic=dynamic)):
        base = torch.tensor([1 + 2j, 3 - 4j, -5 + 6j], requires_grad=True)
        z = (base * 1).conj()
        o = fn(z)
        assert o.untyped_storage().data_ptr() == z.untyped_storage().data_ptr() and o.is_neg() and o.requires_grad
        with torch.no_grad():
            z.add_(1j)
        o.sum().backward()
        res.append((o.detach().clone(), base.grad))
    torch.testing.assert_close(res[1], res[0])
