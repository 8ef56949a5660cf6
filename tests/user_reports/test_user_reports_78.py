"""Regression tests for trial 78 (tests/user_reports/FINDINGS_78.md)."""
import importlib
import sys

import numpy as np
import pytest
import torch

import coil
from coil.testing import CompileCounter


def _package(tmp_path, name):
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import torch\n"
        "def f(x):\n"
        "    from . import helpers\n"          # a submodule not imported yet: eager's import loads it
        "    from .consts import SCALE\n"      # a relative import of a name
        "    return helpers.g(x) * SCALE + 1\n")
    (pkg / "helpers.py").write_text("import torch\ndef g(x):\n    return torch.sin(x) * 2\n")
    (pkg / "consts.py").write_text("SCALE = 3.0\n")
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def test_f1_relative_import_in_the_frame_compiles_the_rest(tmp_path):
    """``from . import helpers`` broke the graph ("relative import inside the frame") and nothing after it was
    compiled, on every call (transformers 5.25's output-capturing hooks do this on a model's first call). Now a
    relative import resolves like an absolute one; a submodule not imported yet is a break that runs the import alone
    and compiles the rest of the frame."""
    pkg = _package(tmp_path, "coil_t78_pkg")
    x = torch.randn(8)
    counter = CompileCounter()
    cf = coil.compile(pkg.f, backend=counter)
    for _ in range(3):
        torch.testing.assert_close(cf(x), torch.sin(x) * 6 + 1)
    assert counter.frame_count == 1, counter.frame_count
    ex = coil.explain(pkg.f, x)     # (helpers is imported now: one graph, no break)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex


_INFERENCE_CASES = {
    "expand_contiguous": lambda x, w: x + (w * 1).expand(3, 4).contiguous(),
    "expand_reshape": lambda x, w: x.reshape(-1) + (w * 1).expand(3, 4).reshape(-1),
    "expand_as_contiguous": lambda x, w: x[:1].expand_as(x).contiguous() * 2,
    "broadcast_to_contiguous": lambda x, w: torch.broadcast_to(x.sum(0), (3, 4)).contiguous() + 1,
    "expand_mm": lambda x, w: x.sum(0, keepdim=True).expand(3, 4).contiguous() @ x.t(),
    "as_strided_contiguous": lambda x, w: (x * 1).as_strided((2, 2), (1, 1)).contiguous(),
    "expand_t_contiguous": lambda x, w: (w[:2] * 1).expand(2, 2).t().contiguous() + x[:2, :2],
}


@pytest.mark.parametrize("case", sorted(_INFERENCE_CASES))
def test_f2_contiguous_of_an_expand_under_inference_mode_is_a_copy(case):
    """Under ``torch.inference_mode()`` ``contiguous()`` / ``reshape`` reach AOT's functionalization undecomposed, and
    their schema says the result may alias: an expand's copy was taken for a view of the unexpanded tensor and
    rebuilt with ``as_strided``, reading past its end (MPNet's position bias, NaN logits in batch rows 1..)."""
    fn = _INFERENCE_CASES[case]
    torch.manual_seed(0)
    x, w = torch.randn(3, 4), torch.randn(4)
    for ctx in (torch.no_grad, torch.inference_mode):
        coil.reset()
        with ctx():
            want = fn(x, w)
            got = coil.compile(fn)(x, w)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride(), (ctx.__name__, got.stride(), want.stride())


