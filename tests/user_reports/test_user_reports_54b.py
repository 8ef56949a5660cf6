"""Regressions from new-user trial 54b (FINDINGS_54b.md): adversarial programs against the day's changes
(torch.inference_mode blocks, os.getenv guards, inspect.Signature.bind, autograd.Function container arguments,
symbolic powers, activation checkpointing, training graphs reading changing Python floats)."""
import copy
import functools
import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

import coil


def _grads(fn, cf, make, calls):
    """Run ``fn`` eagerly and ``cf`` compiled on deep copies of ``make(i)`` for each call; backward through the sum
    of the first output; compare outputs and the ``.grad`` of every tensor argument that requires grad."""
    for i in range(calls):
        args = make(i)
        ae, ac = copy.deepcopy(args), copy.deepcopy(args)
        want, got = fn(*ae), cf(*ac)
        w0 = want[0] if isinstance(want, tuple) else want
        g0 = got[0] if isinstance(got, tuple) else got
        torch.testing.assert_close(g0, w0)
        w0.sum().backward()
        g0.sum().backward()
        for a, b in zip(ae, ac):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                torch.testing.assert_close(b.grad, a.grad)


# ----------------------------------------------------------------------------- open (xfail, strict)


class _CfgFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        ctx.cfg = cfg
        return x * cfg["a"]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.cfg["a"], None


@pytest.mark.parametrize("where", ["in_frame", "after_call", "returned", "after_a_break"])
def test_autograd_function_dict_argument_mutated_before_backward(where, coil_reset):
    """FINDINGS_54b #9 (fixed): the node rebuilds the dict, so the compiled backward read the forward's values; a dict
    the ctx keeps that the caller passed is now a graph break at the call, one made in the frame too once it is
    changed or leaves the frame (returned, or live at a later break)."""
    def in_frame(x, k):
        cfg = {"a": k}
        out = _CfgFn.apply(x, cfg)
        cfg["a"] = 100.0
        return out

    def after_call(x, cfg):
        return _CfgFn.apply(x, cfg)

    def returned(x, k):
        cfg = {"a": k}
        return _CfgFn.apply(x, cfg), cfg

    def after_a_break(x, k):
        cfg = {"a": k}
        out = _CfgFn.apply(x, cfg)
        torch._dynamo.graph_break()
        cfg["a"] = 100.0
        return out
    fn = {"in_frame": in_frame, "after_call": after_call, "returned": returned, "after_a_break": after_a_break}[where]
    grads = []
    for f in (fn, coil.compile(fn)):
        x = torch.ones(3, requires_grad=True)
        cfg = {"a": 2.0} if where == "after_call" else 2.0
        out = f(x, cfg)
        if where == "returned":
            out, cfg = out
        if where in ("after_call", "returned"):
            cfg["a"] = 7.0
        out.sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("backend", ["coil", "eager"])
