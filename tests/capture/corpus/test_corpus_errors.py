"""Corpus: exceptions. A user exception raised inside a compiled region propagates with
the same type and message as eager, and side effects done before it are visible as in
eager. Under fullgraph=True a graph break raises a UserError naming the user's
file:line (the line marked ``# BREAK``).

A frame that raises may compile the graph up to the raise and replay the raise, or run
eagerly (torch.compile does the latter: 0 graphs), so raising rows accept 0 or 1 graphs.

PYTEST_DONT_REWRITE: the programs' asserts must stay plain Python asserts."""
import inspect

import pytest
import torch

from corpus_harness import ORACLE, C, Case, CountingBackend, cases, compile_fn, randn


def x34():
    return (randn(3, 4),)


class MyError(Exception):
    pass


def raise_value_error(x):
    y = x * 2
    raise ValueError(f"bad value, shape {tuple(y.shape)}")


def raise_custom(x):
    if x.dim() == 2:
        raise MyError("custom", x.shape[0])
    return x


def raise_after_list_append(x, out):
    out.append(x.sum())
    out.append("before")
    raise RuntimeError("after side effects")


def raise_after_attr_write(x, obj):
    obj.flag = True
    obj.value = x.shape[1]
    raise KeyError("k")


def raise_after_global_write(x):
    global ERR_STATE
    ERR_STATE = x.shape[0]
    raise TypeError("after global write")


ERR_STATE = None


def raise_after_input_mutation(x):
    x.mul_(2)
    raise ValueError("after mutation")


def raise_in_callee(x):
    def inner(t):
        raise IndexError("inner " + str(t.dim()))

    return inner(x * 2)


def index_error_list(x):
    lst = [x, x]
    return lst[5]


def key_error_dict(x):
    d = {"a": x}
    return d["b"]


def zero_division(x):
    n = x.shape[0] - 3
    return x / (1 / n)


def attribute_error(x):
    return x.not_an_attribute


def attribute_error_object(x, o):
    return x * o.missing


def type_error_call(x):
    def f(a, b):
        return a + b

    return f(x)


def assert_fails(x):
    assert x.dim() == 3, "need 3-d input"
    return x


def assert_fails_no_message(x):
    assert x.shape[0] == 7
    return x


def torch_shape_error(x):
    return x @ x


def torch_cat_error(x):
    return torch.cat([x, x.t()], 0)


def torch_dtype_error(x):
    return torch.ones(3, dtype=torch.int64).add_(x[0, :3])


def not_implemented(x):
    raise NotImplementedError("subclass must implement")


def reraise_different(x):
    try:
        raise ValueError("first")
    except ValueError as e:
        raise RuntimeError("second") from e


class Bad(torch.nn.Module):
    def forward(self, x):
        h = x * 2
        if h.shape[-1] != 5:
            raise ValueError(f"expected 5 features, got {h.shape[-1]}")
        return h


def raise_in_module_forward():
    return Bad()


def raise_after_break(x):
    y = x * 2
    print("before raise", end="\r")
    raise ValueError("after a graph break " + str(y.shape[0]))


def raise_from_data_dependent(x):
    if (x > 100).any():
        return x
    raise ValueError("no large values")


def stop_iteration_next(x):
    it = iter([])
    return next(it)


def caught_then_continue(x):
    try:
        [][1]
    except IndexError as e:
        msg = type(e).__name__
    return x * len(msg), msg


class _Holder:
    pass


def E(fn, inputs, **kw):
    """A raising row: the graph count may be 0 (eager fallback) or 1 (graph, then raise)."""
    return C(fn, inputs, graphs=(0, 1), **kw)


CASES = cases(
    E(raise_value_error, x34),
    E(raise_custom, x34),
    E(raise_after_list_append, lambda: (randn(3, 4), [])),
    E(raise_after_attr_write, lambda: (randn(3, 4), _Holder())),
    E(raise_after_global_write, x34, observe=lambda: ERR_STATE),
    E(raise_after_input_mutation, x34),
    E(raise_in_callee, x34),
    E(index_error_list, x34),
    E(key_error_dict, x34),
    E(zero_division, x34),
    E(attribute_error, x34),
    E(attribute_error_object, lambda: (randn(3, 4), _Holder())),
    E(type_error_call, x34),
    E(assert_fails, x34),
    E(assert_fails_no_message, x34),
    E(torch_shape_error, x34, error="type", note="a torch op error keeps its type; the message may carry more context"),
    E(torch_cat_error, x34, error="type", note="a torch op error keeps its type; the message may carry more context"),
    E(torch_dtype_error, x34, error="type", note="a torch op error keeps its type; the message may carry more context"),
    E(not_implemented, x34),
    E(reraise_different, x34),
    E(raise_in_module_forward, lambda: (randn(2, 4),), module=True),
    C(raise_after_break, x34),
    C(raise_from_data_dependent, x34),
    E(stop_iteration_next, x34),
    C(caught_then_continue, x34),
)


@pytest.mark.parametrize("case", CASES)
def test_errors(case, check):
    check(case)


# ---------------------------------------------------------------- fullgraph=True


def fg_print(x):
    y = x * 2
    print("fullgraph", end="\r")  # BREAK
    return y


def fg_item(x):
    s = x.sum().item()  # BREAK
    return x * s


def fg_data_dependent(x):
    if x.sum() > 0:  # BREAK
        return x
    return -x


def fg_tolist(x):
    return x.tolist()  # BREAK


def fg_in_callee(x):
    return _fg_helper(x) + 1


def _fg_helper(t):
    print("helper", end="\r")  # BREAK
    return t


def fg_numpy(x):
    return x.numpy()  # BREAK


def fg_getframe(x):
    import sys

    return x * sys._getframe().f_lineno  # BREAK


def _break_line(fn):
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if "# BREAK" in line:
            return start + i
    raise AssertionError("no # BREAK marker")


FULLGRAPH = [fg_print, fg_item, fg_data_dependent, fg_tolist, fg_in_callee, fg_numpy, fg_getframe]
TORCH_NO_BREAK = {fg_item, fg_numpy}  # torch 2.13 traces these; issue 3 makes them breaks


@pytest.mark.parametrize("fn", FULLGRAPH, ids=lambda f: f.__name__)
def test_fullgraph_error_names_file_line(fn):
    """fullgraph=True turns the break into coil.exc.UserError whose message names the
    file:line of the breaking construct (the callee's line for fg_in_callee)."""
    if ORACLE and fn in TORCH_NO_BREAK:
        pytest.skip("torch.compile traces this construct")
    target = _fg_helper if fn is fg_in_callee else fn
    compiled = compile_fn(fn, CountingBackend(), Case(fn, fullgraph=True))
    with pytest.raises(Exception) as info:
        compiled(randn(3, 4))
    if ORACLE:
        return
    import coil.exc

    assert isinstance(info.value, coil.exc.UserError), f"{type(info.value).__name__}: {info.value}"
    where = f"{inspect.getsourcefile(target)}:{_break_line(target)}"
    assert where in str(info.value), f"expected {where} in:\n{info.value}"


def test_fullgraph_clean_program_compiles_once():
    counter = CountingBackend()
    compiled = compile_fn(lambda x: (x * 2).sum(1), counter, Case(None, fullgraph=True))
    x = randn(3, 4)
    torch.testing.assert_close(compiled(x), (x * 2).sum(1))
    assert counter.graphs == 1
