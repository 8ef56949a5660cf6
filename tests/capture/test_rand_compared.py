"""``torch.rand(...) < c`` whose answer is the same for every draw in [0, 1] is known at capture: LayerDrop's
``torch.rand([]) < self.layerdrop`` at 0.0 (OPT, BART, mBART, Marian, Whisper in training, transformers 5.17) was a
graph break per layer. The draw stays in the graph (the generator advances as in eager); comparisons a draw can
answer either way, or a draw written in place, still break."""
import torch

import coil


class LayerDropStack(torch.nn.Module):
    def __init__(self, layerdrop):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.layerdrop = layerdrop

    def forward(self, x):
        for layer in self.layers:
            if self.training:
                p = torch.rand([])
                if p < self.layerdrop:
                    continue
            x = layer(x).relu()
        return x


def _same_as_eager(fn, *args):
    with coil.config.patch(fallback_random=True):
        coil.reset()
        compiled = coil.compile(fn)
        torch.manual_seed(0)
        got, state = compiled(*args), torch.get_rng_state()
        torch.manual_seed(0)
        want = fn(*args)
        torch.testing.assert_close(got, want)
        assert torch.equal(state, torch.get_rng_state())
    return coil.capture.stats


def test_layerdrop_zero_in_training_is_one_graph():
    torch.manual_seed(1)
    m = LayerDropStack(0.0).train()
    x = torch.randn(4, 8, requires_grad=True)
    stats = _same_as_eager(m, x)
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0
    m(x).sum().backward()


def test_comparisons_known_for_every_draw():
    def f(x):
        if torch.rand([]) < 0:          # never
            x = x - 100
        if 1.5 > torch.rand(2, dtype=torch.float64)[0:1].sum() * 0 + torch.rand([]):
            x = x + 1                    # (a sum of draws is not a draw: this one breaks)
        if torch.rand_like(x[0]) <= 1:  # always
            x = x * 3
        if -0.5 >= torch.rand([]):      # never
            x = x - 7
        return x

    stats = _same_as_eager(f, torch.randn(3))
    assert stats["graph_breaks"] == 1


def test_comparisons_a_draw_can_answer_either_way_break():
    def f(x):
        r = torch.rand([])
        if r < 0.5:                      # either
            x = x + 1
        s = torch.rand([])
        if 0 >= s:                       # s == 0 is possible
            x = x - 1
        t = torch.rand([])
        t.sub_(1)                        # written in place: in [-1, 0)
        if t < 0:
            x = x * 2
        return x

    stats = _same_as_eager(f, torch.randn(3))
    assert stats["graph_breaks"] == 3
