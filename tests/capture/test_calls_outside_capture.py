"""Calls that run outside capture, and say so: a compiled function called inside a torch.func
transform (vmap, grad) runs eagerly with a warning (capture used to take the transform's
batched tensor for a plain one and returned a FakeTensor from ``vmap(coil.compile(f))``), and a
``torch.compiler.disable`` helper is named in a fullgraph error."""
import warnings

import torch

import coil
from coil.capture import frame


def _f(r):
    return r.cos() * 2


def test_vmap_of_a_compiled_function_matches_eager_and_warns(monkeypatch):
    monkeypatch.setattr(frame, "_functorch_warned", [])
    coil.reset()
    x = torch.randn(3, 4)
    cf = coil.compile(_f)
    torch.testing.assert_close(cf(x[0]), _f(x[0]))  # an entry for the per-sample shape exists
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = torch.vmap(cf)(x)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, torch.vmap(_f)(x))
    assert any("torch.func transform" in str(m.message) for m in w)


def test_grad_of_a_compiled_function_and_compiled_vmap_match_eager():
    coil.reset()
    x = torch.randn(5)
    cf = coil.compile(lambda t: t.sin().sum())
    torch.testing.assert_close(torch.func.grad(cf)(x), x.cos())
    y = torch.randn(2, 3)
    torch.testing.assert_close(coil.compile(torch.vmap(_f))(y), torch.vmap(_f)(y))


def test_fullgraph_error_names_a_torch_compiler_disable_helper():
    """A ``torch.compiler.disable`` helper under ``fullgraph=True``: the error names the helper
    and how it was disabled, not torch's wrapper (``torch._dynamo.eval_frame._fn``)."""
    import pytest

    @torch.compiler.disable
    def my_helper(x):
        return x * 2

    def f(x):
        return my_helper(x) + 1

    coil.reset()
    with pytest.raises(Exception, match=r"my_helper, disabled with torch.compiler.disable"):
        coil.compile(f, fullgraph=True)(torch.randn(3))
    coil.reset()
    x = torch.randn(3)
    torch.testing.assert_close(coil.compile(f)(x), f(x))  # without fullgraph: a graph break


def test_torch_func_transform_inside_the_compiled_function_says_it_runs_eagerly():
    # torch.func.grad(lambda r: ...) broke with "NestedFunctionVariable(<lambda>) is not a compile-time
    # constant"; torch.func.vjp(torch.sin, x) became a graph node FX could not print (SyntaxError: the whole
    # frame fell back to eager)
    def f(x):
        return torch.func.grad(lambda r: r.sin().sum())(x) * 2

    def g(x):
        out, fn = torch.func.vjp(torch.sin, x)
        return fn(torch.ones_like(x))[0] + out

    x = torch.randn(2, 3)
    for fn in (f, g):
        coil.reset()
        torch.testing.assert_close(coil.compile(fn)(x), fn(x))
        reason = str(coil.explain(fn, x))
        assert f"torch.func.{'grad' if fn is f else 'vjp'} of a function made in the compiled frame" in reason


def _loss(r):
    return (r.sin() ** 2).sum()


def test_torch_func_grad_of_a_global_function_breaks_instead_of_falling_back():
    # grad(_loss) (a constant function) was traced into torch._functorch's
    # grad_impl(_loss, ...) as a graph node: FX could not print the function (SyntaxError),
    # and the whole frame -- or the resume frame after a lambda's break -- ran eagerly
    from coil.capture import stats

    def f(x):
        return torch.func.grad(_loss)(x) + 1

    def g(x):
        return torch.func.grad(lambda r: (r.sin() ** 2).sum())(x) * 2

    x = torch.randn(5, 3)
    for fn in (f, g):
        coil.reset()
        torch.testing.assert_close(coil.compile(fn)(x), fn(x))
        assert stats["fallbacks"] == 0 and stats["graphs"] == 1, dict(stats)
