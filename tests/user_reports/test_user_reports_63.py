"""Regressions from new-user trial 63 (FINDINGS_63.md): Python generators and iterators across graph breaks, Python
numbers that become graph inputs, ...
"""

import math

import pytest
import torch

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; silent wrong values): a generator object made in traced code, live at a graph break on the stack
# and in a local (``out = [next(g)]`` where ``next`` breaks: here a ``yield from`` in the generator), was rebuilt once
# per use by the entry function (``inner()`` twice), so the resumed frame iterated a fresh generator: the first value
# came twice. ``map`` / ``zip`` / ``enumerate`` objects were rebuilt per use too (``z is w`` was False).
# ---------------------------------------------------------------------------------------------------------------

def test_generator_live_at_graph_break_is_one_object(coil_reset):
    log = []

    def f(x):
        def sub():
            yield x * 0
            yield x * 1

        def inner():
            log.append("inner")
            yield from sub()           # GET_YIELD_FROM_ITER: a graph break at ``next(g)``
            yield x * 5

        g = inner()
        out = [next(g)]
        out += list(g)
        return out

    x = torch.ones(3)
    ref = f(x)
    assert log == ["inner"]
    log.clear()
    out = coil.compile(f)(x)
    assert log == ["inner"]
    assert len(out) == len(ref) == 3
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)


def test_map_object_live_at_graph_break_keeps_identity(coil_reset):
    def h(t):
        print("", end="")              # a graph break inside ``next(z)``
        return t * 2

    def f(x):
        z = map(h, [x, x + 1, x + 2])
        w = z
        out = [next(z)]
        return out, w is z, list(z)

    x = torch.ones(3)
    out, same, rest = coil.compile(f)(x)
    assert same is True
    torch.testing.assert_close(out[0], x * 2)
    assert len(rest) == 2


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; a value where eager raises): an integer tensor raised to a Python int that changed between
# calls (so became a symbolic graph input), then negative: eager raises "Integers to negative integer powers are not
# allowed."; coil returned 0 / 1 / -1. (A constant negative exponent raised already: eager's check runs at trace
# time.) aot now asserts a symbolic exponent of an integer ``pow`` is not negative.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool])
def test_int_pow_by_symbolic_negative_exponent_raises(coil_reset, dtype):
    f = lambda x, v: x ** v                                       # noqa: E731
    cf = coil.compile(f)
    x = torch.arange(-3, 4).to(dtype)
    for v in (2, 3, 0):
        torch.testing.assert_close(cf(x, v), f(x, v))
    with pytest.raises(RuntimeError, match="negative integer powers"):
        f(x, -1)
    with pytest.raises(RuntimeError, match="negative integer powers"):
        cf(x, -1)
    torch.testing.assert_close(cf(x.float(), -1), f(x.float(), -1))   # float bases: no check


