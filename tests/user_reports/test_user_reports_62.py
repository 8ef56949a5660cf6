"""Regressions from new-user trial 62 (FINDINGS_62.md): training steps with optimizers, clipping and CPU autocast;
in-place ops on views, indexing writes, integer / bool dtypes and Python-scalar promotion; ``dynamic=True`` over
several sizes; graph breaks in training.
"""

import warnings

import pytest
import torch

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; silent wrong values): an integer tensor floor-divided (or ``%``, ``fmod``, ``div(...,
# rounding_mode=...)``) by a Python int that changed between calls, so became a symbolic graph input, returned zeros
# when the int was 0 (eager raises ``RuntimeError: ZeroDivisionError``); so did a constant divisor that is 0 in the
# tensor's dtype (int8 ``x // 256``: eager casts the number to int8 first). aot's zero-division check now covers
# symbolic divisors and divisors that are 0 after the cast, as a tensor of the result's shape (an empty result passes,
# as eager's).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", [lambda x, s: x // s, lambda x, s: x % s, lambda x, s: torch.fmod(x, s),
                                lambda x, s: torch.div(x, s, rounding_mode="trunc")])
def test_int_division_by_symbolic_zero(coil_reset, op):
    cf = coil.compile(op)
    x = torch.tensor([50, -7, 100])
    for s in (3, 5, 7):                       # the second size makes ``s`` a graph input
        torch.testing.assert_close(cf(x, s), op(x, s))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(x, 0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        cf(x, 0)
    torch.testing.assert_close(cf(x[:0], 0), op(x[:0], 0))     # nothing to divide: no error


def test_int8_division_by_number_that_wraps_to_zero(coil_reset):
    x = torch.tensor([50, -7, 100], dtype=torch.int8)
    for f in (lambda x: x // 256, lambda x: torch.div(x, 512, rounding_mode="trunc")):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            f(x)
        coil.reset()
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            coil.compile(f)(x)
    torch.testing.assert_close(coil.compile(lambda x: x // 259)(x), x // 259)     # 259 is 3 in int8


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; silent value where eager raises): ``index_copy`` / ``index_copy_`` with a negative index wrote the
# row counted from the end; eager raises IndexError ("index -1 is out of bounds"). torch's decomposition goes through
# ``index_put``, which wraps negative indices; coil now decomposes it as a ``scatter`` of the source at the index
# expanded along ``dim`` (as it already did ``index_add`` with ``scatter_add``), whose bounds check rejects it.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("inplace", [False, True])
def test_index_copy_negative_index_raises(coil_reset, inplace):
    def f(x, i, s):
        return x.index_copy_(0, i, s) if inplace else x.index_copy(0, i, s)

    x, s = torch.zeros(5, 3), torch.ones(2, 3)
    with pytest.raises(IndexError):
        f(x.clone(), torch.tensor([-1, 0]), s)
    cf = coil.compile(f)
    with pytest.raises(IndexError):
        cf(x.clone(), torch.tensor([-1, 0]), s)
    for i in ([4, 0], [1, 3]):
        torch.testing.assert_close(cf(x.clone(), torch.tensor(i), s), f(x.clone(), torch.tensor(i), s))


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed; silent wrong values under dynamic=True, wrong strides always): an intermediate written in place
# through a transposed view by an op whose out-of-place form returns a contiguous tensor (``masked_fill_``), returned
# with that view. Functionalization's new value of the intermediate is the permute of a contiguous ``where``, so the
# compiled graph returned it in other strides than eager's; the runtime copies such a tensor into eager's strides
# before rebuilding views of it, but skipped that when the strides were symbolic, so under ``dynamic=True`` the view
# ``v`` was taken with eager's strides of memory laid out otherwise (other elements). The intermediate itself
# returned alone kept the wrong strides even statically (``y.view(-1)`` then failed where eager's works).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dynamic", [None, True])
def test_written_intermediate_and_its_view_keep_eager_strides(coil_reset, dynamic):
    def f(x):
        y = x * 1
        v = y.t()
        v.masked_fill_(v > 0.3, -1.0)
        return y, v

    x = torch.randn(4, 3)
    ref, out = f(x), coil.compile(f, dynamic=dynamic)(x)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)
        assert o.stride() == r.stride()
    assert out[1].data_ptr() == out[0].data_ptr()          # still a view of y, as eager's


@pytest.mark.parametrize("dynamic", [None, True])
def test_written_intermediate_returned_alone_keeps_eager_strides(coil_reset, dynamic):
    def f(x):
        y = x * 1
        y.t().masked_fill_(y.t() > 0.3, -1.0)
        return y

    cf = coil.compile(f, dynamic=dynamic)
    for n in (4, 5):
        x = torch.randn(n, 3)
        out, ref = cf(x), f(x)
        torch.testing.assert_close(out, ref)
        assert out.stride() == ref.stride()
        torch.testing.assert_close(out.view(-1), ref.view(-1))


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed; a value where eager raises): a Python number out of an integer tensor's range at an argument eager
# converts to that dtype (``torch.add(x, y, alpha=300)``, ``addcmul(value=300)``, ``threshold(x, 300, 1)`` of int8)
# gave wrapped values; eager raises "value cannot be converted to type int8_t without overflow". aot's check of eager's
# scalar-overflow error (a probe on empty tensors, until now for fp16 / bf16 / fp32 only) covers integer dtypes too.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("f", [lambda x: torch.add(x, x, alpha=300), lambda x: torch.add(x, 3, alpha=300),
                               lambda x: torch.addcmul(x, x, x, value=300), lambda x: torch.threshold(x, 300, 1),
                               lambda x: x.clone().add_(x, alpha=-200)])
def test_int8_scalar_argument_overflow_raises(coil_reset, f):
    x = torch.tensor([50, -7, 100], dtype=torch.int8)
    with pytest.raises(RuntimeError, match="without overflow"):
        f(x)
    with pytest.raises(RuntimeError, match="without overflow"):
        coil.compile(f)(x)


def test_int8_plus_large_number_still_wraps(coil_reset):
    x = torch.tensor([50, -7, 100], dtype=torch.int8)
    f = lambda x: (x + 300, x - 1000, x * 259)       # noqa: E731 - eager wraps these (no conversion check)
    torch.testing.assert_close(coil.compile(f)(x), f(x))


# ---------------------------------------------------------------------------------------------------------------
# Finding 5 (fixed by running the graph eagerly; crash): under ``dynamic=True``, a view (``view(-1)``) of an
# intermediate written through its transpose by ``masked_fill_`` failed to compile with "ValueError: Cannot view a
# tensor with shape [s0, s1] and strides (1, s0)": functionalization's new value of the intermediate has the
# transpose's layout (finding 3), and FakeTensor's view under symbolic sizes checks strides (its static view does
# not, so static compiles work). Such a graph ran eagerly (logged) until trial 76 #0: the intermediate's new value is
# now laid out in its own strides after the write (as eager's in-place op keeps them), and the graph compiles.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("grad", [False, True])
def test_view_of_intermediate_written_through_transpose_dynamic(coil_reset, grad):
    def f(x):
        y = x * 1
        y.t().masked_fill_(y.t() > 0.3, -1.0)
        return y[1:].view(-1) * 2

    x = torch.randn(4, 3, requires_grad=grad)
    x2 = x.detach().clone().requires_grad_(grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = coil.compile(f, dynamic=True)(x2)
    assert not [w for w in caught if "runs eagerly" in str(w.message)]
    ref = f(x)
    torch.testing.assert_close(out, ref)
    if grad:
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)
