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


def test_float_mod_and_floordiv_of_a_dynamic_float_match_python():
    """``k % 2.0`` once the float ``k`` became a graph input returned the value of the call
    that made it dynamic for every later ``k`` (the lowering baked the hint), and ``k // 0.7``
    was ``floor(k / 0.7)`` (-5.0 at k = -3.5, where Python's divmod gives -6.0): both are now
    computed in Python at a graph break."""
    cases = [(lambda x, k: x * (k % 2.0), [1.25, -1.25, 2.5, 3.75, 0.5]),
             (lambda x, k: x * ((-k) % 3.0), [1.5, 2.5, -1.5, -3.5]),
             (lambda x, k: x * (k // 0.7), [1.5, 2.5, -1.5, -3.5])]
    x = torch.ones(2)
    for f, ks in cases:
        coil.reset()
        cf = coil.compile(f)
        for k in ks:
            torch.testing.assert_close(cf(x, k), f(x, k))
