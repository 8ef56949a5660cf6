"""Minimal repros from the fifteenth round of user testing: the trace-time cuDNN switch
(``coil/aot/functional.py`` ``without_cudnn_choices`` / ``_cudnn_enabled``, now
reference-counted under a lock), saved views of mutated inputs
(``coil/aot/compile.py`` ``_clone_saved_mutated_inputs``) and the skip of fake example
inputs in ``_refuse_mutated_aliased_inputs``, the module-frame ``capture_source``
artifact (``coil/capture/frame.py`` ``_source_of``), the demo's progress lines and
``coil demo --help``, and a few everyday torch.compile-user workflows; see FINDINGS_15.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with
the diagnosis, so it flips when fixed); the plain tests are compact versions of what was
verified to match eager. CPU only. Every test that changes the cuDNN flag or
``torch.backends.disable_global_flags()`` restores it.
"""
import copy
import functools
import io
import json
import os
import pickle
import threading
import types
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
from coil import trace
from coil.aot.backend import run_graph
from coil.aot.compile import aot_compile

from report_helpers import (assert_args_match, assert_grads_match, assert_outputs_match,
                            backward_both, rand, run_on_copies)

_get = torch._C._get_cudnn_enabled
_set = torch._C._set_cudnn_enabled


@pytest.fixture(autouse=True)
def _restore_cudnn_flag():
    before = _get()
    # torch.backends' module object is wrapped: assigning
    # torch.backends.__allow_nonbracketed_mutation_flag does not reach the global that
    # flags_frozen() reads, so restore it through that function's globals
    flag_globals = torch.backends.flags_frozen.__globals__
    locked = flag_globals["__allow_nonbracketed_mutation_flag"]
    # unlocked for the test: importing torch.testing._internal (the conformance tests
    # in this worker) calls disable_global_flags(), and the tests assign the flag
    flag_globals["__allow_nonbracketed_mutation_flag"] = True
    # torch.fx's own "is tracing" flag is saved/restored per trace like cuDNN's was: two
    # overlapping make_fx calls in threads (the thread tests below) leave it set
    import torch.fx._symbolic_trace as st
    fx_tracing = st._is_fx_tracing_flag
    yield
    _set(before)
    flag_globals["__allow_nonbracketed_mutation_flag"] = locked
    st._is_fx_tracing_flag = fx_tracing
    coil.reset()


def _quiet():
    warnings.simplefilter("ignore")


class _Interrupt(BaseException):
    """Like KeyboardInterrupt: not an Exception, so no `except Exception` catches it."""


