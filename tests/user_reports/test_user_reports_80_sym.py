"""Regression tests for trial 80 (tests/user_reports/FINDINGS_80.md): symbolic numbers in generated code."""
import math
import warnings

import pytest
import torch

import coil

_SCALARS = {"capture_scalar_outputs": True}


def _mod_of_float(x, s):
    return x + s % 2.0


def test_f1_float_mod_of_a_symfloat_is_read_at_run_time():
    """#1: under ``torch.compile(backend="coil")`` a Python float becomes a SymFloat (automatic dynamic) that AOT reads
    with ``.item()``; ``s % 2.0`` is an extern, and ``x + (s % 2.0)`` made it a kernel constant: the value of the call
    that compiled (its guard, on ``PythonMod(zf, 2.0)``, never held). Such a scalar now runs the op as an extern."""
    torch._dynamo.reset()
    cf, x = torch.compile(_mod_of_float, backend="coil"), torch.zeros(2)
    for s in [2.3, -2.7, 0.5, 3.75]:
        torch.testing.assert_close(cf(x, s), _mod_of_float(x, s))


def test_f1_float_mod_of_a_size():
    def f(x):
        return x + (x.shape[0] * 0.3) % 1.0
    torch._dynamo.reset()
    cf = torch.compile(f, backend="coil")
    for n in [3, 4, 7]:
        x = torch.zeros(n)
        torch.testing.assert_close(cf(x), f(x))


@pytest.mark.parametrize("fn", [lambda x: x - int(x.mean().item()), lambda x: x * int(x.amax().item()),
                                lambda x: x + math.floor(x.sum().item()), lambda x: x + abs(x.sum().long().item())])
def test_f4_f7_int_of_an_item_in_a_kernel(fn):
    """#4: ``x - int(x.mean().item())``: the kernel reading ``ps0 = trunc(zf0)`` was fused into the reduction kernel
    computing the mean, before the wrapper bound ``ps0`` (UnboundLocalError). A precomputed symbol now counts as a
    read of the extern binding the symbols it is computed from. #7: ``abs()`` of an int ``.item()`` could not be
    printed (the graph ran in the FX interpreter, warned)."""
    x = torch.tensor([1.5, 2.25, -0.5, 3.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = coil.compile(fn, options=_SCALARS)(x)
    torch.testing.assert_close(got, fn(x))


@pytest.mark.parametrize("dim", [0, 1])
def test_f5_index_fill_wraps_a_negative_index(dim):
    """#5: eager's ``index_fill`` wraps ``-1`` to the last index; torch's decomposition passed it on to index_copy,
    whose generated bounds check raised."""
    def f(x, i):
        return x.index_fill(dim, i, 0.0), x.clone().index_fill_(dim, i, torch.tensor(9.0))
    x, i = torch.arange(6.0).view(2, 3), torch.tensor([-1, 0])
    torch.testing.assert_close(coil.compile(f)(x, i), f(x, i))