def test_f6_a_frame_that_only_forwards_to_library_code_reports_the_break():
    """``coil.compile(torch.func.vmap(f))`` compiled nothing and said nothing: the top frame (torch's transform
    wrapper) forwards its break to library code, which runs eagerly, and a forwarding frame counted as no break. Only a
    callee captured on its own frame makes a forwarding frame no break; also ``yield from`` (FINDINGS_77 #7)."""
    from torch.func import grad, vmap

    def body(r):
        return (r * 2).sin().sum()

    x = torch.randn(3, 4)
    for fn in (vmap(body), grad(lambda r: body(r[0]))):
        ex = coil.explain(fn, x)
        assert ex.graph_count == 0 and ex.graph_break_count == 1, ex
        torch.testing.assert_close(coil.compile(fn)(x), fn(x))

    def gen_frame(t):
        def gen():
            yield from (t * i for i in range(3))
        return list(gen())
    ex = coil.explain(gen_frame, x)
    assert ex.graph_break_count == 1 and "GET_YIELD_FROM_ITER" in ex.break_reasons[0]["reason"], ex

    class Wrapper(torch.nn.Module):      # a module's call frame still forwards to a captured forward: no break
        def forward(self, t):
            return body(t)
    ex = coil.explain(Wrapper(), x)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex


LCM = np.lcm(4, 2)      # numpy.int64, as transformers' Reformer computes its chunk length
FLAG = np.bool_(True)


def _numpy_scalars(x):
    if x.shape[-1] % LCM != 0 and FLAG:     # a numpy int64 in Python arithmetic, a numpy bool in an ``if``
        x = torch.nn.functional.pad(x, (0, 1))
    return x.sin() * LCM, torch.full((2,), LCM)


def test_f5_numpy_scalar_globals_are_constants():
    """A numpy scalar read from a global or an attribute was an opaque object: arithmetic and ``bool()`` on it were
    graph breaks (3 in the repro; Reformer broke on every call). It is a constant now, guarded by type and value, as a
    numpy scalar computed in the frame already was."""
    global LCM
    for x in (torch.randn(3, 8), torch.randn(3, 7)):
        ex = coil.explain(_numpy_scalars, x)
        assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex
        for got, want in zip(coil.compile(_numpy_scalars)(x), _numpy_scalars(x)):
            torch.testing.assert_close(got, want)
            assert got.dtype == want.dtype
    old, LCM = LCM, np.int64(3)      # a changed value recompiles
    try:
        x = torch.randn(3, 8)
        torch.testing.assert_close(coil.compile(_numpy_scalars)(x)[0], _numpy_scalars(x)[0])
    finally:
        LCM = old


def _h(a, b):
    return a * 10 + b


class _Shift(torch.nn.Module):
    """I-BERT's ``IntLayerNorm.set_shift``: an ``int()`` of a tensor inside a call's arguments inside ``no_grad``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.zeros(()))
        self.log = []

    def forward(self, y):
        with torch.no_grad():
            s = y.abs().sum(-1).sqrt().log2().ceil().max()
            old = self.shift
            self.shift = torch.max(self.shift, s)
            self.log.append(f"shift {int(old)} -> {int(self.shift)}")
        return y * 2


def _pending_calls(x, k):
    try:
        with torch.no_grad():
            y = x * 2
            z = _h(k, max(_h(2, int(y.sum() > 0)), float(y.amax())))    # two pending calls below the break
    finally:
        k += 1
    return y + z + k


def test_f4_break_under_a_pending_call_inside_a_with_block_is_captured():
    """A graph break inside a call's arguments inside a ``with``/``try`` block made the whole frame run eagerly
    ("a pending call below it"): the trampoline could not pass the pending call's NULL on. The NULLs are consumed now
    (``resume._pack_stack``) and the frame is captured around the break."""
    for _ in range(3):
        x = torch.randn(5)
        ex = coil.explain(_pending_calls, x, 3)
        assert ex.graph_count == 3 and not ex.eager_frames, ex     # int() and float() break
        torch.testing.assert_close(coil.compile(_pending_calls)(x, 3), _pending_calls(x, 3))
    m, ref = _Shift(), _Shift()
    cm = coil.compile(m)
    for _ in range(3):
        y = torch.randn(4, 8) * 10
        torch.testing.assert_close(cm(y), ref(y))
        assert m.log == ref.log and torch.equal(m.shift, ref.shift)
    assert not coil.explain(_Shift(), y).eager_frames
