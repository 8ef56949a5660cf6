"""``torch.tensor`` of a numpy array computed in the frame from constants (transformers' BigBird builds its random
block plan with numpy, then ``torch.tensor(np.stack(plan), dtype=torch.long)``): the array's values become a constant of
the graph, in the array's dtype unless one is given, with no graph break (torch.compile's count, FINDINGS_68 item 5).
``torch.from_numpy`` shares the array's memory, so it still breaks the graph."""
import numpy as np
import torch

import coil


def test_torch_tensor_of_a_numpy_array_is_a_graph_constant():
    def f(x):
        a = np.stack([np.arange(3), np.arange(3) * 2], axis=0)
        t = torch.tensor(a, device=x.device, dtype=torch.long)
        t += 1  # (a copy: the array keeps its values)
        return x + t, torch.tensor(np.ones(3) / 3), torch.tensor(a.astype(np.float32)), int(a.sum())

    x = torch.randn(2, 3)
    e = coil.explain(f, x)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    for got, want in zip(coil.compile(f)(x), f(x)):
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want)
        else:
            assert got == want


def test_from_numpy_still_breaks_the_graph():
    def f(x):
        a = np.zeros(3, dtype=np.float32)
        t = torch.from_numpy(a)
        t += 1  # writes into a
        return x + t, a.sum()

    x = torch.randn(3)
    assert coil.explain(f, x).graph_break_count >= 1
    got, want = coil.compile(f)(x), f(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] == 3.0
