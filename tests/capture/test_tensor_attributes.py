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


def test_is_set_to_matches_eager():
    # FINDINGS_76 #1: the fake tensors' meta kernel says False, so a static compile took the other branch
    # (and under dynamic shapes it broke the graph); two inputs' aliasing is not guarded: that case breaks
    def f(x):
        return x * 2 if x.is_set_to(x) else x * 3

    def g(x, y):
        return x * 2 if x.is_set_to(y) else x * 3

    def views(x):
        y = x + 1
        return y.is_set_to(y), x.is_set_to(x.view(-1)), x.is_set_to(x.view(3, 1)), x[1:].is_set_to(x[1:]), y.is_set_to(x)

    a, b = torch.ones(3), torch.ones(3)
    for dynamic in (None, True):
        torch.testing.assert_close(coil.compile(f, dynamic=dynamic)(a), f(a))
        assert coil.compile(views, dynamic=dynamic)(a) == views(a)
        fast = coil.compile(g, dynamic=dynamic)
        for x, y in ((a, a), (a, b), (a, a.view(-1)), (a, a[1:]), (a, a)):
            torch.testing.assert_close(fast(x, y), g(x, y))


def test_storage_offset_after_a_slice_of_symbolic_length():
    # FINDINGS_76 #4: the offset guards read an input symbol's value as a tensor (AttributeError: the frame ran
    # eagerly); a symbolic offset (a slice from a symbolic start) left the inputs' static offsets unguarded
    def f(x):
        x.narrow(-1, 0, x.shape[-1] // 2)
        return x * x.storage_offset()

    def g(x):
        v = x[:, x.shape[-1] // 2:]
        return v * v.storage_offset(), v.storage_offset()

    base = torch.randn(40)
    for fn in (f, g):
        for dynamic in (True, None):
            fast = coil.compile(fn, dynamic=dynamic, fullgraph=True)
            for x in (torch.randn(4, 6), torch.randn(4, 8), base[2:26].view(4, 6), base[3:35].view(4, 8)):
                torch.testing.assert_close(fast(x), fn(x))


def test_version_of_an_intermediate():
    # FINDINGS_76 #6: _version broke the graph and read the fresh counter of the tensor the graph returned (0, eager 2);
    # an intermediate's fake counts the in-place ops (a view's shares its base's)
    def f(x):
        y = x * 1
        y.mul_(2)
        y.add_(1)
        z = y[1:]
        z.mul_(2)
        y[0] = 3
        torch.add(x, 1, out=y)
        return y._version, z._version, y.view(-1)._version, (x + 1)._version, torch.tensor(float(y._version))

    x = torch.randn(3)
    assert coil.compile(f, fullgraph=True)(x) == f(x)
