"""Arguments eager refuses but torch's meta kernels accept raise eager's error at
capture, at the user's line (coil/capture/meta_checks.py; user report 16)."""
import traceback
import warnings

import pytest
import torch

import coil

I = torch.tensor([0, 1, 0, 2])


@pytest.mark.parametrize("name, fn", [
    ("index_add", lambda t, h: t.index_add(0, I, h)),
    ("index_add_fn", lambda t, h: torch.index_add(t, 0, I, h)),
    ("index_add_", lambda t, h: t.clone().index_add_(0, I, h)),
    ("index_copy", lambda t, h: t.index_copy(0, I, h)),
    ("index_put", lambda t, h: t.index_put((I,), h)),
    ("index_put_", lambda t, h: t.clone().index_put_((I,), h)),
])
def test_dtype_mismatch_raises_eagers_error(name, fn):
    t = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    h = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).bfloat16()
    with pytest.raises(RuntimeError) as ref:
        fn(t, h)
    with pytest.raises(RuntimeError) as got:
        coil.compile(fn)(t, h)
    assert str(got.value) == str(ref.value)
    # same dtypes still compile and match
    torch.testing.assert_close(coil.compile(fn)(t, h.float()), fn(t, h.float()))


def test_error_names_the_user_line():
    def user_fn(t, h):
        y = t.index_add(0, I, h)   # the line
        return y * 2
    with pytest.raises(RuntimeError) as ei:
        coil.compile(user_fn)(torch.randn(4, 8), torch.randn(4, 8).bfloat16())
    text = "".join(traceback.format_exception(ei.value))
    assert "y = t.index_add(0, I, h)   # the line" in text


@pytest.mark.parametrize("idx, value, raises", [
    ("long", (2,), True), ("long", (), True), ("tuple", (2,), True), ("mask", (2,), True),
    ("mask", (), False), ("slice", (2,), False)])
def test_setitem_dtype_mismatch_like_eager(idx, value, raises):
    """``x[idx] = v`` with a tensor index is index_put_ (eager refuses another dtype),
    except a 0-d value with a lone bool mask (a masked fill) and basic slicing (copy_)."""
    index = {"long": torch.tensor([0, 2]), "tuple": (torch.tensor([0, 2]),),
             "mask": torch.tensor([True, False, True, False]), "slice": slice(0, 2)}[idx]
    v = torch.randn(value, generator=torch.Generator().manual_seed(2)).double()

    def f(x, v):
        y = x.clone()
        y[index] = v
        return y
    x = torch.randn(4)
    if raises:
        with pytest.raises(RuntimeError, match="Index put requires"):
            f(x, v)
        with pytest.raises(RuntimeError, match="Index put requires"):
            coil.compile(f)(x, v)
    else:
        torch.testing.assert_close(coil.compile(f)(x, v), f(x, v))


def test_checks_run_on_torch_compile_graphs():
    """torch.compile(backend="coil"): torch's capture runs meta kernels only; coil's AOT
    entry runs the same checks on its graph (user report 17)."""
    torch._dynamo.reset()
    try:
        t, h = torch.randn(4, 8), torch.randn(4, 8).bfloat16()
        with pytest.raises(RuntimeError, match="same scalar type"):
            torch.compile(lambda t, h: t.index_add(0, I, h), backend="coil")(t, h)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("name, fn", [
    ("mv", lambda x, y: torch.mv(x, y[0])),
    ("matmul", lambda x, y: torch.matmul(x, y[0].bfloat16())),  # call sequences s409 #145 (its mv)
    ("heaviside", lambda x, y: torch.heaviside(x, y)),
    ("binary_cross_entropy", lambda x, y: torch.nn.functional.binary_cross_entropy(x.sigmoid(), y.sigmoid())),
    ("layer_norm", lambda x, y: torch.nn.functional.layer_norm(x, (3,), y[0])),
    ("nll_loss", lambda x, y: torch.nn.functional.nll_loss(x, torch.tensor([0, 1, 2]), weight=y[0])),
])
def test_mixed_float_dtypes_eager_refuses(name, fn):
    # fake kernels promote float and double; eager's kernels refuse them
    x, y = torch.randn(3, 3), torch.randn(3, 3).double()
    with pytest.raises(RuntimeError) as ref:
        fn(x, y)
    with pytest.raises(RuntimeError) as got:
        coil.compile(fn)(x, y)
    assert str(got.value) == str(ref.value)


def test_mixed_float_dtypes_eager_refuses_under_dynamic_shapes():
    """Call sequences s409 #145 (``dynamic=True``): the probe was skipped for symbolic sizes; it runs at their hints."""
    fn = lambda x, y: torch.matmul(x, y)  # noqa: E731
    x, y = torch.randn(4, 2, 2), torch.tensor([-1.914], dtype=torch.bfloat16).expand(2)
    with pytest.raises(RuntimeError) as ref:
        fn(x, y)
    with pytest.raises(RuntimeError) as got:
        coil.compile(fn, dynamic=True)(x, y)
    assert str(got.value) == str(ref.value)


@pytest.mark.parametrize("loss", ["huber_loss", "soft_margin_loss"])
def test_mixed_float_dtypes_keep_eagers_result_dtype(loss):
    # eager: the input's dtype (float32); the meta kernel promotes to float64
    fn = getattr(torch.nn.functional, loss)
    x, y = torch.randn(3, 3), torch.randn(3, 3).double()
    ref, got = fn(x, y), coil.compile(fn)(x, y)
    assert got.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("fn", [
    lambda x: x.softmax(3), lambda x: torch.softmax(x, -2), lambda x: torch.nn.functional.softmin(x, 3),
    lambda x: x.sort(3), lambda x: torch.sort(x, dim=2, stable=True),
])
def test_dim_out_of_range_raises_eagers_index_error(fn):
    # the meta kernels accept the dim; the backend failed (BackendCompilerFailed, no user line)
    x = torch.randn(3)
    with pytest.raises(IndexError) as ref:
        fn(x)
    with pytest.raises(IndexError) as got:
        coil.compile(fn)(x)
    assert str(got.value) == str(ref.value)
    assert any(f.filename == __file__ for f in traceback.extract_tb(got.value.__traceback__)[1:])


@pytest.mark.parametrize("fn", [
    lambda x, i: x.index_select(0, i) * 1, lambda x, i: x.index_add(0, i, x), lambda x, i: x.index_fill(0, i, 1.0),
    lambda x, i: x.index_copy(0, i, x), lambda x, i: x.index_put((i,), x), lambda x, i: x.clone().put_(i, x),
])
def test_float_index_raises_eagers_error_at_capture(fn):
    # the meta kernels accept a float index: code generation failed (a warning), the FX fallback raised without
    # the user's line
    x, i = torch.randn(3), torch.tensor([0.0, 1.0, 2.0])
    with pytest.raises((RuntimeError, IndexError)) as ref:
        fn(x, i)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(type(ref.value)) as got:
            coil.compile(fn)(x, i)
    assert str(got.value) == str(ref.value)
    assert any(f.filename == __file__ for f in traceback.extract_tb(got.value.__traceback__)[1:])
