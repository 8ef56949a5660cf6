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


# ---------------------------------------------------------------------------------------------------------------
# Graph breaks inside torch.autocast (FINDINGS_75 #2: the whole frame ran eagerly, with a warning). The graph before
# the break closes the block, the entry enters it for real, the resume function traces its __exit__.
# ---------------------------------------------------------------------------------------------------------------

def _autocast_state():
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")] + \
        [torch.is_autocast_cache_enabled(), nesting, torch.is_grad_enabled()]


def break_in_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        print("coil-block", end="\r")
        z = y @ w
    return z.float().sum(), y, z, x @ w


def break_in_autocast_off_inside_on(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        with torch.autocast("cpu", enabled=False):
            b = x @ w
            print("coil-block", end="\r")
            c = b @ w
        d = c @ w
        print("coil-block", end="\r")
        e = d @ w
    return a, b, c, d, e, torch.is_autocast_enabled("cpu")


def break_in_cpu_autocast_inside_cuda(x, w):
    with torch.autocast("cuda", dtype=torch.float16):
        with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
            y = x @ w
            print("coil-block", end="\r")
            z = y @ w
        q = z.float() @ w
    return y, z, q, torch.get_autocast_dtype("cpu")


def break_in_amp_autocast(x, w):
    with torch.amp.autocast("cpu"):
        y = x @ w
        print("coil-block", end="\r")
        z = (y @ w).relu()
    return z, torch.get_autocast_dtype("cpu")


@torch.autocast("cpu", dtype=torch.bfloat16)
def _autocast_decorated(x, w):
    y = x @ w
    print("coil-block", end="\r")
    return y @ w


def calls_autocast_decorated(x, w):
    return _autocast_decorated(x + 1, w) * 2, x @ w


class _Boom(Exception):
    pass


def raise_after_break_in_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        print("coil-block", end="\r")
        if (y @ w).dtype == torch.bfloat16:
            raise _Boom("after the break")
    return y


def break_in_autocast_in_no_grad(x, w):
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
            print("coil-block", end="\r")
            z = y @ w
        u = z.float() @ w
    return y, z, u, x @ w


def _run(fn, x, w):
    try:
        return fn(x, w), None
    except _Boom as e:
        return None, str(e)


@pytest.mark.parametrize("fn", [break_in_autocast, break_in_autocast_off_inside_on, break_in_cpu_autocast_inside_cuda,
                                break_in_amp_autocast, calls_autocast_decorated, raise_after_break_in_autocast,
                                break_in_autocast_in_no_grad])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_break_in_autocast_equals_eager(fn, backend):
    """Values, dtypes, requires_grad, gradients, exceptions and the autocast state after the call (enabled and dtype
    per device, cache, nesting) equal eager's, on the first call and the cached one; the frame is not run eagerly."""
    cf = coil.compile(fn, backend=backend)
    for call in range(2):
        x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
        before = _autocast_state()
        want, want_exc = _run(fn, x, w)
        assert _autocast_state() == before
        got, got_exc = _run(cf, x, w)
        assert _autocast_state() == before and got_exc == want_exc
        assert coil.capture.stats["fallbacks"] == 0 and coil.capture.stats["graphs"] >= 2
        if want is None:
            continue
        _same(got, want)
        for g, v in zip(got, want):
            assert not isinstance(v, torch.Tensor) or g.dtype == v.dtype
        outs = [(g, v) for g, v in zip(got, want) if isinstance(v, torch.Tensor) and v.requires_grad]
        if outs:
            gx, gw = torch.autograd.grad(sum(v.float().sum() for _, v in outs), (x, w))
            cx, cw = torch.autograd.grad(sum(g.float().sum() for g, _ in outs), (x, w))
            # (eager's autocast cache shares one bf16 copy of w between its uses: its gradient sums in bf16)
            torch.testing.assert_close(cx, gx, rtol=1e-2, atol=1e-2 * gx.abs().max().item())
            torch.testing.assert_close(cw, gw, rtol=1e-2, atol=1e-2 * gw.abs().max().item())


def test_break_in_autocast_compiles_both_halves():
    """The finding's repro with the full pipeline: two graphs, the first closing the autocast block it entered."""
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    got, want = coil.compile(break_in_autocast)(x, w), break_in_autocast(x, w)
    _same(got, want)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    assert not torch.is_autocast_enabled("cpu")
    assert coil.capture.stats["graphs"] == 2 and coil.capture.stats["fallbacks"] == 0
    e = coil.explain(break_in_autocast, x, w)
    assert e.graph_count == 2 and e.graph_break_count == 1 and not e.eager_frames
    targets = [n.target for n in e.graphs[0].graph.nodes if n.op == "call_function"]
    assert targets[0] is torch.amp.autocast_mode._enter_autocast
    assert targets[-1] is torch.amp.autocast_mode._exit_autocast


def break_in_inference_mode(x):
    with torch.inference_mode():
        y = x * 2
        print("coil-block", end="\r")
        z = y + 1
    return z


def test_explain_says_a_frame_runs_eagerly():
    """A break coil cannot resume (inside inference_mode): explain names the frame that runs eagerly and why, and
    counts no graph for it, as compile does."""
    x = torch.randn(3)
    e = coil.explain(break_in_inference_mode, x)
    assert e.graph_count == 0 and e.graph_break_count == 1
    [(frame, reason)] = e.eager_frames
    assert "break_in_inference_mode" in frame and "inference_mode" in reason
    assert "Runs eagerly, uncompiled" in str(e)
