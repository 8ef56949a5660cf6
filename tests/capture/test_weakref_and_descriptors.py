"""Calling a ``weakref.ref`` and ``func.__get__(obj, cls)`` inside a compiled frame.

torch's ``LRScheduler`` wraps ``optimizer.step`` in ``wrapper`` whose body is ``opt = opt_ref(); opt._opt_called =
True; return func.__get__(opt, opt.__class__)(*args, **kwargs)``: both the weakref call ("call to a ReferenceType
object") and ``func.__get__`` ("function attribute __get__") were graph breaks."""
import functools
import weakref

import torch

import coil
from coil.capture.frame import stats


class Scaler:
    def __init__(self, k):
        self.k = k
        self.calls = 0

    def scale(self, x):
        self.calls += 1
        return x * self.k


def _wrap(obj):
    ref = weakref.ref(obj)
    func = type(obj).scale

    @functools.wraps(func)
    def wrapper(*args):
        o = ref()
        o.called = True
        return func.__get__(o, o.__class__)(*args)
    return wrapper


def test_weakref_call_and_function_get_are_traced():
    s = Scaler(3.0)
    w = _wrap(s)

    def f(x):
        return w(x.sin()) + 1
    coil.reset()
    c = coil.compile(f, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(c(x), x.sin() * 3.0 + 1)
    assert s.called is True and s.calls == 1
    s.k = 5.0                                  # the referent's attributes are guarded as any input's
    torch.testing.assert_close(c(x), x.sin() * 5.0 + 1)
    assert s.calls == 2 and stats["graph_breaks"] == 0


def test_weakref_to_a_dead_object_is_none():
    class Box:
        pass
    b = Box()
    r = weakref.ref(b)
    del b

    def f(x):
        return x + (1 if r() is None else 2)
    coil.reset()
    torch.testing.assert_close(coil.compile(f, fullgraph=True)(torch.zeros(2)), torch.ones(2))


def test_function_get_with_none_is_the_function():
    def add(a, b):
        return a + b

    def f(x):
        return add.__get__(None, int)(x, 1), add.__get__(x)(2)
    coil.reset()
    x = torch.randn(3)
    got = coil.compile(f, fullgraph=True)(x)
    torch.testing.assert_close(got[0], x + 1)
    torch.testing.assert_close(got[1], x + 2)
