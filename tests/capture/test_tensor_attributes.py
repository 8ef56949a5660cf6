"""Tensor attributes read inside a compiled frame match eager for every call."""
import torch

import coil


def test_is_leaf_of_an_input_that_requires_grad():
    # an input's fake tensor is always a leaf: x.is_leaf was True for a non-leaf input
    # (x = a * 2 with a requiring grad), where eager says False; and not guarded
    def f(x):
        return x * 2 if x.is_leaf else x - 1

    fast = coil.compile(f)
    a = torch.randn(3, requires_grad=True)
    for x in (a, a * 2, torch.randn(3), a + 1, a):
        torch.testing.assert_close(fast(x), f(x))
        assert coil.compile(lambda t: t.is_leaf)(x) is x.is_leaf


def test_storage_offset_of_an_input_view():
    # x.storage_offset() was the offset of the call that compiled (no guard): a view of
    # the same shape at another offset returned the old value
    base = torch.randn(10)

    def f(x):
        return x.storage_offset(), x[1:].storage_offset(), x * 2

    fast = coil.compile(f)
    for x in (base[2:6], base[0:4], base[5:9]):
        e, c = f(x), fast(x)
        assert c[:2] == e[:2]
        torch.testing.assert_close(c[2], e[2])
