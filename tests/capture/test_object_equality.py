"""``==`` / ``!=`` on traced Python objects whose class has its own ``__eq__`` (numpy
scalars, Decimal, a user class defining only ``__eq__``) and on dicts holding them, and a
TorchScript module called from a compiled function. Found by new-user trial 50: with
transformers' Reformer, ``64 % np.lcm(8, 8) != 0`` was True under coil (identity compare),
so the input was padded to 72 tokens and the model raised; ``np.int64(0) == 0`` was False."""
import collections
import decimal
import warnings

import numpy as np
import torch

import coil


class _P:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, _P) and self.v == other.v

    __hash__ = None


def _both(fn, *args):
    coil.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = coil.compile(fn)(*args)
    return got, fn(*args)


def test_numpy_scalar_eq_ne_use_numpy_eq():
    def f(x):
        a = np.int64(0)
        return x + 1, a != 0, a == 0, 0 != a, a == np.int64(0), np.float32(1.0) == 1.0, decimal.Decimal(1) == 1

    got, ref = _both(f, torch.zeros(2))
    assert [bool(v) for v in got[1:]] == [bool(v) for v in ref[1:]] == [False, True, False, True, True, True]


def test_numpy_lcm_padding_check_as_in_reformer():
    def f(x):
        n = np.lcm(8, 8)
        if x.shape[-1] % n != 0 and x.shape[-1] > 4:
            return x + 1
        return x - 1

    got, ref = _both(f, torch.zeros(2, 64))
    torch.testing.assert_close(got, ref)


def test_ne_of_a_class_defining_only_eq_negates_its_eq():
    def f(x, p):
        return x + 1, p != _P(1), p != _P(2), p == _P(1)

    got, ref = _both(f, torch.zeros(1), _P(1))
    assert got[1:] == ref[1:] == (False, True, True)


def test_dicts_compare_by_value():
    def f(x, n):
        t = x + 1
        od = collections.OrderedDict
        return (x, {"a": t} == {"a": t}, {"k": n, "j": 1} == {"j": 1, "k": 3},
                od(k=n, j=1) == od(j=1, k=3), {"k": n} != {"k": 4})

    got, ref = _both(f, torch.zeros(2), np.int64(3))
    assert [bool(v) for v in got[1:]] == [bool(v) for v in ref[1:]] == [True, True, False, True]


def test_script_module_called_from_compiled_function():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.lin(x))

    sm = torch.jit.script(M())

    def f(x):
        return sm(x) * 2

    x = torch.randn(3, 4)
    got, ref = _both(f, x)   # raised AttributeError: '_CachedForward' object has no attribute '__getattr__'
    torch.testing.assert_close(got, ref)



def test_in_place_result_is_the_tensor_it_wrote():
    # ``y += 1`` and ``x.add_(1)`` return x itself: ``is`` was False under capture (a new node)
    def f(x):
        y = x
        y += 1
        return x is y, x.mul_(2) is x, x.t_() is x, x.clone() is x

    assert coil.compile(f, fullgraph=True)(torch.ones(2, 2)) == (True, True, True, False)
