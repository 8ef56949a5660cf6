"""Regressions from new-user trial 54 (FINDINGS_54.md): training-loop programs, data-dependent sizes, Python
generators and context managers, torch.func inside a compiled frame.

The xfail(strict=True) tests are open bugs: each fails today and starts passing (so must lose its mark) once fixed.
"""
import contextlib
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


from report_helpers import run_warned as _run


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed): a size made from .item() plus a constant was computed before the .item() ran (UnboundLocalError)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_arange_of_an_item_plus_one(coil_reset, backend):
    def f(x):
        return torch.arange(int(x.max().item()) + 1).float() * x.mean()

    for x in (torch.tensor([2.5, 1.0]), torch.tensor([4.0, 0.5, 1.0])):
        out, warned = _run(f, x, capture_scalar_outputs=True, cpu_backend=backend)
        torch.testing.assert_close(out, f(x))
        assert not warned


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed): repeat of an empty tensor failed code generation (i % 0) and ran in the FX interpreter
# ---------------------------------------------------------------------------------------------------------------

def test_repeat_of_an_empty_dim_compiles(coil_reset):
    f = lambda x: x.repeat(2, 1) + 1  # noqa: E731
    x = torch.randn(0, 2)
    out, warned = _run(f, x, strict_codegen=True)
    assert out.shape == (0, 2) and not warned


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed): torch.compile(opt.step, backend="coil") with an LR scheduler failed on the lr's .item()
# ---------------------------------------------------------------------------------------------------------------

def test_torch_compile_of_an_optimizer_step_with_a_changing_lr(coil_reset, dynamo_reset):
    torch.manual_seed(0)
    ref = nn.Linear(4, 2)
    models = [ref, copy.deepcopy(ref)]
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01, foreach=True) for m in models]
    scheds = [torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5) for o in opts]
    steps = [opts[0].step, torch.compile(opts[1].step, backend="coil")]
    for _ in range(3):
        x = torch.randn(3, 4)
        for m, o, s, step in zip(models, opts, scheds, steps):
            m(x).pow(2).sum().backward()
            step()
            o.zero_grad()
            s.step()
    for p, q in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed): the backward of Embedding(sparse=True) raised "Cannot access storage of SparseTensorImpl"
# ---------------------------------------------------------------------------------------------------------------

def test_sparse_embedding_gradient(coil_reset):
    torch.manual_seed(0)
    e1 = nn.Embedding(10, 4, sparse=True)
    e2 = copy.deepcopy(e1)
    ids = torch.tensor([[1, 2, 2], [3, 9, 1]])
    e1(ids).pow(2).sum().backward()
    coil.compile(lambda i: e2(i).pow(2).sum())(ids).backward()
    assert e2.weight.grad.layout == torch.sparse_coo
    torch.testing.assert_close(e2.weight.grad.to_dense(), e1.weight.grad.to_dense())


# ---------------------------------------------------------------------------------------------------------------
# Finding 5 (fixed): a backward whose tangent is sized ``a*u0 + c`` (an .item()-sized output) ran in the FX interpreter
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [lambda m: m + 1, lambda m: 2 * m + 2], ids=["u+1", "2u+2"])
def test_segment_sum_sized_by_an_item_trains_compiled(coil_reset, rows):
    def f(x, dst):
        n = rows(int(dst.max().item()))
        return torch.zeros(n, x.shape[1]).index_add_(0, dst, x)

    x = torch.randn(5, 3, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    dst = torch.tensor([0, 2, 2, 1, 3])
    out, warned = _run(f, x2, dst, capture_scalar_outputs=True, strict_codegen=True)
    ref = f(x, dst)
    torch.testing.assert_close(out, ref)
    ref.pow(2).sum().backward()
    out.pow(2).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad)
    assert not warned


# ---------------------------------------------------------------------------------------------------------------
# Finding 6 (send fixed): generator.send / close in traced code ran the whole frame eagerly
# ---------------------------------------------------------------------------------------------------------------

def _gen(x):
    for i in range(3):
        y = yield x * i
        if y is not None:
            x = x + y


def _accumulate():
    total = 0
    while True:
        v = yield total
        if v is None:
            break
        total = total + v


def test_generator_send_is_captured(coil_reset):
    def f(x):
        it = _gen(x)
        a = next(it)
        b = it.send(1.0)
        acc = _accumulate()
        next(acc)
        outs = [acc.send(x * i) for i in range(3)]
        return a + b + next(it), outs

    x = torch.randn(3)
    out, warned = _run(f, x)
    ref = f(x)
    torch.testing.assert_close(out[0], ref[0])
    for o, r in zip(out[1], ref[1]):
        torch.testing.assert_close(o, r)
    assert not warned and coil.capture.stats["fallbacks"] == 0 and coil.capture.stats["graph_breaks"] == 0


