"""Corpus: nested functions, closures and cells (read and write), lambdas, default
arguments, keyword-only arguments, functools.partial, decorators, recursion.

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import functools

import pytest
import torch

from corpus_harness import Args, C, CountingBackend, cases, compile_fn, randn


def x34():
    return (randn(3, 4),)


def nested_function(x):
    def inner(y):
        return y.sin() * 2

    return inner(x) + inner(x + 1)


def closure_read(x):
    scale = x.shape[0]
    bias = x.mean()

    def inner(y):
        return y * scale + bias

    return inner(x)


def closure_write_nonlocal(x):
    count = 0

    def bump(y):
        nonlocal count
        count += 1
        return y + count

    y = bump(x)
    y = bump(y)
    return y, count


def closure_tensor_write(x):
    acc = x

    def add(v):
        nonlocal acc
        acc = acc + v

    add(1.0)
    add(x)
    return acc


def _make_scaler(k):
    def scale(t):
        return t * k

    return scale


SCALE3 = _make_scaler(3.0)


def closure_from_outside(x):
    return SCALE3(x) + _make_scaler(0.5)(x)


def _make_tensor_closure():
    w = torch.linspace(-1, 1, 4)

    def f(x):
        return x * w

    return f


closure_over_tensor = _make_tensor_closure()


def _make_counter():
    calls = [0]

    def f(x):
        calls[0] += 1
        return x * 2

    f.calls = calls
    return f


counting_closure = _make_counter()


def _make_nonlocal_counter():
    n = 0

    def f(x):
        nonlocal n
        n += 1
        return x + n

    def get():
        return n

    f.get = get
    return f


nonlocal_counter = _make_nonlocal_counter()


def closure_returned_and_called(x):
    def make(k):
        return lambda t: t + k

    fs = [make(i) for i in range(3)]
    return [f(x) for f in fs]


def closure_returned_out(x):
    k = 2.0

    def g(t):
        return t * k

    return x + 1, g


def lambdas(x):
    sq = lambda t: t * t  # noqa: E731
    add = lambda a, b=1: a + b  # noqa: E731
    return sq(x) + add(x) + add(x, b=3) + (lambda: 5)()


def lambda_in_sorted_map(x):
    cols = sorted(range(4), key=lambda i: -i)
    return torch.stack(list(map(lambda i: x[:, i], cols)), 1)


def default_args(x, scale=2.0, shift=None, *, power=2):
    y = x * scale
    if shift is not None:
        y = y + shift
    return y ** power


def _defaults_helper(t, k=3, *, mode="add"):
    return t + k if mode == "add" else t * k


def call_with_defaults(x):
    return _defaults_helper(x), _defaults_helper(x, 2), _defaults_helper(x, mode="mul"), _defaults_helper(x, k=5, mode="mul")


def keyword_only_and_positional(x):
    def f(a, /, b, *, c):
        return a * b + c

    return f(x, 2, c=1), f(x, b=3, c=x)


def partial_usage(x):
    p = functools.partial(torch.clamp, min=-0.5)
    q = functools.partial(_defaults_helper, k=10)
    return p(x, max=0.5), q(x), q(x, mode="mul")


def partial_of_lambda(x):
    f = functools.partial(lambda a, b, c: a * b + c, 2.0)
    return f(x, 1.0), f(x, c=3.0, b=x)


def _twice(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * 2

    return wrapper


@_twice
def _decorated(t):
    return t + 1


def decorated_call(x):
    return _decorated(x), _decorated.__name__


def _fact(n):
    return 1 if n <= 1 else n * _fact(n - 1)


def recursion_python(x):
    return x * _fact(4)


def _tree_sum(t, depth):
    if depth == 0:
        return t
    return _tree_sum(t * 0.5, depth - 1) + t


def recursion_tensor(x):
    return _tree_sum(x, 3)


def higher_order(x):
    def apply(f, t, n):
        for _ in range(n):
            t = f(t)
        return t

    return apply(torch.tanh, x, 2), apply(lambda t: t * 2, x, 3)


def nested_three_levels(x):
    a = 1.0

    def l1(t):
        b = 2.0

        def l2(u):
            def l3(v):
                return v * a + b

            return l3(u) - a

        return l2(t) * b

    return l1(x)


def closure_cell_modified_after_def(x):
    k = 1.0

    def f(t):
        return t * k

    k = 5.0
    return f(x)


def closure_shared_between_functions(x):
    state = {"n": 0}

    def inc():
        state["n"] += 1

    def read():
        return state["n"]

    inc()
    inc()
    return x * read(), state


def generator_consumed_inside(x):
    def gen(t):
        for i in range(3):
            yield t * i

    return sum(gen(x)), list(gen(x))[1]


def star_args_forwarding(x):
    def inner(*args, **kwargs):
        return torch.cat(args, dim=kwargs.get("dim", 0))

    def outer(*args, **kwargs):
        return inner(*args, **kwargs)

    return outer(x, x * 2, dim=1), outer(x, x)


def method_reference(x):
    f = x.mul
    g = torch.Tensor.add
    return f(2) + g(x, 1)


def function_attributes(x):
    def f(t):
        return t

    return x * len(f.__name__), f.__name__, f.__code__.co_argcount


def closure_over_module(x):
    lin = _LIN

    def run(t):
        return lin(t).relu()

    return run(x)


_LIN = torch.nn.Linear(4, 3)


def lambda_default_capture(x):
    fs = [lambda t, i=i: t * i for i in range(3)]
    return [f(x) for f in fs]


def inner_function_with_global(x):
    def f(t):
        return t * _GLOBAL_K

    return f(x)


_GLOBAL_K = 1.5


def _reset_counting():
    counting_closure.calls[0] = 0


CASES = cases(
    C(nested_function, x34),
    C(closure_read, x34),
    C(closure_write_nonlocal, x34),
    C(closure_tensor_write, x34),
    C(closure_from_outside, x34),
    C(closure_over_tensor, x34, name="closure_over_tensor"),
    C(counting_closure, x34, name="closure_list_cell_mutation", setup=_reset_counting,
      observe=lambda: list(counting_closure.calls)),
    C(closure_returned_and_called, x34),
    C(closure_returned_out, x34),
    C(lambdas, x34),
    C(lambda_in_sorted_map, x34),
    C(default_args, x34),
    C(default_args, lambda: Args(randn(3, 4), 0.5, randn(4), power=3), name="default_args_overridden"),
    C(call_with_defaults, x34),
    C(keyword_only_and_positional, x34),
    C(partial_usage, x34),
    C(partial_of_lambda, x34),
    C(decorated_call, x34),
    C(recursion_python, x34),
    C(recursion_tensor, x34),
    C(higher_order, x34),
    C(nested_three_levels, x34),
    C(closure_cell_modified_after_def, x34),
    C(closure_shared_between_functions, x34),
    C(generator_consumed_inside, x34),
    C(star_args_forwarding, x34),
    C(method_reference, x34),
    C(function_attributes, x34),
    C(closure_over_module, lambda: (randn(2, 4),)),
    C(lambda_default_capture, x34),
    C(inner_function_with_global, x34),
)


@pytest.mark.parametrize("case", CASES)
def test_closures(case, check):
    check(case)


def test_nonlocal_counter_advances_like_eager():
    """A frame that writes a cell of an outer function: each call (eager or compiled)
    advances the same cell by one, so two compiled calls give 2 more than before."""
    before = nonlocal_counter.get()
    counter = CountingBackend()
    compiled = compile_fn(nonlocal_counter, counter, C(nonlocal_counter))
    x = randn(3)
    out1 = compiled(x)
    out2 = compiled(x)
    assert nonlocal_counter.get() == before + 2
    torch.testing.assert_close(out1, x + (before + 1))
    torch.testing.assert_close(out2, x + (before + 2))
    assert counter.graphs in (1, 2), "the cell's value may be a graph input or a guarded constant"
