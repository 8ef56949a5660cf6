"""``torch.inference_mode`` blocks in compiled code. ``with torch.inference_mode(False):`` in a forward that runs
outside inference mode changes nothing, but it was a graph break, and the resume function (which gets the context
object on its stack) then ran eagerly as a whole. A ``torch.inference_mode()`` block is traced like ``no_grad``."""
import pytest
import torch

import coil
from coil.capture.frame import stats


def test_inference_mode_false_outside_inference_mode_is_traced():
    lin = torch.nn.Linear(4, 4)

    def f(x, train: bool):
        h = lin(x)
        with torch.set_grad_enabled(train):
            y = h.relu()
        with torch.inference_mode(False):
            y = y * 2
        return y, y.requires_grad
    coil.reset()
    c = coil.compile(f)
    x = torch.randn(3, 4)
    for train in (True, False):
        got, want = c(x, train), f(x, train)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1]
    assert stats["graph_breaks"] == 0 and stats["fallbacks"] == 0


def test_inference_mode_false_inside_inference_mode_still_matches_eager():
    def g(x):
        with torch.inference_mode(False):
            z = x.sin() + 1
        return z * 2
    coil.reset()
    with torch.inference_mode():
        x = torch.randn(3)
        torch.testing.assert_close(coil.compile(g)(x), g(x))


def _warned_eager(fn, *args):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, any("runs eagerly" in str(w.message) for w in caught)


def test_inference_mode_block_is_captured_with_eagers_inference_tensors():
    """A ``torch.inference_mode()`` block is traced like ``no_grad``; the tensors it makes that leave the graph are
    inference tensors as in eager (copied at the entry), views of them or uses eager refuses run the frame eagerly."""
    w = torch.randn(3, 3, requires_grad=True)

    def f(x):
        with torch.inference_mode():
            y = x @ w
            v = x.view(-1)           # a view of a normal tensor: a normal tensor in eager
            flag = torch.is_inference_mode_enabled() and y.is_inference() and not v.is_inference()
        return y, y, y * 2, v, flag, torch.is_inference_mode_enabled()

    @torch.inference_mode()
    def g(x):
        return x.sin()

    coil.reset()
    x = torch.randn(2, 3)
    for fn in (f, lambda x: (g(x), x.cos())):
        got, want = coil.compile(fn)(x), fn(x)
        for a, b in zip(got, want):
            if isinstance(b, torch.Tensor):
                torch.testing.assert_close(a, b)
                assert (a.is_inference(), a.requires_grad) == (b.is_inference(), b.requires_grad)
            else:
                assert a == b
    out = coil.compile(f)(x)
    assert out[0] is out[1]
    assert stats["graph_breaks"] == 0 and stats["fallbacks"] == 0, stats

    def saved(x):                       # eager raises: an inference tensor saved for backward
        with torch.inference_mode():
            y = x * 2
        return y * w

    def in_place(x):                    # eager raises: in-place on an inference tensor outside the block
        with torch.inference_mode():
            y = x * 2
        return y.add_(1)

    def a_view(x):
        with torch.inference_mode():
            y = x * 2
        return y[0]

    for fn in (saved, in_place):
        with pytest.raises(RuntimeError, match="[Ii]nference"):
            _warned_eager(coil.compile(fn), x)
    got, eager = _warned_eager(coil.compile(a_view), x)
    assert eager and got.is_inference() and torch.equal(got, x[0] * 2)