def test_checkpoint_body_closing_over_a_tensor_written_later(backend, coil_reset):
    """FINDINGS_54b #10 (fixed): the joint trace finds the region's input written and runs the graph eagerly, but the
    captured graph ran the region's nodes without checkpointing (autograd's version error); eager runs of a captured
    graph now run each region through torch.utils.checkpoint (coil.aot.functional.run_eagerly)."""
    from torch.utils.checkpoint import checkpoint

    def fn(x):
        buf = torch.zeros(4, 6)
        out = checkpoint(lambda a: a * buf, x, use_reentrant=False)
        buf.add_(3)
        return out
    grads = []
    for f in (fn, coil.compile(fn, backend=backend)):
        x = torch.ones(4, 6, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f(x).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("backend", ["coil", "eager"])
def test_checkpoint_body_writing_its_input_raises_in_backward_as_eager(backend, coil_reset):
    """FINDINGS_54b #11 (fixed): a save of the region was unwritten, so the joint trace read it before noticing that
    the region's input had been written (eager's checkpoint refuses that in backward); it now checks the inputs
    first, and the graph runs eagerly with the region checkpointed."""
    from torch.utils.checkpoint import checkpoint

    def body(a):
        a.mul_(2)
        return a.sin()

    def fn(x):
        return checkpoint(body, x * 1, use_reentrant=False)
    x = torch.randn(4, 6, requires_grad=True)
    with pytest.raises(RuntimeError):
        fn(x).sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coil.compile(fn, backend=backend)(x).sum().backward()


def test_int_of_a_changing_float_compiles(coil_reset):
    """FINDINGS_54b #12 (fixed): the backward reads the forward's ``int(k * 10)`` as a SymInt input whose expression
    holds the float's symbol, which no input of the backward defines; the wrapper now binds that precomputed size
    from the input itself (code generation failed and the FX interpreter ran the graph)."""
    fn = lambda x, k: x * int(k * 10)  # noqa: E731
    cf = coil.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in (0.5, 0.7, 0.9):
            x, xr = torch.randn(4, requires_grad=True), None
            xr = x.detach().clone().requires_grad_(True)
            torch.testing.assert_close(cf(x, k), fn(xr, k))
            cf(x, k).sum().backward()
            fn(xr, k).sum().backward()
            torch.testing.assert_close(x.grad, xr.grad)


@pytest.mark.parametrize("case", ["(-s)**s", "(1-s)**s", "0**(s-3)"])
def test_symbolic_power_of_a_symbolic_base_compiles(case, coil_reset):
    """FINDINGS_54b #13 (fixed): the int64 check of ``b ** s`` asked torch's value ranges about a base that may be
    negative, which recurse (code generation failed, the FX interpreter ran the graph); it now bounds ``|b| ** s``."""
    fn = {"(-s)**s": lambda x: x * ((-x.shape[0]) ** x.shape[0]),
          "(1-s)**s": lambda x: x * ((1 - x.shape[0]) ** x.shape[0]),
          "0**(s-3)": lambda x: x * (0 ** (x.shape[0] - 3))}[case]
    cf = coil.compile(fn, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (4, 3, 5):
            x = torch.ones(n, 2)
            torch.testing.assert_close(cf(x), fn(x))


# ----------------------------------------------------------------------------- fixed here


class _MulK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k * 2, None


def test_autograd_function_of_a_symbolic_float_expression_compiles(coil_reset):
    """FINDINGS_54b #1: ``apply(x, k * 3 - 1)``: the probe of the formula made the expression's node and erased it;
    the apply node then read the erased node (BackendCompilerFailed, UnboundLocalError 'sub')."""
    fn = lambda x, k: _MulK.apply(x, k * 3 - 1)  # noqa: E731
    x = torch.randn(4, requires_grad=True)
    _grads(fn, coil.compile(fn), lambda i: [x, 0.5 + 0.2 * i], 3)
    assert coil.capture.stats["frames"] == 2 and coil.capture.stats["eager_limit"] == 0


class _TwoOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        return x * k, k * 2

    @staticmethod
    def backward(ctx, g, gk):
        return g * 2, None


def test_autograd_function_returning_a_symbolic_float_compiles(coil_reset):
    """FINDINGS_54b #2: a non-tensor output computed from a changing float (``k * 2``) was inlined into the graph as
    the text of its symbol (BackendCompilerFailed, NameError 'zf6')."""
    def fn(x, k):
        out, kk = _TwoOut.apply(x, k)
        return out * kk, kk
    x = torch.randn(4, requires_grad=True)
    cf = coil.compile(fn)
    _grads(fn, cf, lambda i: [x, 0.5 + 0.2 * i], 3)
    assert cf(x, 0.25)[1] == 0.5
    assert coil.capture.stats["frames"] == 2 and coil.capture.stats["eager_limit"] == 0


def test_inference_tensor_written_into_a_normal_tensor_compiles(coil_reset):
    """FINDINGS_54b #3: ``t.copy_(z)`` / ``t.add_(z)`` / ``t += z`` with ``z`` made in ``torch.inference_mode()`` and
    ``t`` a normal tensor (eager allows it: only a write of an inference tensor is refused) ran the frame eagerly."""
    def fn(y):
        with torch.inference_mode():
            z = y * 2
        t = torch.zeros(4, 6)
        t.copy_(z)
        u = y.clone()
        u.add_(z)
        u += z
        return t, u, u.is_inference()
    y = torch.randn(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = coil.compile(fn)(y)
    want = fn(y)
    torch.testing.assert_close(got[:2], want[:2])
    assert got[2] is want[2] is False and not got[0].is_inference()
    assert coil.capture.stats["fallbacks"] == 0 and coil.capture.stats["graphs"] == 1


def test_inference_tensor_written_in_place_outside_the_block_raises_as_eager(coil_reset):
    """The control of the test above: writing the inference tensor itself (or a view of it) raises eager's
    RuntimeError."""
    def fn(y):
        with torch.inference_mode():
            z = y * 2
        z[0].add_(1)
        return z
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coil.compile(fn)(torch.randn(4, 6))


def _inner(a, b=2.0, c=1.0):
    return a * b + c


_SIG = inspect.signature(_inner)


def _rebinding(fn):
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ba = sig.bind(*args, **kwargs)
        ba.apply_defaults()
        ba.arguments["x"] = ba.arguments["x"] * 2
        return fn(*ba.args, **ba.kwargs)
    return wrapper


@_rebinding
def _scaled(x, y, *, k=0.5):
    return x * k + y


@pytest.mark.parametrize("case", ["global", "decorator"])
def test_bind_of_a_signature_made_outside_the_frame_compiles_once(case, coil_reset):
    """FINDINGS_54b #4: the fast guard read a Signature's ``_parameters`` (a __slots__ attribute) as
    ``sig.__dict__['_parameters']``, a rewrite meant for nn.Modules: the guard raised on every call, a recompile per
    call, then eager execution (warned). A decorator that rebinds its arguments is the common shape."""
    fn = (lambda x, y: _inner(*_SIG.bind(x, c=y).args)) if case == "global" else \
        (lambda x, y: _scaled(x, y=y, k=1.5) + _scaled(y, x))
    cf = coil.compile(fn)
    x, y = torch.randn(3), torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(10):
            torch.testing.assert_close(cf(x, y), fn(x, y))
    assert coil.capture.stats["frames"] == 1, coil.capture.stats


@pytest.mark.parametrize("backend", ["coil", "eager", "aot_eager"])
def test_negative_constant_to_a_symbolic_power_keeps_its_sign(backend, coil_reset):
    """FINDINGS_54b #5 (silent wrong value, also in torch.compile): ``(-2) ** x.shape[0]`` with a dynamic size became
    ``operator.pow(-2, s)``, which FX's generated code prints as ``-2 ** s``, i.e. ``-(2 ** s)``: 4 rows gave -16
    where eager gives 16. coil's code generation also failed on it (torch's value ranges recursed)."""
    fn = lambda x: x * ((-2) ** x.shape[0])  # noqa: E731
    cf = coil.compile(fn, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error" if backend == "coil" else "ignore")
        for n in (4, 3, 6, 5):
            x = torch.ones(n, 2)
            torch.testing.assert_close(cf(x), fn(x))


def _writes_after_save(x, w):
    h = x @ w
    s = h.sin()
    h.mul_(3)   # after the last save: eager's recomputation without early stop replays it into the saved h
    return s + h


def test_checkpoint_under_set_checkpoint_early_stop_entered_in_the_frame_has_eager_gradients(coil_reset):
    """FINDINGS_54b #6 (silent wrong gradient): ``with set_checkpoint_early_stop(False):`` entered inside the compiled
    function was traced as a pending store to the module's flag; the checkpoint read the real flag (still None) and
    compiled, with gradients unlike eager's recomputation. It now runs as eager does (the frame runs eagerly)."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    def fn(x, w):
        with set_checkpoint_early_stop(False):
            return checkpoint(_writes_after_save, x, w, use_reentrant=False)
    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 6, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _grads(fn, coil.compile(fn), lambda i: [x, w], 2)


def test_checkpoint_after_set_checkpoint_early_stop_exited_compiles(coil_reset):
    """The control: once the block has exited (the flag restored), the checkpoint compiles in one graph."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    def fn(x, w):
        with set_checkpoint_early_stop(False):
            pass
        return checkpoint(lambda a, b: (a @ b).sin(), x, w, use_reentrant=False)
    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 6, requires_grad=True)
    _grads(fn, coil.compile(fn), lambda i: [x, w], 2)
    assert coil.capture.stats["graphs"] == 1 and coil.capture.stats["graph_breaks"] == 0


def test_a_size_to_a_large_constant_power_is_not_wrapped_to_int64(coil_reset):
    """FINDINGS_54b #7 (silent wrong value): ``x * x.shape[0] ** 40`` was computed in int64 by the kernel: 3 rows gave
    -6.29e18 where eager gives 1.2158e19 (3 ** 40 > 2 ** 63), and 5 rows gave a value where eager raises
    OverflowError. The power is now guarded to fit int64; beyond it the graph runs as Python, as eager."""
    fn = lambda x: x * (x.shape[0] ** 40)  # noqa: E731
    cf = coil.compile(fn, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (2, 3, 2):
            x = torch.ones(n, 2)
            torch.testing.assert_close(cf(x), fn(x))
        with pytest.raises(OverflowError):
            fn(torch.ones(5, 2))
        with pytest.raises(OverflowError):
            cf(torch.ones(5, 2))


def test_detach_of_an_inference_tensor_is_an_inference_tensor(coil_reset):
    """FINDINGS_54b #8: ``z.detach()`` (and ``.data``) of a tensor made in ``torch.inference_mode()``, outside the
    block, is an inference tensor in eager; coil returned a normal tensor (``is_inference()`` False). Eager writes it
    in place (unlike a view of it) but refuses it in autograd-recorded math."""
    def fn(y):
        with torch.inference_mode():
            z = y.clone()
        w = z.detach()
        return w, w.is_inference(), z.data.is_inference()
    y = torch.randn(4, 6)
    got, want = coil.compile(fn)(y), fn(y)
    assert got[0].is_inference() and want[0].is_inference()
    assert got[1:] == want[1:] == (True, True)

    def writes(y):
        with torch.inference_mode():
            z = y.clone()
        w = z.detach()
        w.add_(1)
        return w
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = coil.compile(writes)(y)
    torch.testing.assert_close(got, writes(y))
    assert got.is_inference()

    def records(y, x):
        with torch.inference_mode():
            z = y.clone()
        return z.detach() * x
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coil.compile(records)(y, torch.randn(4, 6, requires_grad=True)).sum().backward()


# ----------------------------------------------------------------------------- guards of what passed


def test_getenv_value_changes_recompile_with_the_new_behaviour(coil_reset, monkeypatch):
    """os.getenv / os.environ.get: unset, empty and set values each give eager's branch on the next call."""
    import os

    def fn(x):
        v = os.getenv("COIL_54B_PROBE")
        w = os.environ.get("COIL_54B_PROBE", "7")
        return x + (0 if v is None else len(v) + 10) + (float(w) if w else -1.0)
    cf = coil.compile(fn)
    x = torch.randn(3)
    for v in (None, "", "3", None, "25", ""):
        if v is None:
            monkeypatch.delenv("COIL_54B_PROBE", raising=False)
        else:
            monkeypatch.setenv("COIL_54B_PROBE", v)
        torch.testing.assert_close(cf(x), fn(x))
    assert coil.capture.stats["eager_limit"] == 0 and coil.capture.stats["fallbacks"] == 0


@pytest.mark.parametrize("case", ["missing", "multiple", "too_many", "posonly_as_kw"])
def test_bind_errors_raise_type_error_as_eager(case, coil_reset):
    def h(a, /, b, *, c):
        pass
    sig = inspect.signature(h)
    call = {"missing": lambda x: sig.bind(x, x), "multiple": lambda x: sig.bind(x, x, b=x, c=1),
            "too_many": lambda x: sig.bind(x, x, x, c=1), "posonly_as_kw": lambda x: sig.bind(a=x, b=x, c=1)}[case]

    def fn(x):
        call(x)
        return x + 1
    with pytest.raises(TypeError):
        fn(torch.randn(2))
    with pytest.raises(TypeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coil.compile(fn)(torch.randn(2))


class _DictFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        ctx.cfg = cfg
        return x * cfg["a"] + cfg["b"][0]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.cfg["a"] * ctx.cfg["b"][1], None


def test_autograd_function_dict_of_changing_floats_uses_the_current_values(coil_reset):
    fn = lambda x, y, k: _DictFn.apply(x, {"a": k, "b": [k * 2, k + 1]}) * y  # noqa: E731
    x, y = torch.randn(5, 6, requires_grad=True), torch.randn(5, 6)
    _grads(fn, coil.compile(fn), lambda i: [x, y, (0.3, -0.7, 1.9, 0.05)[i]], 4)
    assert coil.capture.stats["frames"] == 2


@pytest.mark.parametrize("case", ["2**s", "s**2", "(-s)**3", "(-1)**s"])
def test_symbolic_int_powers_equal_eager(case, coil_reset):
    fn = {"2**s": lambda x: x * (2 ** x.shape[0]), "s**2": lambda x: x.new_ones(x.shape[0] ** 2) * x.sum(),
          "(-s)**3": lambda x: x * ((-x.shape[0]) ** 3), "(-1)**s": lambda x: x * ((-1) ** x.shape[0])}[case]
    cf = coil.compile(fn, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (3, 4, 5, 6):
            x = torch.ones(n, 2)
            torch.testing.assert_close(cf(x), fn(x))


def test_training_step_with_a_scheduled_lr_and_a_changing_float(coil_reset):
    """AdamW under a StepLR schedule, the loss scaled by a float changing every step: parameters equal eager's."""
    torch.manual_seed(0)
    m0 = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    params = []
    for compiled in (False, True):
        m = copy.deepcopy(m0)
        opt = torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
        fwd = lambda x, y, k: F.mse_loss(F.leaky_relu(m(x), k) * k, y)  # noqa: E731
        f = coil.compile(fwd) if compiled else fwd
        torch.manual_seed(1)
        for i in range(4):
            f(torch.randn(5, 6), torch.randn(5, 2), 0.1 + 0.2 * i).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        params.append(list(m.parameters()))
    for a, b in zip(*params):
        torch.testing.assert_close(b, a)


def test_nested_checkpoint_with_dropout_matches_eager_with_fallback_random(coil_reset):
    from torch.utils.checkpoint import checkpoint

    def inner(a, w):
        return F.dropout(a @ w, 0.5, training=True).tanh()

    def fn(x, w):
        return checkpoint(lambda a, b: checkpoint(inner, a, b, use_reentrant=False) * a, x, w, use_reentrant=False)
    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 6, requires_grad=True)
    with coil.config.patch(fallback_random=True):
        cf = coil.compile(fn)
        for _ in range(2):
            ae, ac = copy.deepcopy([x, w]), copy.deepcopy([x, w])
            torch.manual_seed(5)
            fn(*ae).sum().backward()
            state = torch.get_rng_state()
            torch.manual_seed(5)
            cf(*ac).sum().backward()
            assert torch.equal(torch.get_rng_state(), state)
            for a, b in zip(ae, ac):
                torch.testing.assert_close(b.grad, a.grad)
