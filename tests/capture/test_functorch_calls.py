"""A compiled function called inside a torch.func transform (vmap, grad) runs eagerly with a
warning: capture used to take the transform's batched tensor for a plain one and returned a
FakeTensor from ``vmap(coil.compile(f))``."""
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
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = torch.vmap(coil.compile(_f))(x)
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
