"""Corpus: constructs that must be graph breaks — and still give eager's answer.

print, logging, data-dependent control flow, .item(), .tolist(), .numpy(), calls into
C functions and libraries not known to be safe, generators that escape, frame
inspection; breaks inside called functions, loops, with-blocks and try-blocks;
several breaks in one frame; side effects on both sides of a break.

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import copy
import inspect
import logging
import sys

import numpy as np
import pytest
import torch

from corpus_harness import C, cases, randn

log = logging.getLogger("coil.corpus.user")


def x34():
    return (randn(3, 4),)


def print_break(x):
    y = x.sin()
    print("corpus print", end="\r")
    return y.cos()


def print_tensor_value(x):
    y = x * 2
    print(y.shape, end="\r")
    return y + 1


def logging_break(x):
    y = x.relu()
    log.info("value %s", y.shape)
    return y * 2


def data_dependent_if(x):
    y = x.sin()
    if y.sum() > 0:
        return y.cos()
    return y.tan()


def data_dependent_if_negative(x):
    y = -x.abs()
    if y.sum() > 0:
        return y.cos()
    return y.tan()


def data_dependent_while(x):
    y = x
    n = 0
    while y.abs().max() > 0.1 and n < 5:
        y = y * 0.5
        n += 1
    return y, n


def item_break(x):
    s = x.sum().item()
    return x * s


def item_used_in_python(x):
    v = x.max().item()
    k = int(v * 10) % 3
    return x + k, k


def tolist_break(x):
    lst = x[0].tolist()
    return x * len(lst) + sum(lst), lst


def numpy_break(x):
    y = x * 2
    a = y.numpy()
    return y + 1, a


def numpy_function_call(x):
    n = np.sqrt(16.0)
    return x * float(n)


def bool_of_tensor(x):
    if bool((x > 0).any()):
        return x * 2
    return x


def tensor_in_python_condition(x):
    return x * 2 if x.mean() > -10 else x


def int_of_tensor(x):
    k = int(x.argmax())
    return x.flatten()[k] + x


def unsupported_c_function(x):
    y = x * 2
    _ = sys.getrefcount(y)
    return y + 1


def copy_deepcopy_tensor(x):
    y, row = copy.deepcopy([x, x[0]])    # the copies share one storage in eager (a lone dense tensor is a clone)
    return y * 2, row


def generator_escapes(x):
    def gen():
        yield x * 2
        yield x * 3

    return x + 1, gen()


def inspect_frame(x):
    frame = inspect.currentframe()
    name = frame.f_code.co_name
    return x * len(name), name


def sys_getframe(x):
    return x * len(sys._getframe().f_code.co_name)


def _inner_print(t):
    t = t * 2
    print("inner", end="\r")
    return t + 1


def break_in_callee(x):
    y = x.sin()
    z = _inner_print(y)
    return z.cos()


def two_breaks(x):
    y = x + 1
    print("one", end="\r")
    y = y * 2
    print("two", end="\r")
    return y - 1


def break_in_loop(x):
    for i in range(2):
        x = x * 2
        print(i, end="\r")
    return x


def break_in_with_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("in no_grad", end="\r")
        z = y + 1
    return z, z.requires_grad


def break_in_try(x):
    try:
        y = x * 2
        print("try", end="\r")
        y = y + 1
    finally:
        pass
    return y


def side_effects_around_break(x, out):
    out.append(x.sum())
    print("mid", end="\r")
    out.append(x.mean())
    return x * len(out)


def attr_write_before_break(x, obj):
    obj.before = x.shape[0]
    print("obj", end="\r")
    obj.after = obj.before + 1
    return x * obj.after


def break_with_live_tensors(x):
    a = x * 2
    b = x + 3
    print("live", end="\r")
    return a * b


def break_returns_tuple(x):
    a, b = x.sin(), x.cos()
    print("tuple", end="\r")
    return (a, b), {"s": a + b}


def break_at_start(x):
    print("start", end="\r")
    return x * 2


def break_at_end(x):
    y = x * 2
    print("end", end="\r")
    return y


def data_dependent_in_callee(x):
    def pick(t):
        if t.sum() > 0:
            return t * 2
        return t * 3

    return pick(x.sin()) + 1


def item_then_tensor_creation(x):
    n = x.abs().sum().item()
    return torch.full((2,), n) + x[0, :2]


class _Opaque:
    def __init__(self):
        self.seen = []


def hasattr_on_tensor_data_dependent_print(x, o):
    y = x.softmax(-1)
    o.seen.append("pre")
    print(len(o.seen), end="\r")
    return y * len(o.seen)


def nonzero_count_then_use(x):
    n = (x > 0).sum().item()
    return x * n


def python_random_module(x):
    import random

    rng = random.Random(0)
    return x * rng.random()


def tensor_repr_str(x):
    s = str(x.shape)
    r = repr(x.sum())
    return x * len(s) + len(r) * 0, s


def global_print_fn(x):
    y = x * 2
    _say(y)
    return y


def _say(t):
    print(t.shape, end="\r")


JUMP = "a data-dependent jump is a graph break; torch's graph_break counter does not count jump breaks"

CASES = cases(
    C(print_break, x34, graphs=2, breaks=1),
    C(print_tensor_value, x34, graphs=2, breaks=1),
    C(logging_break, x34, graphs=2, breaks=(1, 2), torch_breaks=1,
      note="coil breaks at the logging call and may capture Logger.info's own frame (a 2nd break there)"),
    C(data_dependent_if, lambda: (randn(3, 4).abs(),), graphs=2, breaks=1, torch_breaks=0, note=JUMP),
    C(data_dependent_if_negative, x34, graphs=2, breaks=1, torch_breaks=0, note=JUMP),
    C(data_dependent_while, x34, graphs=(1, 2, 4), breaks=(1, 2, 4), torch_graphs=1, torch_breaks=0,
      note=JUMP + "; torch runs the loop's resume eagerly; coil captures the resume, which every iteration "
      "reuses (a break in a resume function resumes from the user's code): n is specialized once, then "
      "dynamic (4 graphs, 4 breaks)"),
    C(item_break, x34, graphs=2, breaks=1),
    C(item_used_in_python, x34, graphs=2, breaks=1),
    C(tolist_break, x34, graphs=2, breaks=1),
    C(numpy_break, x34, graphs=2, breaks=1, torch_graphs=1, torch_breaks=0, note="torch traces numpy through torch; coil breaks at .numpy() (issue 3)"),
    C(numpy_function_call, x34, graphs=1, breaks=0, torch_breaks=0,
      note="a numpy ufunc on constants is folded at compile time (trial 57); on tensors it is still a break"),
    C(bool_of_tensor, x34, graphs=2, breaks=1),
    C(tensor_in_python_condition, x34, graphs=2, breaks=1, torch_breaks=0, note=JUMP),
    C(int_of_tensor, x34, graphs=2, breaks=1),
    C(unsupported_c_function, x34, graphs=2, breaks=1),
    C(copy_deepcopy_tensor, x34, graphs=2, breaks=1),
    C(generator_escapes, x34, graphs=(0, 1), breaks=(0, 1), torch_graphs=0, torch_breaks=0,
      note="torch runs the whole frame eagerly without counting a break; coil returns a real generator "
           "rebuilt by the entry (no break)"),
    C(inspect_frame, x34, graphs=1, breaks=1),
    C(sys_getframe, x34, graphs=1, breaks=1),
    C(break_in_callee, x34, graphs=4, breaks=2, note="break at the call (callee not inlinable) + break in the callee's own frame"),
    C(two_breaks, x34, graphs=3, breaks=2),
    C(break_in_loop, x34, graphs=(0, 1, 2, 3), breaks=(0, 1, 2), torch_graphs=0, torch_breaks=0,
      note="torch runs a frame with a break inside a for loop eagerly; resuming inside the loop is a design choice"),
    C(break_in_with_no_grad, lambda: (randn(3, 4, requires_grad=True),), graphs=2, breaks=(1, 2),
      torch_breaks=1, note="coil resumes inside the no_grad block (graph 2); leaving the block turns grad "
                           "back on, which coil runs outside the graph (a second break, no graph)"),
    C(break_in_try, x34, graphs=(0, 2), breaks=(0, 1), torch_graphs=0, torch_breaks=0,
      note="torch runs a frame with a break inside try/finally eagerly; resuming inside the block is a design choice"),
    C(side_effects_around_break, lambda: (randn(3, 4), []), graphs=2, breaks=1),
    C(attr_write_before_break, lambda: (randn(3, 4), _Opaque()), graphs=1, breaks=1),
    C(break_with_live_tensors, x34, graphs=2, breaks=1),
    C(break_returns_tuple, x34, graphs=2, breaks=1),
    C(break_at_start, x34, graphs=1, breaks=1),
    C(break_at_end, x34, graphs=1, breaks=1),
    C(data_dependent_in_callee, x34, graphs=4, breaks=2, torch_breaks=1, note="call break + " + JUMP),
    C(item_then_tensor_creation, x34, graphs=2, breaks=1),
    C(hasattr_on_tensor_data_dependent_print, lambda: (randn(3, 4), _Opaque()), graphs=2, breaks=1),
    C(nonzero_count_then_use, x34, graphs=2, breaks=1),
    C(python_random_module, x34, graphs=1, breaks=(0, 1, 2), torch_breaks=0,
      note="torch traces random.Random; coil breaks at its constructor and at rng.random() (a C method)"),
    C(tensor_repr_str, x34, graphs=2, breaks=1),
    C(global_print_fn, x34, graphs=1, breaks=2, note="break at the call + the print in the callee's frame"),
)


@pytest.mark.parametrize("case", CASES)
def test_graph_breaks(case, check):
    check(case)
