"""coil's warnings point at the user's code: the Python warning's file and line are the user's call (not coil's own
files), and the capture-fallback message names the user's function (``Outer.forward``, not coil's generated
``Outer_call_<id>`` frame) and the user's line where capture stopped."""
import warnings

import pytest
import torch

import coil
from coil.capture import frame


def _coil_warnings(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn()
    return [m for m in w if str(m.message).startswith("coil")]


class Inner(torch.nn.Module):
    def forward(self, x):
        return x * self.scale if x.shape[0] > 3 else x   # the attribute is missing on the rare path


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x).relu()


def test_capture_fallback_names_the_module_forward_and_the_line_where_capture_stopped():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with pytest.raises(AttributeError):
            coil.compile(Outer())(torch.randn(5, 4))
    [m] = [m for m in w if "could not capture" in str(m.message)]
    line = Inner.forward.__code__.co_firstlineno + 1
    assert f"could not capture Outer.forward (capture stopped at {__file__}:{line})" in str(m.message)
    assert m.filename == __file__ and "_call_" not in str(m.message)


def test_codegen_fallback_and_vmap_warnings_point_at_the_users_call(monkeypatch):
    import coil.codegen

    def fail(*a, **k):
        raise RuntimeError("no kernels today")

    monkeypatch.setattr(coil.codegen, "compile_aten_graph", fail)
    g = coil.compile(lambda x: x.cos() + 1)
    [m] = _coil_warnings(lambda: g(torch.randn(3)))
    assert "code generation failed" in str(m.message) and m.filename == __file__
    monkeypatch.setattr(frame, "_functorch_warned", [])
    [m] = _coil_warnings(lambda: torch.vmap(coil.compile(lambda x: x.sin()))(torch.randn(3, 4)))
    assert "torch.func transform" in str(m.message) and m.filename == __file__
