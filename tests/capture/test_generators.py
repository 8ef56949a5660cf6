"""Generators made in captured code: lazy inlining, and escaping generators come back as
real generator objects (issue 3: "generators that escape" must work)."""
import types

import pytest

import torch

import coil
from coil.testing import CompileCounter


def returns_generator(x, log):
    def gen():
        log.append("first")
        yield x * 2
        log.append("second")
        yield torch.rand(2)

    return x + 1, gen()


def test_escaping_generator_is_real_and_lazy():
    x = torch.randn(3)
    cnt = CompileCounter()
    log_c = []
    torch.manual_seed(1)
    y, g = coil.compile(returns_generator, backend=cnt)(x, log_c)
    assert isinstance(g, types.GeneratorType)
    assert log_c == []                       # nothing ran before iteration, as in eager
    first = next(g)
    assert log_c == ["first"]
    second = next(g)
    torch.manual_seed(1)
    log_e = []
    y_e, g_e = returns_generator(x, log_e)
    items_e = list(g_e)
    torch.testing.assert_close(y, y_e)
    torch.testing.assert_close(first, items_e[0])
    torch.testing.assert_close(second, items_e[1])   # RNG advanced once, as eager
    assert log_c == log_e
    assert cnt.frame_count == 1


def consumed_generators(x):
    def squares(n):
        for i in range(n):
            yield x * i

    return sum(squares(3)), max(v for v in (1, 5, 2)), list(squares(2))


def test_consumed_generators_one_graph():
    x = torch.randn(4)
    e = coil.explain(consumed_generators, x)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    out = coil.compile(consumed_generators, backend="eager", fullgraph=True)(x)
    want = consumed_generators(x)
    torch.testing.assert_close(out[0], want[0])
    assert out[1] == want[1]
    torch.testing.assert_close(out[2], want[2])


def partially_consumed_escapes(x):
    g = (x * i for i in range(3))
    first = next(g)
    return first, g


def test_partially_consumed_generator_breaks_where_it_starts():
    """A generator traced code started cannot be rebuilt: the frame breaks at its ``next`` (a real generator)."""
    x = torch.randn(3)
    first, g = coil.compile(partially_consumed_escapes, backend="eager")(x)
    assert isinstance(g, types.GeneratorType)
    rest = list(g)
    torch.testing.assert_close(first, x * 0)
    torch.testing.assert_close(rest[0], x * 1)
    torch.testing.assert_close(rest[1], x * 2)
    assert coil.capture.stats["fallbacks"] == 0


_CLOSED = []


def _closing(x):
    try:
        for i in range(3):
            yield x * i
    finally:
        _CLOSED.append(len(_CLOSED))


def _break_out(x):
    for v in _closing(x):
        if True:
            break
    it = _closing(x)
    return v + next(it)


def test_a_dropped_suspended_generator_runs_its_finally():
    """Eager closes a suspended generator when it is dropped (a break out of its loop, the frame's end): its finally
    blocks run; traced generators are closed at the frame's return."""
    x = torch.randn(3)
    want, closed = _break_out(x), list(_CLOSED)
    _CLOSED.clear()
    torch.testing.assert_close(coil.compile(_break_out)(x), want)
    assert _CLOSED == closed == [0, 1] and coil.capture.stats["graph_breaks"] == 0


def generator_across_break(x):
    g = (x * i for i in range(1, 3))
    print("coil-gen", end="\r")
    return sum(g)


def test_generator_live_at_a_break():
    x = torch.randn(3)
    torch.testing.assert_close(coil.compile(generator_across_break, backend="eager")(x),
                               generator_across_break(x))


import contextlib  # noqa: E402


@contextlib.contextmanager
def _tagged(log, tag):
    log.append(f"enter {tag}")
    try:
        yield len(tag)
    finally:
        log.append(f"exit {tag}")


def uses_contextmanager(x, log):
    with _tagged(log, "ab") as k:
        log.append("body")
        y = x * k
    log.append("after")
    return y


def contextmanager_with_break(x, log):
    with _tagged(log, "abc") as k:
        y = x * k
        print("coil-cm", end="\r")
        log.append("body")
    return y + 1


def contextmanager_body_raises(x, log):
    with _tagged(log, "a"):
        y = x * 2
        raise KeyError("inside")
    return y


def test_contextmanager_order_of_effects_one_graph():
    x = torch.randn(3)
    log_e, log_c = [], []
    want = uses_contextmanager(x, log_e)
    cnt = CompileCounter()
    got = coil.compile(uses_contextmanager, backend=cnt)(x, log_c)
    torch.testing.assert_close(got, want)
    assert log_c == log_e == ["enter ab", "body", "exit ab", "after"]
    assert cnt.frame_count == 1 and coil.capture.stats["graph_breaks"] == 0


