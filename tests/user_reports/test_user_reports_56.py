"""Regressions from new-user trial 56 (FINDINGS_56.md): rarely compiled torch.nn modules and functionals,
torch.distributions, in-place writes to views and buffers, integer / low-precision dtype edge cases, empty and
0-d tensors.

The xfail(strict=True) tests are open bugs: each fails today and starts passing (so must lose its mark) once fixed.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


from report_helpers import run_warned as _run


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


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed): writes through obj.__dict__ of an object made in the frame were dropped (silent wrong value)
# ---------------------------------------------------------------------------------------------------------------

class _Plain:
    pass


def test_instance_dict_writes_of_an_object_made_in_the_frame(coil_reset):
    def f(x):
        o = _Plain()
        o.a = x
        o.__dict__["a"] = x * 2
        o.__dict__.update(b=x * 3)
        return o.a + o.b, o

    x = torch.randn(3)
    (out, o), warned = _run(f, x)
    torch.testing.assert_close(out, x * 5)
    torch.testing.assert_close(o.b, x * 3)
    assert not warned


def test_vars_of_an_object_made_in_the_frame(coil_reset):
    def f(x):
        o = _Plain()
        vars(o)["a"] = x * 2
        return o.a + 1

    x = torch.randn(3)
    out, warned = _run(f, x)
    torch.testing.assert_close(out, x * 2 + 1)
    assert not warned and coil.capture.stats["graph_breaks"] == 0


# ---------------------------------------------------------------------------------------------------------------
# Finding 5 (fixed): a Python descriptor (torch.distributions' lazy_property) read on an object made in the frame was a
# graph break, and torch.distributions' Python functions became graph nodes (a break on a distribution argument)
# ---------------------------------------------------------------------------------------------------------------

class _Cached:
    def __init__(self, f):
        self.f = f

    def __get__(self, obj, cls):
        if obj is None:
            return self
        obj.__dict__[self.f.__name__] = v = self.f(obj)
        return v


class _WithCached:
    def __init__(self, x):
        self.x, self.calls = x, 0

    @_Cached
    def sq(self):
        self.calls += 1
        return self.x ** 2


def test_python_descriptor_on_an_object_made_in_the_frame(coil_reset):
    def f(x):
        o = _WithCached(x)
        return o.sq + o.sq, o

    x = torch.randn(3)
    (out, o), warned = _run(f, x)
    torch.testing.assert_close(out, 2 * x ** 2)
    assert o.calls == 1 and "sq" in o.__dict__
    assert coil.capture.stats["graph_breaks"] == 0 and not warned


def test_categorical_probs_and_entropy_are_one_graph(coil_reset):
    D = torch.distributions

    def f(logits, a):
        d = D.Categorical(logits=logits, validate_args=False)
        b = D.Bernoulli(logits=logits, validate_args=False)
        return d.log_prob(a), d.entropy(), d.probs, b.probs

    logits, a = torch.randn(2, 4), torch.tensor([1, 3])
    out, warned = _run(f, logits, a)
    for o, r in zip(out, f(logits, a)):
        torch.testing.assert_close(o, r)
    assert coil.capture.stats["graph_breaks"] == 0 and coil.capture.stats["graphs"] == 1


# ---------------------------------------------------------------------------------------------------------------
# Finding 6 (fixed): with fallback_random, fusion reordered eager's random draws (bernoulli then dropout drew in the
# other order: both tensors differed from eager's for the same seed; silent)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_fallback_random_keeps_the_order_of_random_draws(coil_reset, backend):
    def f(x):
        return torch.bernoulli(x.sigmoid()), F.dropout(x, 0.5), torch.rand_like(x)

    x = torch.randn(4, 8)
    torch.manual_seed(0)
    ref = f(x)
    torch.manual_seed(0)
    out, _ = _run(f, x, fallback_random=True, cpu_backend=backend)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# Open (strict xfail)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.xfail(strict=True, reason="finding 7: distribution argument validation (`if not torch._is_all_true(valid): "
                                       "raise ValueError`) is a data-dependent graph break")
def test_distribution_with_default_validation_is_one_graph(coil_reset):
    D = torch.distributions
    saved = D.Distribution._validate_args
    D.Distribution.set_default_validate_args(True)   # torch.compile turns it off for the whole process
    try:
        f = lambda loc, x: D.Normal(loc, 1.0).log_prob(x)  # noqa: E731
        loc, x = torch.randn(3), torch.randn(3)
        out, _ = _run(f, loc, x)
        torch.testing.assert_close(out, f(loc, x))
        assert coil.capture.stats["graph_breaks"] == 0
    finally:
        D.Distribution.set_default_validate_args(saved)


def test_namedtuple_make_is_one_graph(coil_reset):
    import collections
    P = collections.namedtuple("P", "x y")
    f = lambda x: P._make([x, 2]).x * 2  # noqa: E731
    x = torch.randn(3)
    out, _ = _run(f, x)
    torch.testing.assert_close(out, x * 2)
    assert coil.capture.stats["graph_breaks"] == 0


def test_namedtuple_make_of_a_wrong_count_raises_eagers_error(coil_reset):
    """finding 8: ``_make`` of too few items raises namedtuple's own TypeError, as eager does."""
    import collections
    P = collections.namedtuple("P", "x y")
    cf = coil.compile(lambda x: P._make([x]).x * 2)
    with pytest.raises(TypeError, match="Expected 2 arguments, got 1"):
        cf(torch.randn(3))