def test_int_pow_by_negative_size_expression_raises(coil_reset):
    f = lambda x: x ** (x.shape[0] - 3)                            # noqa: E731
    cf = coil.compile(f, dynamic=True)
    for n in (5, 4, 3):
        torch.testing.assert_close(cf(torch.arange(1, n + 1)), f(torch.arange(1, n + 1)))
    with pytest.raises(RuntimeError, match="negative integer powers"):
        cf(torch.arange(1, 3))


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed; a value where eager raises): a Python int that became a graph input, at an integer op's Scalar
# argument, outside the range eager converts it to (int8 ``add(x, y, alpha=s)`` with ``s`` 300; ``threshold``,
# ``addcmul(value=s)``, ``add_``; ``sub`` checks ``-alpha``): eager raises "value cannot be converted to type int8_t
# without overflow". Trial 62 fixed constant numbers; aot's probe for symbolic numbers learnt float ranges only. It
# now also probes the ranges of int8 / uint8 / int16 / int32 (and their negations) and guards the one eager checks.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, op, values", [
    ("add_alpha", lambda x, v: x.add(1, alpha=v), (1, 2, 127, -128, 128, -129)),
    ("sub_alpha", lambda x, v: x.sub(x, alpha=v), (1, 2, 128, -127, -128, 300)),
    ("uint8_sub", lambda x, v: x.to(torch.uint8).sub(1, alpha=v), (-1, -2, -255, 0, 1, -256)),
    ("uint8_add", lambda x, v: x.to(torch.uint8).add(1, alpha=v), (1, 2, 255, 0, -1, 256)),
    ("threshold", lambda x, v: torch.threshold(x, v, 1), (1, 2, 300)),
    ("addcmul", lambda x, v: torch.addcmul(x, x, x, value=v), (1, 2, 300)),
    ("add_", lambda x, v: x.add_(1, alpha=v), (1, 2, 300)),
    ("int32", lambda x, v: x.int().add(1, alpha=v), (1, 2, 2 ** 31)),
])
def test_int8_symbolic_scalar_argument_overflow_raises(coil_reset, name, op, values):
    cf = coil.compile(op)
    for v in values:
        x = torch.arange(-2, 3, dtype=torch.int8)
        try:
            ref = op(x.clone(), v)
        except RuntimeError as e:
            assert "without overflow" in str(e)
            with pytest.raises(RuntimeError, match="without overflow"):
                cf(x.clone(), v)
        else:
            torch.testing.assert_close(cf(x.clone(), v), ref, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed; an error where eager takes the ``except`` path): an op whose error depends on the data (an index
# out of bounds, a matrix that is not positive-definite, an integer division by zero) inside ``try: ... except``
# in the compiled function. Capture traces the try body into the graph, whose kernels check at run time; the error
# then left the graph call in the entry function, outside the user's handler (psd-safe Cholesky: ``try:
# cholesky(A) except: cholesky(A + jitter)``). A graph with an op made inside a ``try`` block (``except`` or
# ``finally``; not a ``with`` block) now runs its frame eagerly from the start when it raises (no input was written
# yet: such a graph writes no input in place), so the user's handler sees eager's error.
# ---------------------------------------------------------------------------------------------------------------

def _catching(op, err):
    def f(x, i):
        try:
            return op(x, i)
        except err:
            return x * 2
    return f


@pytest.mark.parametrize("name, op, err, bad", [
    ("index", lambda x, i: x[i], IndexError, torch.tensor([5])),
    ("index_select", lambda x, i: x.index_select(0, i), (IndexError, RuntimeError), torch.tensor([5])),
    ("gather", lambda x, i: x.gather(0, i), RuntimeError, torch.tensor([5])),
    ("int_div", lambda x, i: x.long() // i, RuntimeError, torch.tensor([0])),
])
def test_data_dependent_error_reaches_the_users_handler(coil_reset, name, op, err, bad):
    f = _catching(op, err)
    cf = coil.compile(f)
    x = torch.arange(3.0)
    torch.testing.assert_close(cf(x, bad), f(x, bad))
    torch.testing.assert_close(cf(x, torch.tensor([1])), f(x, torch.tensor([1])))


def test_psd_safe_cholesky_with_grad(coil_reset):
    def chol(a):
        try:
            return torch.linalg.cholesky(a)
        except torch.linalg.LinAlgError:
            return torch.linalg.cholesky(a + 2 * torch.eye(a.shape[0]))

    a = torch.tensor([[1.0, 2.0], [2.0, 1.0]], requires_grad=True)      # not positive-definite
    ca = a.detach().clone().requires_grad_()
    ref, out = chol(a), coil.compile(chol)(ca)
    torch.testing.assert_close(out, ref)
    ref.sum().backward()
    out.sum().backward()
    torch.testing.assert_close(ca.grad, a.grad)


def test_input_written_before_the_error_is_written_once(coil_reset):
    def f(x, i):
        try:
            x.add_(1)
            return x[i]
        except IndexError:
            return x * 1

    x, cx = torch.zeros(3), torch.zeros(3)
    torch.testing.assert_close(coil.compile(f)(cx, torch.tensor([5])), f(x, torch.tensor([5])))
    torch.testing.assert_close(cx, x)


def test_kv_cache_scatter_before_the_error_is_written_once(coil_reset):
    """An inference graph's scatter into an input writes the input itself (``inplace_input_writes``), before the
    kernels that raise: a graph that may run again eagerly keeps that write to a copy."""
    def f(cache, pos, v, a):
        try:
            cache.index_add_(0, pos, v)
            return torch.linalg.cholesky(a)
        except torch.linalg.LinAlgError:
            return a

    cf = coil.compile(f)
    with torch.no_grad():
        for a in (torch.eye(2), torch.eye(2), -torch.eye(2)):
            c, cc = torch.zeros(4, 2), torch.zeros(4, 2)
            torch.testing.assert_close(cf(cc, torch.tensor([1]), torch.ones(1, 2), a),
                                       f(c, torch.tensor([1]), torch.ones(1, 2), a))
            torch.testing.assert_close(cc, c)


def test_try_finally_and_keyword_arguments(coil_reset):
    log = []

    def f(x, i, *rest, k=1, **kw):
        try:
            return x[i] * k + rest[0] + kw["m"]
        except IndexError:
            return x * k + rest[0] + kw["m"]
        finally:
            log.append("finally")

    args, kwargs = (torch.zeros(3), torch.tensor([5]), 1.0), dict(k=3, m=2.0)
    ref = f(*args, **kwargs)
    torch.testing.assert_close(coil.compile(f)(*args, **kwargs), ref)
    assert log == ["finally", "finally"]


def test_with_block_graphs_keep_in_place_input_writes(coil_reset):
    """Only ``try`` blocks mark a graph: ops inside a ``with`` block (``torch.no_grad()``, autocast) keep the KV-cache
    path that writes an input in place."""
    from coil import trace

    def f(cache, pos, v):
        with torch.no_grad():
            cache.index_copy_(0, pos, v)
        return cache.sum()

    seen = []
    real_log = trace.log
    try:
        trace.log = lambda event, **kw: (seen.append(event), real_log(event, **kw))[1]
        with torch.no_grad():
            c = torch.zeros(4, 2)
            coil.compile(f)(c, torch.tensor([1]), torch.ones(1, 2))
    finally:
        trace.log = real_log
    assert "inputs_written_in_place" in seen
    torch.testing.assert_close(c[1], torch.ones(2))


# ---------------------------------------------------------------------------------------------------------------
# Finding 5 (fixed; a value where eager raises): Python arithmetic on a number that became a graph input, divided by
# once it is 0 (``1.0 / s``, ``n / s``, ``s ** -1``): Python raises ZeroDivisionError; the symbolic division gave
# inf / nan. The divisor (or the base of a negative power) is now guarded nonzero; at 0 the frame runs eagerly, which
# raises Python's error.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, op, values", [
    ("float_div", lambda x, v: x * (1.0 / v), (2.0, 3.0, 0.0, 4.0)),
    ("int_truediv", lambda x, v: x * (10 / v), (2, 3, 0, 4)),
    ("pow_minus_one", lambda x, v: x * (v ** -1), (2.0, 3.0, 0.0, 4.0)),
])
def test_python_division_by_symbolic_zero_raises(coil_reset, name, op, values):
    cf = coil.compile(op)
    x = torch.rand(6) + 0.5
    for v in values:
        if v == 0:
            with pytest.raises(ZeroDivisionError):
                op(x, v)
            with pytest.raises(ZeroDivisionError):
                cf(x, v)
        else:
            torch.testing.assert_close(cf(x, v), op(x, v))