@torch.library.custom_op("coil_ur15::boom_in_aot", mutates_args=())
def _boom_in_aot(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_boom_in_aot.register_fake
def _(x):
    # capture runs this with cuDNN on; coil's AOT trace runs it with cuDNN off
    if not _get():
        raise _Interrupt("interrupted inside the AOT trace")
    return torch.empty_like(x)


# --------------------------------------------------------------------------------------
# 1. the trace-time cuDNN switch
# --------------------------------------------------------------------------------------

def test_cudnn_flag_restored_after_compiles_that_raise():
    _quiet()

    def raises_base(x):
        raise _Interrupt()

    def raises_ki(x):
        raise KeyboardInterrupt

    with pytest.raises(_Interrupt):
        aot_compile(raises_base, [torch.randn(3)], run_graph)
    assert _get() is True
    with pytest.raises(KeyboardInterrupt):
        aot_compile(raises_ki, [torch.randn(3)], run_graph)
    assert _get() is True
    # raised by a fake kernel while coil's analysis runs, through the whole pipeline
    with pytest.raises(_Interrupt):
        coil.compile(lambda x: _boom_in_aot(x).sin())(torch.randn(3))
    assert _get() is True
    # a CoilError raised while the program is analysed

    def refused(x):
        raise coil.exc.CoilError("refused")
    with pytest.raises(coil.exc.CoilError, match="refused"):
        aot_compile(refused, [torch.randn(3)], run_graph)
    assert _get() is True
    from coil.aot import functional as Fn
    assert Fn._cudnn_users[0] == 0


def test_cudnn_flag_after_graph_break_nested_and_hook_compiles():
    _quiet()

    def brk(x):
        y = x.sin()
        print("", end="")
        return y.cos()
    x = torch.randn(4)
    torch.testing.assert_close(coil.compile(brk)(x), x.sin().cos())
    assert _get() is True
    inner = coil.compile(lambda t: t.exp())
    outer = coil.compile(lambda t: inner(t) * 2)
    torch.testing.assert_close(outer(x), x.exp() * 2)
    assert _get() is True
    lin = nn.Linear(4, 4)
    lin.register_forward_hook(lambda m, i, o: coil.compile(lambda t: t.relu() + 1)(o))
    xx = torch.randn(3, 4)
    torch.testing.assert_close(coil.compile(lin)(xx), F.linear(xx, lin.weight, lin.bias).relu() + 1)
    assert _get() is True


def test_cudnn_flag_user_false_stays_false():
    _quiet()
    _set(False)
    x = torch.randn(5, requires_grad=True)
    coil.compile(lambda t: (t.tanh() * 3).sum())(x).backward()
    assert _get() is False
    _set(True)

    def sets_it(t):
        torch.backends.cudnn.enabled = False
        return t * 2
    coil.compile(sets_it)(torch.randn(3))
    assert _get() is False


def test_cudnn_flag_with_global_flags_locked():
    _quiet()
    torch.backends.disable_global_flags()
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    ref = copy.deepcopy(m)
    x = torch.randn(2, 3, 8, 8)
    out, r = coil.compile(m)(x), ref(x)
    torch.testing.assert_close(out, r, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(m[1].running_mean, ref[1].running_mean)
    assert _get() is True
    assert torch.backends.flags_frozen()     # still locked: coil did not unlock it


def test_cudnn_flag_after_overlapping_traces_in_threads():
    """A's trace is inside when B's starts; A ends first, then B (the order that left
    the flag off before the reference count). Contexts only: two overlapping make_fx
    calls are not thread-safe in torch.fx itself (coil.compile serializes them)."""
    from coil.aot.functional import without_cudnn_choices
    a_in, b_in, a_done = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def ta():
        with without_cudnn_choices():
            seen.append(_get())
            a_in.set()
            b_in.wait(5)
        a_done.set()

    def tb():
        a_in.wait(5)
        with without_cudnn_choices():
            seen.append(_get())
            b_in.set()
            a_done.wait(5)
            seen.append(_get())      # A has left, B is still inside: still off

    ts = [threading.Thread(target=ta), threading.Thread(target=tb)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert seen == [False, False, False]
    assert _get() is True


def test_compile_in_thread_while_main_thread_runs_eager():
    """One coil.compile in a background thread while the main thread computes eagerly."""
    _quiet()
    res = {}
    x = torch.randn(4, 4, requires_grad=True)

    def bg():
        res["out"] = coil.compile(lambda t: (t.sin() @ t).relu().sum())(x)

    t = threading.Thread(target=bg)
    t.start()
    y = torch.randn(64, 64)
    for _ in range(20):
        y = (y @ y.t()).tanh()
    t.join()
    torch.testing.assert_close(res["out"], (x.sin() @ x).relu().sum())
    assert _get() is True


@pytest.mark.xfail(strict=True, reason="the last trace out restores the flag saved by the "
                   "first one in: a torch.backends.cudnn.enabled = False made by another "
                   "thread while a trace runs is silently reverted to True when it ends")
def test_cudnn_flag_set_by_other_thread_during_trace_is_kept():
    """A background thread is inside a trace (coil.compile's AOT stage, here the context
    it runs under); the main thread turns cuDNN off meanwhile."""
    from coil.aot.functional import without_cudnn_choices
    inside, go = threading.Event(), threading.Event()

    def trace_like():
        with without_cudnn_choices():
            inside.set()
            go.wait(5)

    t = threading.Thread(target=trace_like)
    t.start()
    assert inside.wait(5)
    torch.backends.cudnn.enabled = False   # the user's own choice, in the main thread
    go.set()
    t.join()
    assert _get() is False


def test_cudnn_flag_read_in_compiled_function_is_guarded():
    """Fixed: bool/int/float/str attributes of torch.backends modules are guarded when
    read (capture/variables/objects.py)."""
    _quiet()

    def f(x):
        return x + (1.0 if torch.backends.cudnn.enabled else -1.0)
    c = coil.compile(f)
    x = torch.randn(3)
    torch.testing.assert_close(c(x), f(x))
    _set(False)
    torch.testing.assert_close(c(x), f(x))


# --------------------------------------------------------------------------------------
# 2. saved views of mutated inputs, torch.compile with mutated inputs
# --------------------------------------------------------------------------------------

def _check(fn, args, backend="cpp", ctx=None, grad=True, tol=1e-5):
    out, ref, a_out, a_ref = run_on_copies(fn, args, backend, ctx=ctx)
    assert_outputs_match(out, ref, tol, tol, same=None)
    assert_args_match(a_ref, a_out, tol, tol)
    if grad and any(r.requires_grad for r in ref):
        backward_both(out, ref)
        assert_grads_match(a_ref, a_out, tol, tol, same=lambda a, b: True)


_SAVED_VIEWS = {
    "t_select": lambda x, y: (y.t()[0].mul_(x[:, 0]), x.sin())[1],
    "flat_step": lambda x, y: (y.view(-1)[::2].mul_(x.view(-1)[::2]), x.sin())[1],
    "diagonal": lambda x, y: (y.diagonal().mul_(x.diagonal()), x.sin())[1],
    "unfold": lambda x, y: (y.unfold(1, 2, 2).mul_(x.unfold(1, 2, 2)), x.sin())[1],
    "as_strided": lambda x, y: (y.as_strided((2, 2), (6, 2), 3).mul_(x[:2, :2]), x.sin())[1],
    "narrow": lambda x, y: (y.narrow(1, 1, 3).mul_(x[:, 1:4]), x.sin())[1],
    "view3_ellipsis": lambda x, y: (y.view(4, 3, 2)[..., 0].mul_(x[:, :3]), x.sin())[1],
    "movedim_slice": lambda x, y: (y.movedim(0, 1)[1:3].mul_(x.t()[1:3]), x.sin())[1],
    "unsqueeze_squeeze": lambda x, y: (y.unsqueeze(0).squeeze(0)[0].mul_(x[0]), x.sin())[1],
    "reshape_select": lambda x, y: (y.reshape(6, 4)[0].mul_(x[0, :4]), x.sin())[1],
    "select_select": lambda x, y: (y[1][2].mul_(x[1, 2]), x.sin())[1],
    "dtype_view": lambda x, y: (y.view(torch.float64)[0].mul_(x.double()[0, :3]), x.sin())[1],
    "addcmul": lambda x, y: y[0].addcmul_(x[0], x[1]).sum() + y.sum(),
    "div_exp": lambda x, y: y[:, 1].div_(x[:, 1].exp()).sum(),
    "mul_pow": lambda x, y: (y[0].mul_(x[0]).pow_(2), x.sin())[1],
    "chain_on_view": lambda x, y: (y.t()[0].mul_(x[:, 0]).add_(x[:, 1]).mul_(x[:, 2]), x.sum(0))[1],
    "zero_after": lambda x, y: (y.view(-1)[::2].mul_(x.view(-1)[::2]), y.zero_(), x.sin())[2],
    "out_alias_slice": lambda x, y: (y[1:].mul_(x[1:]), y[1:])[1],
    "out_alias_t": lambda x, y: y.t().mul_(x.t()).t()[0],
    "index_put_after": lambda x, y: (y[[0, 2]].mul_(x[[0, 2]]),
                                     y.index_put_((torch.tensor([1]),), x[1:2] * 2), x.sin())[2],
}


@pytest.mark.parametrize("name", sorted(_SAVED_VIEWS))
def test_saved_view_of_mutated_input(name):
    _quiet()
    _check(_SAVED_VIEWS[name], [rand(4, 6, grad=True), rand(4, 6)])


@pytest.mark.parametrize("backend", ["triton", "aot_eager"])
def test_saved_view_of_mutated_input_other_backends(backend):
    _quiet()
    for name in ("t_select", "as_strided", "out_alias_slice"):
        f = _SAVED_VIEWS[name]
        if backend == "aot_eager":
            x, y = rand(4, 6, grad=True), rand(4, 6)
            x2, y2 = x.detach().clone().requires_grad_(), y.clone()
            coil.reset()
            r, o = f(x, y), coil.compile(f, backend="aot_eager")(x2, y2)
            torch.testing.assert_close(o, r)
            torch.testing.assert_close(y2, y)
            g = torch.randn_like(r)
            r.backward(g)
            o.backward(g)
            torch.testing.assert_close(x2.grad, x.grad)
        else:
            _check(f, [rand(4, 6, grad=True), rand(4, 6)], backend=backend)


def test_several_mutated_inputs_and_views():
    _quiet()

    def two(x, y, z):
        y[0].mul_(x[0])
        z.t()[1].mul_(x[:, 1])
        return (x * 2).sum(1)

    def chained(x, y, z):
        y.mul_(x)
        z[1:].mul_(y[1:])
        return x.cos()

    def three_views(x, y):
        y[0].mul_(x[0])
        y[1].mul_(x[1])
        y.t()[2].mul_(x[2])
        return x.sin()

    def overlapping(x, y):
        y[:2].mul_(x[:2])
        y[1:3].mul_(x[1:3])
        return x.sin()

    def outs(x, y):
        v = y[:, 1:]
        v.mul_(x[:, 1:])
        return v, y.t(), y[0], x.exp()

    for f in (two, chained):
        _check(f, [rand(4, 4, grad=True), rand(4, 4), rand(4, 4)])
    for f in (three_views, overlapping, outs):
        _check(f, [rand(4, 4, grad=True), rand(4, 4)])


@pytest.mark.parametrize("backend", ["cpp", "aot_eager"])
def test_mutated_nonleaf_input_through_view(backend):
    _quiet()

    def f(x, y):
        y.t()[0].mul_(x[:, 0])
        return (y * x).sum()
    x, w = rand(4, 4, grad=True), rand(4, 4, grad=True)
    xa, xb = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    wa, wb = w.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ya, yb = wa * 2, wb * 2
    c = coil.compile(f, backend="aot_eager") if backend == "aot_eager" else coil.compile(f)
    ra, rb = f(xa, ya), c(xb, yb)
    ra.backward()
    rb.backward()
    torch.testing.assert_close(rb, ra)
    torch.testing.assert_close(yb, ya)
    torch.testing.assert_close(xb.grad, xa.grad)
    torch.testing.assert_close(wb.grad, wa.grad)


def test_split_views_mutated_without_grad():
    """Mutating an output of chunk/unbind/split: eager refuses it only when autograd is
    involved; without it, values and the mutated input match."""
    _quiet()
    cases = [lambda x, y: (y.chunk(2, 1)[0].mul_(x[:, :3]), x.sin())[1],
             lambda x, y: (y.unbind(0)[1].mul_(x[1]), x.sin())[1],
             lambda x, y: y.split([2, 2], 0)[1].add_(x[2:])]
    for f in cases:
        _check(f, [rand(4, 6, grad=True), rand(4, 6)], ctx=torch.no_grad)
        _check(f, [rand(4, 6), rand(4, 6)])


def test_module_buffer_mutated_through_views_training():
    _quiet()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))
            self.register_buffer("b", torch.randn(4, 4))

        def forward(self, x):
            self.b[0].mul_(self.w[0])
            self.b.t()[1].mul_(x[1])
            return (self.w * x).sum() + self.b.sum()

    torch.manual_seed(0)
    m1 = M()
    m2 = copy.deepcopy(m1)
    c = coil.compile(m2)
    for _ in range(2):
        x = torch.randn(4, 4)
        l1, l2 = m1(x), c(x)
        l1.backward()
        l2.backward()
        torch.testing.assert_close(l2, l1)
        torch.testing.assert_close(m2.b, m1.b)
        torch.testing.assert_close(m2.w.grad, m1.w.grad)
        m1.b.detach_()
        m2.b.detach_()


def _mut_fns():
    def scale(x, y):
        y.mul_(2)
        return (x * y).cos()

    def by_x(x, y):
        y.mul_(x)
        return x.sin() + y

    def row(x, y):
        y[0].mul_(x[0])
        return x.sin()

    def cols(x, y):
        y.t()[1:].add_(x.t()[1:])
        return (y * x).sum(0)
    return {"scale": scale, "by_x": by_x, "row": row, "cols": cols}


def _run_torch_compile(f, dynamic, train, shapes=((4, 5), (4, 7), (6, 3))):
    torch._dynamo.reset()
    cf = torch.compile(f, backend="coil", dynamic=dynamic)
    for shape in shapes:
        torch.manual_seed(sum(shape))
        x, y = torch.randn(*shape, requires_grad=train), torch.randn(*shape)
        xc, yc = x.detach().clone().requires_grad_(train), y.clone()
        r, o = f(x, y), cf(xc, yc)
        torch.testing.assert_close(o, r)
        torch.testing.assert_close(yc, y)
        if train:
            g = torch.randn_like(r)
            r.backward(g)
            o.backward(g)
            torch.testing.assert_close(xc.grad, x.grad)


@pytest.mark.parametrize("dynamic", [None, True, False])
def test_torch_compile_mutated_input_inference_changing_shapes(dynamic):
    _quiet()
    for f in _mut_fns().values():
        _run_torch_compile(f, dynamic, train=False)


def test_torch_compile_mutated_input_training_static_and_constant_update():
    _quiet()
    for f in _mut_fns().values():
        _run_torch_compile(f, False, train=True)
    for dyn in (None, True):   # the update does not involve a grad-requiring input
        _run_torch_compile(_mut_fns()["scale"], dyn, train=True)


@pytest.mark.parametrize("dynamic", [None, True])
def test_torch_compile_dynamic_training_mutation_from_grad_input(dynamic):
    _quiet()
    _run_torch_compile(_mut_fns()["by_x"], dynamic, train=True)


@pytest.mark.parametrize("dynamic", [None, True])
def test_torch_compile_dynamic_output_view_of_input(dynamic):
    _quiet()

    def f(x):
        return x.sin(), x.t()
    torch._dynamo.reset()
    cf = torch.compile(f, backend="coil", dynamic=dynamic)
    for shape in ((4, 5), (6, 3), (2, 7)):
        x = torch.randn(*shape)
        for o, r in zip(cf(x), f(x)):
            torch.testing.assert_close(o, r)


def test_coil_compile_dynamic_output_view_of_input():
    """The same programs through coil.compile(dynamic=True) (per-shape recompiles)."""
    _quiet()
    fs = [lambda x: (x.sin(), x.t()), lambda x: (lambda z: (z, z.t()))(x.exp()),
          lambda x: (x.mul_(2), x[1:])[1]]
    for f in fs:
        coil.reset()
        cf = coil.compile(f, dynamic=True)
        for shape in ((4, 5), (6, 3)):
            x = torch.randn(*shape)
            x2 = x.clone()
            for o, r in zip(_tup(cf(x2)), _tup(f(x))):
                torch.testing.assert_close(o, r)
            torch.testing.assert_close(x2, x)


def _tup(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


# --------------------------------------------------------------------------------------
# 3. capture_source of module frames, coil report
# --------------------------------------------------------------------------------------

def _records(d):
    recs = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name)) as fh:
            recs += [json.loads(line) for line in fh]
    return recs


