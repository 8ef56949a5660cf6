"""Graph breaks inside ``with`` (grad-mode contexts) and ``try`` blocks: the frame is not
run eagerly any more; values, requires_grad, grad mode after the call and exceptions
equal eager. ``torch.inference_mode`` blocks and decorators give inference tensors, as eager."""
import pytest
import torch

import coil


def _same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
            assert g.requires_grad == w.requires_grad
            assert g.is_inference() == w.is_inference()
        else:
            assert g == w


def break_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("coil-block", end="\r")
        z = y + x
    return z, x * 3, torch.is_grad_enabled()


def nested_grad_blocks(x):
    with torch.enable_grad():
        with torch.no_grad():
            a = x * 2
            print("coil-block", end="\r")
            b = a * 3
        c = x * 4
    return a, b, c, torch.is_grad_enabled()


def break_in_set_grad_enabled(x):
    with torch.set_grad_enabled(False):
        y = x.sin()
        print("coil-block", end="\r")
        y = y.cos()
    return y, x.exp()


def _raise_value_error(t):
    raise ValueError("from the callee")


def break_in_try_caught(x):
    y = x * 2
    try:
        y = y + 1
        _raise_value_error(y)
        y = y * 100
    except ValueError as e:
        y = y - len(str(e))
    return y


def break_in_try_finally(x, log):
    try:
        y = x * 2
        print("coil-block", end="\r")
        y = y + 1
    finally:
        log.append("finally")
    return y


def break_in_with_inside_try(x):
    try:
        with torch.no_grad():
            y = x * 2
            print("coil-block", end="\r")
            y = y + 1
    except RuntimeError:
        y = x
    return y, x + 1


def exception_from_break_call_in_no_grad(x):
    try:
        with torch.no_grad():
            y = x * 2
            _raise_value_error(y)
    except ValueError:
        y = x * 5
    return y, torch.is_grad_enabled()


@pytest.mark.parametrize("fn", [break_in_no_grad, nested_grad_blocks, break_in_set_grad_enabled,
                                break_in_try_caught, break_in_with_inside_try,
                                exception_from_break_call_in_no_grad])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_break_in_block_equals_eager(fn, backend):
    x = torch.randn(3, 4, requires_grad=True)
    want = fn(x)
    assert torch.is_grad_enabled()
    got = coil.compile(fn, backend=backend)(x)
    assert torch.is_grad_enabled()
    _same(got, want)
    assert coil.capture.stats["fallbacks"] == 0     # no longer the whole frame eagerly
    assert coil.capture.stats["graphs"] >= 1
    _same(coil.compile(fn, backend=backend)(x), want)   # cached entry


def test_try_finally_runs_once():
    x = torch.randn(3)
    log_e, log_c = [], []
    want = break_in_try_finally(x, log_e)
    got = coil.compile(break_in_try_finally, backend="eager")(x, log_c)
    torch.testing.assert_close(got, want)
    assert log_c == log_e == ["finally"]
    assert coil.capture.stats["fallbacks"] == 0


def test_break_in_no_grad_graph_counts():
    x = torch.randn(3, 4, requires_grad=True)
    e = coil.explain(break_in_no_grad, x)
    assert e.graph_count == 3, e.break_reasons   # before, inside (resumed), after the block


def inference_block(x):
    with torch.inference_mode():
        y = x * 2
    return y, y.is_inference(), x + 1


@torch.inference_mode()
def _inference_helper(t):
    return t * 3


def inference_decorated(x):
    return _inference_helper(x), x.cos()


@pytest.mark.parametrize("fn", [inference_block, inference_decorated])
def test_inference_mode_is_eagers(fn):
    x = torch.randn(3, requires_grad=True)
    want = fn(x)
    got = coil.compile(fn, backend="eager")(x)
    _same(got, want)


def test_called_inside_inference_mode_recompiles():
    def f(x):
        return x * 2

    cf = coil.compile(f, backend="eager")
    x = torch.randn(3)
    assert not cf(x).is_inference()
    with torch.inference_mode():
        assert cf(x).is_inference()


class _CM:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("in")
        return 2

    def __exit__(self, typ, val, tb):
        self.log.append(("out", typ is None))
        return False


def user_cm_with_break(x, log):
    with _CM(log) as k:
        y = x * k
        print("coil-block", end="\r")
        y = y + 1
    return y


def _raise_after_print():
    print("coil-block", end="\r")
    raise ValueError("v")


def user_cm_exception_through_break(x, log):
    try:
        with _CM(log):
            y = x * 2
            _raise_after_print()
    except ValueError:
        y = x * 3
    return y


@pytest.mark.parametrize("fn", [user_cm_with_break, user_cm_exception_through_break])
def test_user_context_manager_with_break(fn):
    x = torch.randn(3)
    log_e, log_c = [], []
    want = fn(x, log_e)
    got = coil.compile(fn, backend="eager")(x, log_c)
    torch.testing.assert_close(got, want)
    assert log_c == log_e
    assert coil.capture.stats["fallbacks"] == 0


def _bad_if(cond):
    if cond:
        raise ValueError("bad")
    return 2.0


def loop_try_break_unwinds(x):
    out = x
    for i in range(3):
        try:
            out = out + 1
            print("coil-block", end="\r")
            out = torch.add(out, out * _bad_if(i == 1))   # raises with items on the stack
        except ValueError:
            out = out - 1
    return out


def test_exception_unwinds_stack_in_resumed_try():
    """Resume code starts inside try blocks: the exception table depths must be the
    original ones (the handler pops the stack to them), and the stack sized for them."""
    x = torch.randn(3)
    want = loop_try_break_unwinds(x)
    for _ in range(2):
        torch.testing.assert_close(coil.compile(loop_try_break_unwinds, backend="eager")(x), want)
