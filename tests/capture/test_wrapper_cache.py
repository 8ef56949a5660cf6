"""The capture wrapper remembers its frame cache between calls (a WeakKeyDictionary
lookup per call cost about 0.5 µs); ``coil.reset()`` must still make the next call
compile again, and a wrapper made before the first compile must find the cache."""
import torch

import coil


def test_reset_makes_the_next_call_compile_again():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x):
        return torch.sin(x) * 2

    x = torch.randn(5)
    cf = coil.compile(f, backend=backend)
    torch.testing.assert_close(cf(x), f(x))
    torch.testing.assert_close(cf(x), f(x))
    assert len(graphs) == 1          # the second call hit the remembered cache
    coil.reset()
    torch.testing.assert_close(cf(x), f(x))
    assert len(graphs) == 2          # the reset dropped it: compiled again
    torch.testing.assert_close(cf(x + 1), f(x + 1))
    assert len(graphs) == 2
    y = torch.randn(3, 2)
    torch.testing.assert_close(cf(y), f(y))  # a guard miss on the remembered cache
    assert len(graphs) == 3