def _sources(d):
    return {r.get("frame"): r["text"] for r in _records(d) if r.get("name") == "capture_source"}


def _fwd(self, x, k):
    return x.cos() + k


class _LamMod(nn.Module):
    forward = lambda self, x: x.sin() * 3  # noqa: E731


class _PartialMod(nn.Module):
    forward = functools.partialmethod(_fwd, k=2.0)


class _BuiltinMod(nn.Module):
    forward = torch.relu


class _CallOverride(nn.Module):
    def __call__(self, x):
        return x.tanh() - 7

    def forward(self, x):
        return x + 5


class _Brk(nn.Module):
    def forward(self, x):
        y = x.sin()
        print("", end="")
        return y.cos() * 2


def _exec_mod():
    ns = {}
    exec("import torch\nclass ExecMod(torch.nn.Module):\n    def forward(self, x):\n"
         "        return x * 11\n", ns)
    return ns["ExecMod"]()


def test_module_source_artifacts_and_report(tmp_path):
    _quiet()
    d = tmp_path / "log"
    d.mkdir()
    x = torch.randn(3, 3)
    lin = nn.Linear(3, 3)
    seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    cases = [(_LamMod(), x.sin() * 3), (_PartialMod(), x.cos() + 2), (_BuiltinMod(), x.relu()),
             (_CallOverride(), x.tanh() - 7), (lin, lin(x)), (seq, seq(x)),
             (_exec_mod(), x * 11), (_Brk(), x.sin().cos() * 2)]
    trace.set_dir(str(d))
    try:
        for m, ref in cases:
            coil.reset()
            torch.testing.assert_close(coil.compile(m)(x), ref)
    finally:
        trace.set_dir(None)
    src = _sources(d)
    by_prefix = lambda p: [t for f, t in src.items() if f.startswith(p)]  # noqa: E731
    assert "x.sin() * 3" in by_prefix("_LamMod_call")[0]
    assert "return F.linear(input, self.weight, self.bias)" in by_prefix("Linear_call")[0]
    assert "for module in self:" in by_prefix("Sequential_call")[0]
    assert "source unavailable for _BuiltinMod.forward" in by_prefix("_BuiltinMod_call")[0]
    assert "source unavailable for ExecMod.forward" in by_prefix("ExecMod_call")[0]
    assert "_Brk.forward" in by_prefix("_Brk_call")[0]
    out = tmp_path / "report"
    from coil.cli import main
    assert main(["report", str(d), "-o", str(out)]) == 0
    assert (out / "index.html").exists()