@pytest.mark.parametrize("fn", [contextmanager_with_break, contextmanager_body_raises])
def test_contextmanager_break_or_raise_equals_eager(fn):
    x = torch.randn(3)
    log_e, log_c = [], []
    err_e = err_c = None
    try:
        want = fn(x, log_e)
    except KeyError as e:
        err_e = e
    try:
        got = coil.compile(fn, backend="eager")(x, log_c)
    except KeyError as e:
        err_c = e
    assert log_c == log_e
    assert repr(err_c) == repr(err_e)
    if err_e is None:
        torch.testing.assert_close(got, want)


_GLOBAL_LOG = []


@contextlib.contextmanager
def _logged(tag):
    _GLOBAL_LOG.append(f"enter {tag}")
    try:
        yield len(_GLOBAL_LOG)
    finally:
        _GLOBAL_LOG.append(f"exit {tag}")


def returns_inside_contextmanager(x):
    with _logged("r") as k:
        return x * k


def cudnn_flags_ctc(lp, targets, in_lens, tgt_lens):
    """wav2vec2's loss (transformers' ForCTCLoss): ``ctc_loss`` is a break (data-dependent) inside the block."""
    with torch.backends.cudnn.flags(enabled=False):
        return torch.nn.functional.ctc_loss(lp, targets, in_lens, tgt_lens, zero_infinity=True)


def cudnn_flags_no_break(x):
    with torch.backends.cudnn.flags(enabled=False, deterministic=True):
        y = x * 2 + torch.backends.cudnn.deterministic
    return y + torch.backends.cudnn.enabled


def _cudnn_state():
    return torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic


def test_contextmanager_return_inside_one_graph():
    """FINDINGS_75 #5: a generator-based context manager entered and left (by a ``return``) in the frame."""
    x = torch.randn(3)
    _GLOBAL_LOG.clear()
    want, log_e = returns_inside_contextmanager(x), list(_GLOBAL_LOG)
    _GLOBAL_LOG.clear()
    cnt = CompileCounter()
    torch.testing.assert_close(coil.compile(returns_inside_contextmanager, backend=cnt)(x), want)
    assert _GLOBAL_LOG == log_e == ["enter r", "exit r"] and cnt.frame_count == 1
    assert coil.capture.stats["graph_breaks"] == 0 and coil.capture.stats["fallbacks"] == 0


def test_contextmanager_break_inside_resumes():
    """A break inside the block: the frame breaks at the ``with`` (the generator starts for real) and resumes."""
    x, log_e, log_c = torch.randn(3), [], []
    want = contextmanager_with_break(x, log_e)
    torch.testing.assert_close(coil.compile(contextmanager_with_break)(x, log_c), want)
    assert log_c == log_e and coil.capture.stats["fallbacks"] == 0


def test_cudnn_flags_around_ctc_loss_matches_eager():
    """FINDINGS_75 #5 (wav2vec2's CTC loss): captured, not run eagerly; value, gradient and cudnn's switches as eager."""
    torch.manual_seed(0)
    lp = torch.randn(12, 2, 5).log_softmax(-1).requires_grad_()
    args = (torch.randint(1, 5, (2, 4)), torch.full((2,), 12), torch.tensor([4, 3]))
    before = _cudnn_state()
    lp2 = lp.detach().clone().requires_grad_()
    got = coil.compile(cudnn_flags_ctc)(lp, *args)
    assert _cudnn_state() == before
    want = cudnn_flags_ctc(lp2, *args)
    got.backward()
    want.backward()
    assert torch.equal(got, want) and torch.equal(lp.grad, lp2.grad)
    assert coil.capture.stats["fallbacks"] == 0


def test_cudnn_flags_set_and_restored_in_one_graph():
    """The switches are no graph ops: set at trace time and undone after it; reads are guarded (a changed switch
    recompiles), and the frame leaves them as eager does."""
    x = torch.randn(3)
    cnt = CompileCounter()
    f = coil.compile(cudnn_flags_no_break, backend=cnt)
    before = _cudnn_state()
    try:
        for enabled in (before[0], not before[0]):
            torch.backends.cudnn.enabled = enabled
            torch.testing.assert_close(f(x), cudnn_flags_no_break(x))
            assert _cudnn_state() == (enabled, before[1])
            got = f(x)
            assert _cudnn_state() == (enabled, before[1])
            torch.testing.assert_close(got, cudnn_flags_no_break(x))
        assert cnt.frame_count == 2 and coil.capture.stats["graph_breaks"] == 0
    finally:
        torch.backends.cudnn.enabled = before[0]
