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


class _Sched:
    def __init__(self):
        self.step, self.lr = 0, None


def test_int_attribute_updated_then_read_after_it_became_an_input():
    """``s.step += 1; s.lr = s.step * 10``: once ``s.step`` is a SymInt input (second call),
    the entry stored ``step + 1`` first and then read ``s.step`` again for ``lr`` and the
    returned value, one update ahead (lr 30 where eager has 20)."""
    def f(s, x):
        s.step += 1
        s.lr = s.step * 10
        return x * 2, s.step

    cf = coil.compile(f)
    se, sc = _Sched(), _Sched()
    for _ in range(4):
        _, re = f(se, torch.ones(1))
        _, rc = cf(sc, torch.ones(1))
        assert (se.step, se.lr, re) == (sc.step, sc.lr, rc)