@pytest.mark.xfail(strict=True, reason="the resume function of a module's call frame after a "
                   "graph break still shows coil's generated 'def forward_call(self, *args, "
                   "**kwargs): return self(*args, **kwargs)' as its capture_source")
def test_module_resume_frame_source_is_not_the_generated_call(tmp_path):
    _quiet()
    trace.set_dir(str(tmp_path))
    try:
        coil.compile(_Brk())(torch.randn(3))
    finally:
        trace.set_dir(None)
    src = _sources(tmp_path)
    assert src and not any("forward_call" in t for t in src.values()), src


def test_call_override_source_artifact_shows_call(tmp_path):
    """Fixed: a class that overrides __call__ shows that method as the frame's source
    (frame.py wrap_module / _source_of)."""
    _quiet()
    trace.set_dir(str(tmp_path))
    try:
        coil.compile(_CallOverride())(torch.randn(3))
    finally:
        trace.set_dir(None)
    text = [t for f, t in _sources(tmp_path).items() if f.startswith("_CallOverride_call")][0]
    assert "x.tanh() - 7" in text, text


def _replace_top(x):
    lin = nn.Linear(3, 3)
    orig = lin.forward
    lin.forward = lambda t: orig(t) * 10
    return lin


def _replace_sub(x):
    seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    seq[0].forward = lambda t: t * -1
    return seq


