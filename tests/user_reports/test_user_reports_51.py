"""Regressions from new-user trial 51 (FINDINGS_51.md): models and programs the authors did not write."""
import functools

import pytest
import torch

import coil

_SCALE = [1.0]


def _scaled(fn):
    @functools.wraps(fn)          # the wrapper claims to be torch.sin (__module__, __name__)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * _SCALE[0]
    return wrapper


_my_sin = _scaled(torch.sin)


def test_user_wrapper_of_a_torch_function_runs_its_python(coil_reset):
    """A functools.wraps wrapper of a torch function was recorded as one opaque graph node: its Python ran only while
    tracing (a global it read was frozen, a call counter stopped counting)."""
    f = coil.compile(lambda x: _my_sin(x) + 1)
    x = torch.ones(2)
    try:
        torch.testing.assert_close(f(x), torch.sin(x) + 1)
        _SCALE[0] = 3.0
        torch.testing.assert_close(f(x), torch.sin(x) * 3 + 1)
    finally:
        _SCALE[0] = 1.0


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "coil"])
def test_func_transform_of_a_torch_function_in_the_graph(backend, coil_reset):
    """``torch.func.jacrev(torch.tanh)`` is a graph node whose target carries torch.tanh's name: FX wrote it into the
    graph's code as ``torch.tanh`` (backend eager: a (3,) result for eager's (3, 3); coil: an IndexError compiling)."""
    x = torch.randn(3)
    f = lambda x: torch.func.jacrev(torch.tanh)(x).diagonal() * 2  # noqa: E731
    g = lambda x: torch.func.jacrev(torch.tanh)(x) + 1  # noqa: E731
    torch.testing.assert_close(coil.compile(f, backend=backend)(x), f(x))
    torch.testing.assert_close(coil.compile(g, backend=backend)(x), g(x))
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(coil.compile(lambda a, b: torch.func.vmap(torch.dot)(a, b), backend=backend)(a, b),
                               torch.func.vmap(torch.dot)(a, b))


def test_default_device_context_is_guarded(coil_reset):
    """A graph traced under ``with torch.device("meta")`` kept making meta tensors outside it (no guard on the default
    device)."""
    f = lambda x: torch.zeros(3) + x.sum()  # noqa: E731
    cf = coil.compile(f)
    x = torch.ones(2, 3)
    with torch.device("meta"):
        assert cf(x).device.type == "meta"
    assert cf(x).device.type == "cpu"
    torch.testing.assert_close(cf(x), f(x))


class _AddOneToSin(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out + 1 if func is torch.sin else out


def test_call_under_a_torch_function_mode_runs_it(coil_reset):
    """A TorchFunctionMode around a compiled call was ignored (the cached graph ran): now the call runs eagerly, warned."""
    f = lambda x: torch.sin(x) * 2  # noqa: E731
    cf = coil.compile(f)
    x = torch.zeros(2)
    cf(x)
    with _AddOneToSin():
        want = f(x)
        with pytest.warns(UserWarning, match="TorchFunctionMode"):
            got = cf(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(cf(x), f(x))


@pytest.mark.parametrize("fn", [lambda x: x + torch.tensor(3, dtype=int), lambda x: x.to(float) * 2,
                                lambda x: x.sum(dtype=int), lambda x: torch.zeros(2, dtype=bool) | (x > 0),
                                lambda x: x.new_zeros(2, dtype=complex) + x])
def test_python_type_as_dtype_is_captured(fn, coil_reset):
    """``dtype=int`` / ``x.to(float)``: FX wrote the class into the graph's code as ``<class 'int'>`` (a SyntaxError),
    so the whole frame ran eagerly (jamba/bamba caches: ``torch.tensor(0, dtype=int)``)."""
    import coil.capture as cc
    cc.reset_stats()
    x = torch.randn(2)
    want, got = fn(x), coil.compile(fn)(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    assert cc.stats["fallbacks"] == 0 and cc.stats["graphs"] == 1


def test_dict_fromkeys_is_captured(coil_reset):
    """``dict.fromkeys`` was a graph break ("call into C function dict.fromkeys"): five per forward of every hybrid
    transformers model (Jamba, Bamba, Zamba2: the linear-attention cache layers)."""
    def f(x, n):
        a, b = dict.fromkeys(range(n)), dict.fromkeys(["p", "q"], False)
        a[0] = x * 2
        b["q"] = True
        return a, b, x + sum(v is None for v in a.values())
    ex = coil.explain(f, torch.ones(2), 3)
    assert ex.graph_break_count == 0
    want, got = f(torch.ones(2), 3), coil.compile(f)(torch.ones(2), 3)
    assert got[1] == want[1] and list(got[0]) == list(want[0]) and got[0][1] is None
    torch.testing.assert_close(got[0][0], want[0][0])
    torch.testing.assert_close(got[2], want[2])


def test_dynamic_index_signs_are_remembered_per_graph(coil_reset, monkeypatch):
    """A kernel's printer asked for the sign of every FloorDiv/Mod numerator of every index afresh under a ShapeEnv
    (bound_sympy each time): Bamba's training recompile with a symbolic length spent 150 of its 225 s there. This
    chunked scan made 1146 bound_sympy calls; remembered for the graph, 17."""
    import torch.nn.functional as F
    import coil.ir.symbols as S
    calls = [0]
    orig = S.bound_sympy

    def counting(*args, **kwargs):
        calls[0] += 1
        return orig(*args, **kwargs)
    monkeypatch.setattr(S, "bound_sympy", counting)

    def f(x, ch=8):
        b, n, h = x.shape
        x = F.pad(x, (0, 0, 0, (ch - n % ch) % ch)).reshape(b, -1, ch, h).permute(0, 3, 1, 2)
        seg = x[..., None].expand(*x.shape, ch)
        s = seg.masked_fill(~torch.tril(torch.ones(ch, ch, dtype=torch.bool), -1), 0).cumsum(-2).exp()
        return (s * x[..., None, :]).sum(-1).permute(0, 2, 3, 1).reshape(b, -1, h)[:, :n]
    x = torch.randn(2, 13, 4)
    torch.testing.assert_close(coil.compile(f, dynamic=True)(x), f(x))
    assert calls[0] < 200
