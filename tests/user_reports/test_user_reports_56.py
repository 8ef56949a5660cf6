"""Regressions from new-user trial 56 (FINDINGS_56.md): rarely compiled torch.nn modules and functionals,
torch.distributions, in-place writes to views and buffers, integer / low-precision dtype edge cases, empty and
0-d tensors.

The xfail(strict=True) tests are open bugs: each fails today and starts passing (so must lose its mark) once fixed.
"""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


def _run(fn, *args, **options):
    """``(compiled result, coil warnings)`` of ``coil.compile(fn, options=options)(*args)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = coil.compile(fn, options=options or None)(*args)
    return out, [str(w.message) for w in caught if "coil" in str(w.message)]


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed): x.new(torch.Size) made a tensor holding the sizes (the graph's tuple read as data)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", ["shape", "size_slice", "constant_size"])
def test_tensor_new_of_a_size_is_a_shape(coil_reset, size):
    def f(x):
        s = {"shape": x.shape, "size_slice": x.size()[1:], "constant_size": torch.Size((2, 5))}[size]
        return x.new(s).fill_(1.0) * 2

    x = torch.randn(3, 4)
    out, warned = _run(f, x)
    ref = f(x)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref)
    assert not warned


def test_tensor_new_of_a_tuple_is_data(coil_reset):
    f = lambda x: x.new((2, 5)) + x.sum()  # noqa: E731 - a plain tuple is the data, as in eager
    x = torch.randn(3, 4)
    torch.testing.assert_close(coil.compile(f)(x), f(x))


def test_multinomial_distribution_sample(coil_reset):
    def f(logits):
        return torch.distributions.Multinomial(5, logits=logits).sample()

    lg = torch.randn(2, 5)
    torch.manual_seed(0)
    ref = f(lg)
    torch.manual_seed(0)
    out, _ = _run(f, lg, fallback_random=True)
    torch.testing.assert_close(out, ref)


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed): objects made in the frame that refer to each other (a cycle) raised RecursionError in capture
# (the frame ran eagerly, warned): torch.distributions.Gumbel (a transform and its inverse), a linked pair
# ---------------------------------------------------------------------------------------------------------------

class _Node:
    def __init__(self, v):
        self.v, self.peer = v, None


def test_gumbel_log_prob_compiles(coil_reset):
    def f(loc, x):
        d = torch.distributions.Gumbel(loc, 2.0, validate_args=False)
        return d.log_prob(x), d

    loc, x = torch.randn(3), torch.randn(3)
    (out, d), warned = _run(f, loc, x)
    torch.testing.assert_close(out, f(loc, x)[0])
    torch.testing.assert_close(d.log_prob(x), out)
    assert not warned and coil.capture.stats["fallbacks"] == 0


def test_objects_made_in_the_frame_referring_to_each_other_are_returned(coil_reset):
    def f(x):
        a, b = _Node(x * 2), _Node(x + 1)
        a.peer, b.peer = b, a
        c = _Node(x)
        c.peer = c
        return a.v + a.peer.peer.v, a, [c]

    x = torch.randn(3)
    (out, a, (c,)), warned = _run(f, x)
    torch.testing.assert_close(out, x * 4)
    assert a.peer.peer is a and c.peer is c
    torch.testing.assert_close(a.peer.v, x + 1)
    assert not warned


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed): a parameter's .detach() passed as an argument and written in place (the parameter read in the
# same frame) raised "a view of a leaf Variable that requires grad is being used in an in-place operation"
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_detached_parameter_written_in_place_beside_the_parameter(coil_reset, backend):
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    w0, x = lin.weight.detach().clone(), torch.randn(2, 3)

    def f(w, x):
        w.add_(1.0)
        return lin(x)

    out = coil.compile(f, backend=backend)(lin.weight.detach(), x)
    torch.testing.assert_close(lin.weight.detach(), w0 + 1)
    torch.testing.assert_close(out, x @ (w0 + 1).t() + lin.bias)
    out.sum().backward()
    torch.testing.assert_close(lin.weight.grad, x.sum(0).expand(3, 3))