# ---------------------------------------------------------------------------------------------------------------
# Observation (fixed since): math.sqrt / log2 / acos / asin of a Python float that became a graph input and then left
# the function's domain gave nan; Python raises ValueError. The domain is now guarded; outside it the frame runs
# eagerly, which raises.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, fn, values", [
    ("sqrt", math.sqrt, (4.0, 9.0, -1.0, 16.0)),
    ("sqrt_int", math.sqrt, (4, 9, -1, 16)),
    ("log2", math.log2, (4.0, 8.0, 0.0, 2.0)),
    ("acos", math.acos, (0.5, 0.25, 1.5, -0.3)),
])
def test_math_function_of_a_symbolic_number_outside_its_domain_raises(coil_reset, name, fn, values):
    op = lambda x, v: x * fn(v)  # noqa: E731
    cf = coil.compile(op)
    x = torch.rand(6) + 0.5
    for v in values:
        try:
            want = op(x, v)
        except ValueError:
            with pytest.raises(ValueError, match="math domain error"):
                cf(x, v)
            continue
        torch.testing.assert_close(cf(x, v), want)


# Observation (fixed since): lp_pool1d/2d with a norm_type that became a graph input and then 0: eager's Python divides
# by it (ZeroDivisionError), the captured functional returned inf. A norm_type of 0 is now refused at capture (guarded).
@pytest.mark.parametrize("dims, values", [(1, (2.0, 3.0, 0.0, 1.5)), (2, (2, 3, 0, 1))])
def test_lp_pool_of_a_symbolic_norm_type_zero_raises(coil_reset, dims, values):
    op = lambda x, p: getattr(torch.nn.functional, f"lp_pool{dims}d")(x, p, 2)  # noqa: E731
    cf = coil.compile(op)
    x = torch.rand(1, 2, *([4] * dims)) + 0.1
    for p in values:
        if p == 0:
            with pytest.raises(ZeroDivisionError):
                op(x, p)
            with pytest.raises(ZeroDivisionError):
                cf(x, p)
        else:
            torch.testing.assert_close(cf(x, p), op(x, p))
