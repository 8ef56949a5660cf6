"""A symbolic size a frame returns means the size at the call: the entry reads it before the
graph runs, since the graph may change the input's sizes in place (``x.t_()``,
``x.unsqueeze_(0)``). Reading it after gave the mutated tensor's sizes in the old order."""
import torch

import coil


def _t(x):
    x.t_()
    return x.shape


def _unsq(x):
    x.unsqueeze_(0)
    return x.size(1), x.size(2), x.shape


def _check(fn, shapes, **kw):
    cf = coil.compile(fn, **kw)
    for shape in shapes:
        a = torch.randn(*shape)
        b = a.clone()
        got, exp = cf(a), fn(b)
        assert got == exp, (shape, got, exp)
        assert a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(a, b)


def test_transpose_in_place_then_shape_dynamic():
    _check(_t, [(3, 4), (5, 2)], dynamic=True)


def test_transpose_in_place_then_shape_automatic_dynamic():
    _check(_t, [(3, 4), (5, 2), (6, 7)])


def test_unsqueeze_in_place_then_sizes_dynamic():
    _check(_unsq, [(3, 4), (5, 2)], dynamic=True)
