"""Corpus: grad mode, autocast and inference mode entered and left inside the frame,
user context managers, `with` blocks around traceable code.

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import contextlib

import pytest
import torch

from corpus_harness import C, cases, randn


def xg():
    return (randn(3, 4, requires_grad=True),)


def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    z = x * 3
    return y, z, y.requires_grad, z.requires_grad


def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x + 1
        with torch.enable_grad():
            b = x * 2
    return a, b


def set_grad_enabled_false(x):
    with torch.set_grad_enabled(False):
        y = x.sin()
    return y, torch.is_grad_enabled()


def is_grad_enabled_query(x):
    if torch.is_grad_enabled():
        return x * 2
    return x


def no_grad_decorated_helper(x):
    return _nograd_helper(x) + x


@torch.no_grad()
def _nograd_helper(t):
    return t * 10


def autocast_bf16(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        z = y.float().relu()
    return y, z, y.dtype, (x @ w).dtype


def autocast_disabled_inside(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        with torch.autocast("cpu", enabled=False):
            b = x @ w
    return a, b


def autocast_query(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        on = torch.is_autocast_enabled("cpu")
    return x * on, on


def inference_mode_block(x):
    with torch.inference_mode():
        y = x * 2
    return y + 0


def inference_mode_tensor_escapes(x):
    with torch.inference_mode():
        y = x * 2
    return y, y.is_inference()


def inference_mode_false(x):
    with torch.inference_mode(False):
        y = x.cos()
    return y


class Recorder:
    def __init__(self):
        self.events = []

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, *exc):
        self.events.append("exit")
        return False


def user_context_manager(x, rec):
    with rec as r:
        y = x * 2
        r.events.append("body")
    return y + 1


def user_cm_created_inside(x):
    rec = Recorder()
    with rec:
        y = x.exp()
    return y, rec.events


@contextlib.contextmanager
def _scoped(log):
    log.append("in")
    try:
        yield 3
    finally:
        log.append("out")


def contextlib_contextmanager(x, log):
    with _scoped(log) as k:
        y = x * k
    return y


def contextlib_nullcontext(x):
    with contextlib.nullcontext():
        y = x + 1
    with contextlib.nullcontext(5) as v:
        y = y * v
    return y


def nested_with(x):
    with torch.no_grad(), contextlib.nullcontext():
        a = x * 2
    with torch.enable_grad():
        with torch.no_grad():
            b = x * 3
    return a, b


def with_exception_suppressed(x):
    with contextlib.suppress(KeyError):
        d = {}
        d["missing"]
    return x * 2


def with_return_inside(x):
    with torch.no_grad():
        return x * 4


def grad_mode_restored_after(x):
    with torch.no_grad():
        pass
    y = x * 2
    return y, y.requires_grad


def no_grad_then_backward(x, w):
    with torch.no_grad():
        scale = w.norm()
    return (x @ w * scale).sum()


def cm_in_loop(x):
    out = []
    for i in range(3):
        with torch.no_grad():
            out.append(x * i)
    return out


def enable_grad_query_no_grad_input(x):
    with torch.enable_grad():
        y = x * 2
    return y, y.requires_grad


def detect_anomaly_free_block(x):
    with torch.autograd.set_grad_enabled(True):
        return x.tanh()


CASES = cases(
    C(no_grad_block, xg),
    C(enable_grad_inside_no_grad, xg),
    C(set_grad_enabled_false, xg),
    C(is_grad_enabled_query, xg),
    C(no_grad_decorated_helper, xg),
    C(autocast_bf16, lambda: (randn(3, 4), randn(4, 5))),
    C(autocast_disabled_inside, lambda: (randn(3, 4), randn(4, 5))),
    C(autocast_query, lambda: (randn(3, 4),)),
    C(inference_mode_block, lambda: (randn(3, 4),),
      note="traced as no_grad; y + 0 outside the block is an ordinary tensor, as eager"),
    C(inference_mode_tensor_escapes, lambda: (randn(3, 4),),
      note="the returned tensor is copied into an inference tensor at the entry, as eager's is one"),
    C(inference_mode_false, lambda: (randn(3, 4),),
      note="inference_mode(False) outside inference mode changes nothing: traced, as torch does"),
    C(user_context_manager, lambda: (randn(3, 4), Recorder()), torch_graphs=0,
      note="torch 2.13 runs this frame eagerly (user context manager object passed in); coil should inline it"),
    C(user_cm_created_inside, lambda: (randn(3, 4),)),
    C(contextlib_contextmanager, lambda: (randn(3, 4), [])),
    C(contextlib_nullcontext, lambda: (randn(3, 4),)),
    C(nested_with, xg),
    C(with_exception_suppressed, lambda: (randn(3, 4),)),
    C(with_return_inside, xg),
    C(grad_mode_restored_after, xg),
    C(no_grad_then_backward, lambda: (randn(3, 4), randn(4, 2, requires_grad=True)), backward=True),
    C(cm_in_loop, xg),
    C(enable_grad_query_no_grad_input, lambda: (randn(3, 4),)),
    C(detect_anomaly_free_block, xg),
)


@pytest.mark.parametrize("case", CASES)
def test_context_managers(case, check):
    check(case)