def test_generator_send_to_a_new_generator_raises_like_eager(coil_reset):
    def f(x):
        return _accumulate().send(x)

    with pytest.raises(TypeError):
        f(torch.ones(2))
    with pytest.raises(TypeError):
        coil.compile(f)(torch.ones(2))


def test_generator_close_is_captured(coil_reset):
    """FINDINGS_54 #6 (close fixed): ``close()`` raises GeneratorExit in the body at its ``yield``
    (``GeneratorVariable._throw``)."""
    def f(x):
        it = _gen(x)
        a = next(it)
        it.close()
        return a + 1

    x = torch.randn(3)
    out, warned = _run(f, x)
    torch.testing.assert_close(out, f(x))
    assert not warned and coil.capture.stats["fallbacks"] == 0


_LOG = []


def _guarded(x):
    try:
        yield x + 1
        yield x + 2
    except ValueError:
        yield x * 10
    finally:
        _LOG.append("finally")


@pytest.mark.parametrize("case", ["handled", "unhandled", "close_runs_finally", "close_unstarted"])
def test_generator_throw_runs_the_body_handlers(case, coil_reset):
    def f(x):
        it = _guarded(x)
        if case == "close_unstarted":
            it.close()
            return x * 2
        a = next(it)
        if case == "handled":
            return a + it.throw(ValueError("v"))    # (dropped suspended: closed at the return, its finally runs)
        if case == "close_runs_finally":
            it.close()
            return a * 3
        try:
            it.throw(KeyError("k"))
        except KeyError:
            return a - 1

    x = torch.randn(3)
    _LOG.clear()
    want, logged = f(x), list(_LOG)
    _LOG.clear()
    out, warned = _run(f, x)
    torch.testing.assert_close(out, want)
    assert _LOG == logged and not warned and coil.capture.stats["graph_breaks"] == 0


# ---------------------------------------------------------------------------------------------------------------
# Finding 7: an exception raised inside a @contextmanager block and caught outside runs the frame eagerly
# ---------------------------------------------------------------------------------------------------------------

_STATE = {"scale": 1.0}


@contextlib.contextmanager
def _scaled(s):
    old, _STATE["scale"] = _STATE["scale"], s
    try:
        yield s
    finally:
        _STATE["scale"] = old


def test_exception_through_a_contextmanager_is_captured(coil_reset):
    """FINDINGS_54 #7 (fixed): ``_GeneratorContextManager.__exit__`` calls ``gen.throw`` (now traced) and sets the
    exception's ``__traceback__`` (now allowed)."""
    def f(x):
        try:
            with _scaled(5.0):
                raise KeyError("k")
        except KeyError:
            pass
        return x * _STATE["scale"]

    x = torch.randn(3)
    out, warned = _run(f, x)
    torch.testing.assert_close(out, f(x))
    assert _STATE["scale"] == 1.0
    assert not warned and coil.capture.stats["fallbacks"] == 0


def test_contextmanager_restores_state_in_the_graph(coil_reset):
    def f(x):
        with _scaled(3.0) as s:
            y = x * _STATE["scale"] + s
        return y * _STATE["scale"]

    x = torch.randn(3)
    out, warned = _run(f, x)
    torch.testing.assert_close(out, f(x))
    assert _STATE["scale"] == 1.0 and not warned and coil.capture.stats["graph_breaks"] == 0


# ---------------------------------------------------------------------------------------------------------------
# Finding 8: contextlib.ExitStack breaks the graph four times (deque, sys.exc_info)
# ---------------------------------------------------------------------------------------------------------------

def test_exit_stack_has_no_graph_break(coil_reset):
    def f(x):
        with contextlib.ExitStack() as st:
            st.enter_context(_scaled(7.0))
            y = x * _STATE["scale"]
        return y, x * _STATE["scale"]

    x = torch.randn(3)
    out, _ = _run(f, x)
    for o, r in zip(out, f(x)):
        torch.testing.assert_close(o, r)
    assert coil.capture.stats["graph_breaks"] == 0 and _STATE["scale"] == 1.0


