"""``with torch.inference_mode(False):`` in a forward that runs outside inference mode changes nothing, but it was a
graph break, and the resume function (which gets the context object on its stack) then ran eagerly as a whole."""
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