def _replace_method(x):
    class M(nn.Module):
        def forward(self, t):
            return t + 1
    m = M()
    m.forward = types.MethodType(lambda self, t: t - 1, m)
    return m


@pytest.mark.parametrize("make", [_replace_top, _replace_sub, _replace_method])
def test_instance_forward_replacement_is_used(make):
    """Fixed: capture calls a forward assigned on the instance (translator.py
    call_module, guarded on it; frame.py runs such a callee as is)."""
    _quiet()
    x = torch.randn(4, 3)
    m = make(x)
    torch.testing.assert_close(coil.compile(m)(x), m(x))


def test_instance_forward_replacement_torch_compile_coil():
    _quiet()
    x = torch.randn(4, 3)
    for make in (_replace_top, _replace_sub, _replace_method):
        torch._dynamo.reset()
        m = make(x)
        torch.testing.assert_close(torch.compile(m, backend="coil")(x), m(x))


# --------------------------------------------------------------------------------------
# 4. demo progress lines, coil demo --help
# --------------------------------------------------------------------------------------

def test_demo_help(capsys):
    from coil.cli import main
    with pytest.raises(SystemExit) as e:
        main(["demo", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "cpu, cuda or auto" in out and "interleaved rounds" in out and "--out" in out


def test_stage_progress_lines():
    from coil.bench.demo import StageProgress
    s = io.StringIO()
    p = StageProgress(s)
    p("capture", "start", None)
    p("backend", "start", None)
    p("aot", "start", None)
    p("aot", "end", 50.0)        # two levels deep: not printed
    p("backend", "end", 321.4)
    p("capture", "end", 470.0)
    p("capture", "start", None)
    p("capture", "end", 5.0)     # under 20 ms: not printed
    p("report", "start", None)
    p("report", "end", None)     # no duration: not printed, no crash
    p.close()
    assert s.getvalue() == "  capture > backend: 321 ms\n  capture: 470 ms\n"
    assert p.counts == {"aot": 1, "backend": 1, "capture": 2, "report": 1}


def test_demo_repeat_zero_is_refused_or_handled(tmp_path):
    """Fixed: argparse refuses --repeat below 1 (coil/bench/cli.py _positive_int)."""
    _quiet()
    from coil.cli import main
    try:
        rc = main(["demo", "--device", "cpu", "--repeat", "0", "--out", str(tmp_path)])
    except SystemExit as e:   # refused by argparse: fine
        rc = e.code
    assert rc in (0, 1, 2)


# --------------------------------------------------------------------------------------
# 5. everyday workflows
# --------------------------------------------------------------------------------------

def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_training_loop_with_optimizer(opt):
    _quiet()
    torch.manual_seed(0)
    m1 = _mlp()
    m2 = copy.deepcopy(m1)
    c = coil.compile(m2)
    mk = (lambda ps: torch.optim.AdamW(ps, lr=1e-2)) if opt == "adamw" else \
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    o1, o2 = mk(m1.parameters()), mk(m2.parameters())
    for _ in range(4):
        x, t = torch.randn(5, 8), torch.randn(5, 4)
        l1, l2 = F.mse_loss(m1(x), t), F.mse_loss(c(x), t)
        for o, l in ((o1, l1), (o2, l2)):
            o.zero_grad()
            l.backward()
            o.step()
        torch.testing.assert_close(l2, l1, rtol=1e-4, atol=1e-5)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p2, p1, rtol=1e-4, atol=1e-5)


def test_no_grad_inference_state_dict_and_deepcopy():
    _quiet()
    torch.manual_seed(1)
    m = _mlp()
    c = coil.compile(m)
    x = torch.randn(3, 8)
    with torch.no_grad():
        o = c(x)
        assert not o.requires_grad
        torch.testing.assert_close(o, m(x))
    with torch.inference_mode():
        torch.testing.assert_close(c(x), m(x))
    m3 = _mlp()
    m3.load_state_dict(c.state_dict())
    torch.testing.assert_close(m3(x), c(x))
    c.load_state_dict(_mlp().state_dict())
    torch.testing.assert_close(c(x), m(x))
    c2 = copy.deepcopy(c)
    torch.testing.assert_close(c2(x), c(x))
    with torch.no_grad():
        c2._orig_mod[3].bias.add_(1.0)
    assert not torch.allclose(c2(x), c(x))
    # BatchNorm / Dropout follow train() and eval()
    bn = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6))
    bn2 = copy.deepcopy(bn)
    cb = coil.compile(bn2)
    xb = torch.randn(8, 4)
    torch.testing.assert_close(cb(xb), bn(xb), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bn2[1].running_var, bn[1].running_var)
    bn.eval()
    cb.eval()
    torch.testing.assert_close(cb(xb), bn(xb), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_compiled_module_pickles(how):
    """Fixed: OptimizedModule.__reduce__ saves the original module and the compile
    arguments; loading compiles it again (api.py)."""
    _quiet()
    m = _mlp()
    c = coil.compile(m)
    x = torch.randn(3, 8)
    c(x)
    if how == "pickle":
        c2 = pickle.loads(pickle.dumps(c))
    else:
        buf = io.BytesIO()
        torch.save(c, buf)
        buf.seek(0)
        c2 = torch.load(buf, weights_only=False)
    torch.testing.assert_close(c2(x), c(x))


def test_torch_compile_coil_module_pickles():
    _quiet()
    m = _mlp()
    c = torch.compile(m, backend="coil")
    x = torch.randn(3, 8)
    c(x)
    torch.testing.assert_close(pickle.loads(pickle.dumps(c))(x), c(x))