def test_deque_built_in_the_frame_is_traced(coil_reset):
    """FINDINGS_54 #8: a ``deque(maxlen=2)`` rolling buffer is one graph and comes back a deque with its maxlen;
    mutating one while iterating it raises eager's RuntimeError, and popping an empty one eager's IndexError."""
    import collections

    def roll(x):
        buf = collections.deque(maxlen=2)
        for i in range(4):
            buf.append(x * i)
        buf.appendleft(x)
        buf.rotate(1)
        return sum(buf), buf

    def mutates(x):
        d = collections.deque([1, 2])
        for _ in d:
            d.append(3)
        return x

    x = torch.randn(3)
    (s, buf), (rs, rbuf) = _run(roll, x)[0], roll(x)
    torch.testing.assert_close(s, rs)
    assert type(buf) is collections.deque and buf.maxlen == 2 and len(buf) == len(rbuf)
    for a, b in zip(buf, rbuf):
        torch.testing.assert_close(a, b)
    assert coil.capture.stats["graph_breaks"] == 0
    with pytest.raises(RuntimeError, match="deque mutated during iteration"):
        coil.compile(mutates)(x)
    with pytest.raises(IndexError, match="pop from an empty deque"):
        coil.compile(lambda t: (t, collections.deque().pop()))(x)


def test_deque_operators_are_not_list_operators(coil_reset):
    """A traced deque is no list under operators: ``deque == [1, 2]`` and ``== (1, 2)`` are False, ``d + d2`` and
    ``d * 2`` are deques that keep ``d``'s maxlen, ``d + [3]`` raises (the deque fuzz probe, 2026-12-06: coil gave
    True, True and lists, and concatenated the list)."""
    import collections
    D = collections.deque

    def f(x):
        return x + 1, D([1, 2]) == [1, 2], D([1, 2]) == (1, 2), D([1, 2], 3) + D([3, 4]), D([1, 2], 3) * 2

    x = torch.randn(3)
    out, ref = coil.compile(f)(x), f(x)
    assert out[1:3] == ref[1:3] == (False, False)
    for o, r in zip(out[3:], ref[3:]):
        assert type(o) is D and o.maxlen == r.maxlen == 3 and list(o) == list(r)
    with pytest.raises(TypeError, match="can only concatenate deque"):
        coil.compile(lambda t: (t, D([1]) + [2]))(x)


def test_list_and_deque_index_honour_start_and_stop(coil_reset):
    """``[1, 2, 1].index(1, 1)`` is 2: the traced ``index`` searched from 0 whatever its bounds (lists built in the
    frame and deques; found probing deques beside fuzz seed 1047)."""
    import collections

    def f(x):
        a, d = [1, 2, 1, 1], collections.deque([1, 2, 1])
        return x + 1, a.index(1, 1), a.index(1, -2, 4), d.index(1, 1), a.index(2, -9, 2)

    x = torch.randn(3)
    assert coil.compile(f)(x)[1:] == f(x)[1:] == (2, 2, 2, 1)


def test_sys_exc_info_sees_the_callers_exception(coil_reset):
    """``sys.exc_info()`` (ExitStack's ``__exit__``) folds to no exception, guarded: called from the caller's
    ``except`` block, eager's sees the caller's exception, and so does the compiled function."""
    import sys
    f = lambda x: (x + 1, sys.exc_info()[0])  # noqa: E731
    cf = coil.compile(f)
    x = torch.randn(3)
    assert cf(x)[1] is None
    try:
        raise ValueError("v")
    except ValueError:
        assert cf(x)[1] is f(x)[1] is ValueError
    assert cf(x)[1] is None


# ---------------------------------------------------------------------------------------------------------------
# Finding 9: torch.func.linearize inside a compiled function raises IndexError
# ---------------------------------------------------------------------------------------------------------------

def test_linearize_inside_a_compiled_function(coil_reset):
    """FINDINGS_54 #9 (fixed): capture ran linearize's ``jvp_fn`` on fake tensors as an op; its const-folded graph
    folded its constants on that first call (and failed on the fakes), leaving the real module without them. A torch
    function holding a module is now a graph break."""
    f = lambda x: torch.func.linearize(torch.sin, x)[1](torch.ones_like(x))  # noqa: E731
    x = torch.randn(3)
    torch.testing.assert_close(coil.compile(f)(x), f(x))
    _, jvp = torch.func.linearize(torch.sin, x)     # made eagerly, called in the compiled frame
    torch.testing.assert_close(coil.compile(lambda t: jvp(t))(torch.ones(3)), x.cos())


# ---------------------------------------------------------------------------------------------------------------
# Finding 10: Embedding(sparse=True, padding_idx=...) cannot be trained compiled
# ---------------------------------------------------------------------------------------------------------------

def _sparse_padding_idx_grads():
    torch.manual_seed(0)
    e1 = nn.Embedding(10, 4, sparse=True, padding_idx=0)
    e2 = copy.deepcopy(e1)
    ids = torch.tensor([1, 0, 2])
    e1(ids).sum().backward()
    coil.compile(lambda i: e2(i).sum())(ids).backward()
    return e2.weight.grad.to_dense(), e1.weight.grad.to_dense()


def test_sparse_embedding_with_padding_idx_trains(coil_reset):
    """FINDINGS_54 #10: the backward masks padding rows with ``nonzero``, a data-dependent size the joint trace cannot
    follow. It raised BackendCompilerFailed; the graph now runs eagerly, warned, with eager's gradients."""
    with pytest.warns(UserWarning, match="output size depends on data"):
        got, want = _sparse_padding_idx_grads()
    torch.testing.assert_close(got, want)


@pytest.mark.xfail(strict=True, reason="FINDINGS_54 #10: the sparse embedding backward with a padding_idx (a "
                                       "boolean-mask index) is not traced: the graph runs eagerly")
def test_sparse_embedding_with_padding_idx_trains_compiled(coil_reset):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _sparse_padding_idx_grads()


# ---------------------------------------------------------------------------------------------------------------
# Guards for what works
# ---------------------------------------------------------------------------------------------------------------

def test_whole_training_step_with_clipping_and_scheduler(coil_reset):
    """forward, backward, clip_grad_norm_, AdamW.step, zero_grad(set_to_none) and a scheduler in one compiled step."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    models = [ref, copy.deepcopy(ref)]
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in models]
    scheds = [torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5) for o in opts]

    def make_step(m, o):
        def step(x, y):
            loss = F.mse_loss(m(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            o.step()
            o.zero_grad(set_to_none=True)
            return loss
        return step

    steps = [make_step(models[0], opts[0]), coil.compile(make_step(models[1], opts[1]))]
    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randn(5, 2)
        losses = [s(x, y) for s in steps]
        torch.testing.assert_close(losses[1], losses[0])
        for s in scheds:
            s.step()
    for p, q in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5)
        assert q.grad is None


def test_stateful_module_python_state_across_calls(coil_reset):
    """A step counter, a tensor carried to the next call, a list and a dict of tensors, a float attribute and an EMA
    buffer, all updated in forward."""
    class Stateful(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.step, self.prev, self.cache, self.hist, self.scale = 0, None, [], {}, 1.0
            self.register_buffer("ema", torch.zeros(3))

        def forward(self, x):
            self.step += 1
            y = self.lin(x) * self.step
            if self.prev is not None:
                y = y + self.prev
            self.prev = y.detach()[0]
            self.cache.append(y.sum().detach())
            if len(self.cache) > 2:
                self.cache.pop(0)
            self.hist[self.step % 2] = y.mean().detach()
            self.ema.mul_(0.9).add_(0.1 * y.mean(0).detach())
            self.scale = self.scale * 1.5
            return y * self.scale + sum(self.cache) + sum(self.hist.values()) + self.ema

    torch.manual_seed(0)
    m = Stateful()
    mc = copy.deepcopy(m)
    cm = coil.compile(mc)
    for _ in range(6):
        x = torch.randn(2, 3)
        torch.testing.assert_close(cm(x), m(x), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mc.ema, m.ema)
    assert mc.step == 6 and coil.capture.stats["fallbacks"] == 0


@pytest.mark.parametrize("opts", [{}, {"fallback_random": True}])
def test_generator_argument_draws_like_eager(coil_reset, opts):
    """A torch.Generator argument: the values, its state after the call, and the global RNG left alone."""
    def f(x, g):
        return x + torch.rand(x.shape, generator=g) + torch.randperm(4, generator=g).float()

    x = torch.randn(4)
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(0)
    cf = coil.compile(f, options=opts)
    a, a2 = cf(x, g), cf(x, g)
    after = torch.rand(2)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(2))
    g.manual_seed(3)
    e, e2 = f(x, g), f(x, g)
    assert torch.equal(a, e) and torch.equal(a2, e2)


def test_grad_mode_mixes_inside_and_around_a_compiled_function(coil_reset):
    def f(x, w):
        with torch.enable_grad():
            y = (x * w).sum()
        with torch.no_grad():
            s = (x * w).sum()
        return y, x * w * s

    cf = coil.compile(f)
    for ctx in (torch.no_grad, contextlib.nullcontext, torch.no_grad):
        x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
        x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        with ctx():
            ref, out = f(x, w), cf(x2, w2)
        for r, o in zip(ref, out):
            assert r.requires_grad == o.requires_grad
            torch.testing.assert_close(o, r)
