"""Minimal repros from the thirteenth round of user testing: the aot training runtime
without zero-filled gradients for non-differentiable outputs and with batched no_grad
copy-back of mutated inputs (``coil/aot/runtime.py`` ``training_runner``,
``_copy_untracked``), ``triton_persistent_rnumel`` 4096 -> 2048 (rows of 2049-4096
elements now run as looped Triton kernels), and the new GPU launch candidates
(``coil/runtime/triton_runtime.py`` ``candidate_configs``); see FINDINGS_13.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed); the plain tests are compact versions of what was
verified to match eager (values, dtypes, strides, gradients, mutated inputs). CPU only;
the Triton cases run through Triton's interpreter (coil sets TRITON_INTERPRET itself).
"""
import glob
import json
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil

from report_helpers import (assert_args_match, assert_grads_match, assert_outputs_match,
                            backward_both, run_on_copies)

BACKENDS = ["cpp", "triton"]
LOOPED_ROWS = [2049, 2500, 3000, 4095, 4096]


def _gen(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda *s, grad=False: torch.randn(*s, generator=g).requires_grad_(grad)  # noqa: E731


def _coil_warnings(w):
    return [str(m.message) for m in w if "coil" in str(m.message)]


# == 1. aot training runtime: materialize_grads off, batched no_grad copy-back ==============

# -- verified to work -----------------------------------------------------------------------

def _train_steps(make, x, backend="cpp", steps=2, atol=1e-3, rtol=1e-3):
    """Train-mode module: eager vs compiled for ``steps`` steps with the same random
    cotangents; outputs, input grads, every buffer (dtype and value) and param grads."""
    torch.manual_seed(0)
    m1 = make()
    m2 = make()
    m2.load_state_dict(m1.state_dict())
    c = coil.compile(m2, options={"cpu_backend": backend})
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    for step in range(steps):
        o1, o2 = m1(x1), c(x2)
        g = torch.randn(o1.shape, generator=torch.Generator().manual_seed(step)).to(o1.dtype)
        (o1 * g).float().sum().backward()
        (o2 * g).float().sum().backward()
        torch.testing.assert_close(o2, o1, atol=atol, rtol=rtol)
    torch.testing.assert_close(x2.grad, x1.grad, atol=atol, rtol=rtol)
    for (n, b1), (_, b2) in zip(m1.named_buffers(), m2.named_buffers()):
        assert b1.dtype == b2.dtype, n
        torch.testing.assert_close(b2, b1, atol=atol, rtol=rtol, msg=lambda s: f"{n}: {s}")
    for (n, p1), (_, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, atol=atol, rtol=rtol, msg=lambda s: f"{n}: {s}")


@pytest.mark.parametrize("case", ["bn2d", "bn2d_channels_last", "bn1d_f64", "bn1d_f16",
                                  "conv_bn_stack", "momentum_none", "no_affine", "bn3d_twice"])
def test_batchnorm_training_buffers(case):
    """BatchNorm running statistics (float, float64, float16 buffers; the int64
    num_batches_tracked counter) go through the batched _foreach_copy_; two steps."""
    r = _gen(1)
    make, x = {
        "bn2d": (lambda: nn.BatchNorm2d(3), r(4, 3, 5, 5)),
        "bn2d_channels_last": (lambda: nn.BatchNorm2d(3),
                               r(4, 3, 5, 5).to(memory_format=torch.channels_last)),
        "bn1d_f64": (lambda: nn.BatchNorm1d(3).double(), r(4, 3).double()),
        "bn1d_f16": (lambda: nn.BatchNorm1d(3).half(), r(4, 3).half()),
        "conv_bn_stack": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                                nn.Conv2d(4, 2, 1), nn.BatchNorm2d(2)),
                          r(2, 3, 6, 6)),
        "momentum_none": (lambda: nn.BatchNorm1d(3, momentum=None), r(4, 3)),
        "no_affine": (lambda: nn.BatchNorm1d(3, affine=False), r(4, 3)),
        "bn3d_twice": (lambda: nn.Sequential(nn.BatchNorm3d(2), nn.BatchNorm3d(2)), r(2, 2, 3, 3, 3)),
    }[case]
    _train_steps(make, x)


def test_batchnorm_training_triton_backend():
    _train_steps(lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4)),
                 _gen(2)(2, 3, 6, 6), backend="triton")


def test_batched_copy_groups_by_dtype(monkeypatch):
    """The copy-back of mutated buffers calls ``_foreach_copy_`` once per dtype: ATen's multi-tensor fast path takes
    one dtype, and a list mixing BatchNorm's float running stats with its int64 counter ran a copy launch each
    (363 device memcpys a DenseNet-121 training step on an H100)."""
    calls = []
    real = torch._foreach_copy_

    def record(dsts, srcs, *a, **k):
        calls.append(sorted({str(t.dtype) for t in list(dsts) + list(srcs)}))
        return real(dsts, srcs, *a, **k)

    monkeypatch.setattr(torch, "_foreach_copy_", record)
    _train_steps(lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4)),
                 _gen(4)(2, 3, 6, 6))
    assert calls and all(len(c) == 1 for c in calls), calls
    assert ["torch.int64"] in calls and ["torch.float32"] in calls, calls


@pytest.mark.parametrize("kind", ["transposed", "strided_slice", "zero_dim", "empty",
                                  "channels_last", "expanded_source"])
def test_nograd_mutation_of_unusual_layouts(kind):
    """One buffer updated under no_grad (single-copy path) next to a second one (foreach
    path): non-contiguous views, 0-d, empty, channels-last; values and gradients."""
    r = _gen(3)
    buf = {"transposed": lambda: r(4, 5).t(), "strided_slice": lambda: r(4, 6)[:, ::2],
           "zero_dim": lambda: r(()), "empty": lambda: r(0, 4),
           "channels_last": lambda: r(2, 3, 4, 4).to(memory_format=torch.channels_last),
           "expanded_source": lambda: r(1)}[kind]

    def f(x, b, c):
        with torch.no_grad():
            b.mul_(0.5).add_(x.detach().mean())
            c.copy_(b.sum() + x.detach())
        return x.sin()

    args = (r(3, grad=True), buf(), r(3))
    out, ref, a_out, a_ref = run_on_copies(f, args)
    assert_outputs_match(out, ref, 1e-5, 1e-5)
    assert_args_match(a_ref, a_out, 1e-5, 1e-5)
    backward_both(out, ref)
    assert_grads_match(a_ref, a_out, 1e-5, 1e-5)


def test_nograd_mutation_mixed_dtypes_one_foreach():
    """fp16, int64, float64, bool and a transposed bf16 buffer updated in one no_grad block."""
    r = _gen(4)

    def f(x, h, i, d, b, bt):
        with torch.no_grad():
            h.mul_(0.5).add_(1.0)
            i.add_(1)
            d.copy_(x.detach()[:2])
            b.fill_(True)
            bt.mul_(2)
        return x.sin()

    args = (r(3, grad=True), r(4).half(), torch.tensor([3, 4]), r(2).double(),
            torch.zeros(3, dtype=torch.bool), r(4, 4).bfloat16().t())
    out, ref, a_out, a_ref = run_on_copies(f, args)
    assert_args_match(a_ref, a_out, 0, 0)
    backward_both(out, ref)
    assert_grads_match(a_ref, a_out, 0, 0)


@pytest.mark.parametrize("variant", ["copy_then_add", "copy_then_add_args_swapped",
                                     "add_then_copy", "swap"])
def test_buffers_reading_each_other_under_no_grad(variant):
    """The batched copy-back cannot reorder reads and writes between mutated buffers."""
    def copy_then_add(x, a, b):
        with torch.no_grad():
            a.copy_(b)
            b.add_(1)
        return x.sin()

    def copy_then_add_swapped(x, b, a):
        with torch.no_grad():
            a.copy_(b)
            b.add_(1)
        return x.sin()

    def add_then_copy(x, b, a):
        with torch.no_grad():
            b.add_(1)
            a.copy_(b)
        return x.sin()

    def swap(x, a, b):
        with torch.no_grad():
            t = a.clone()
            a.copy_(b)
            b.copy_(t)
        return x.sin()

    f = {"copy_then_add": copy_then_add, "copy_then_add_args_swapped": copy_then_add_swapped,
         "add_then_copy": add_then_copy, "swap": swap}[variant]
    r = _gen(5)
    out, ref, a_out, a_ref = run_on_copies(f, (r(3, grad=True), r(3), r(3)))
    assert_args_match(a_ref, a_out, 0, 0)


def test_nograd_grad_nograd_mutation_order():
    """A no_grad update, a tracked update reading it, then a no_grad copy of the tracked
    one: values, requires_grad of the mutated buffers and gradients through them."""
    def f(x, a, b, c):
        with torch.no_grad():
            a.add_(1)
        b.add_(x * a)
        with torch.no_grad():
            c.copy_(b)
        return x.sin()

    r = _gen(6)
    out, ref, a_out, a_ref = run_on_copies(f, (r(3, grad=True), r(3), r(3), r(3)))
    assert_args_match(a_ref, a_out, 1e-6, 1e-6)
    assert [t.requires_grad for t in a_out] == [t.requires_grad for t in a_ref]
    (ref[0].sum() + (a_ref[2] * a_ref[1]).sum()).backward()
    (out[0].sum() + (a_out[2] * a_out[1]).sum()).backward()
    torch.testing.assert_close(a_out[0].grad, a_ref[0].grad)


def _mixed(x, w, b, n):
    with torch.no_grad():
        b.mul_(0.9).add_(x.detach().mean(0) * 0.1)
        n.add_(1)
    y = x @ w
    return y.sin(), y.cos(), y.argmax(1), (y * 2).detach()


def _mixed_args():
    r = _gen(7)
    return [r(4, 3, grad=True), r(3, 5, grad=True), r(3), torch.tensor(0)]


@pytest.mark.parametrize("how", ["retain_graph", "grad_subset", "grad_one_input",
                                 "noncontiguous_grads", "expanded_grad", "used_twice",
                                 "two_calls", "ones_grad_outputs"])
def test_partial_losses_with_nondiff_outputs(how):
    """Differentiable outputs left out of the loss get zeros built from fw_out_meta
    (materialize_grads is off because argmax / detached outputs are non-differentiable)."""
    def body(fn, A):
        g = torch.Generator().manual_seed(11)
        o = fn(*A)
        if how == "retain_graph":
            gr = torch.randn(4, 5, generator=g)
            o[0].backward(gr, retain_graph=True)
            o[0].backward(gr)
            return [A[0].grad, A[1].grad]
        if how == "grad_subset":
            return list(torch.autograd.grad(o[1].sum(), [A[0], A[1]]))
        if how == "grad_one_input":
            return list(torch.autograd.grad(o[1].sum(), [A[1]]))
        if how == "noncontiguous_grads":
            torch.autograd.backward([o[0], o[1]], [torch.randn(5, 4, generator=g).t(),
                                                   torch.randn(4, 10, generator=g)[:, ::2]])
            return [A[0].grad, A[1].grad]
        if how == "expanded_grad":
            torch.autograd.backward([o[0]], [torch.randn(1, 5, generator=g).expand(4, 5)])
            return [A[0].grad, A[1].grad]
        if how == "used_twice":
            (o[0].sum() + o[1].mean() + o[0][0].sum()).backward()
            return [A[0].grad, A[1].grad]
        if how == "two_calls":
            o2 = fn(*A)
            (o[0].sum() + o2[1].sum()).backward()
            return [A[0].grad, A[1].grad, A[2], A[3]]
        return list(torch.autograd.grad([o[1]], [A[1]], grad_outputs=[torch.ones(4, 5)]))

    coil.reset()
    A, B = _mixed_args(), _mixed_args()
    ref, got = body(_mixed, A), body(coil.compile(_mixed), B)
    for i, (p, q) in enumerate(zip(ref, got)):
        torch.testing.assert_close(q, p, msg=lambda s: f"{i}: {s}")
    for p, q in zip(A, B):
        torch.testing.assert_close(q.detach(), p.detach())


def test_nondiff_outputs_flags_and_double_backward_message():
    coil.reset()
    c = coil.compile(_mixed)
    A = _mixed_args()
    o = c(*A)
    assert [t.requires_grad for t in o] == [True, True, False, False]
    with pytest.raises(RuntimeError):
        torch.autograd.grad(o[3].sum(), A[0])
    g, = torch.autograd.grad(o[0].sum(), A[0], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward through a compiled graph"):
        g.sum().backward()


def test_autocast_module_with_buffers_and_dict_outputs():
    """CPU bf16 autocast region, BatchNorm, an int64 step counter and a float64 EMA buffer
    updated under no_grad; dict outputs mixing differentiable, argmax, the input itself
    and a view of it; three steps."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.bn = nn.Linear(6, 6), nn.BatchNorm1d(6)
            self.register_buffer("steps", torch.tensor(0))
            self.register_buffer("ema", torch.zeros(6, dtype=torch.float64))

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = self.lin(x)
            h = self.bn(h.float())
            with torch.no_grad():
                self.steps.add_(1)
                self.ema.mul_(0.9).add_(h.detach().double().mean(0), alpha=0.1)
            return {"out": h.relu(), "pred": h.argmax(1), "feat": h, "ident": x, "view": x.t()}

    torch.manual_seed(0)
    m1, m2 = M(), M()
    m2.load_state_dict(m1.state_dict())
    coil.reset()
    c = coil.compile(m2)
    tol = dict(atol=1e-2, rtol=1e-2)
    for step in range(3):
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(step))
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        o1, o2 = m1(x1), c(x2)
        assert o2["ident"] is x2
        for k in o1:
            torch.testing.assert_close(o2[k], o1[k], **tol)
            assert o1[k].requires_grad == o2[k].requires_grad, k
        (o1["out"].sum() + (o1["view"] ** 2).sum()).backward()
        (o2["out"].sum() + (o2["view"] ** 2).sum()).backward()
        torch.testing.assert_close(x2.grad, x1.grad, **tol)
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        torch.testing.assert_close(b, a, **tol, msg=lambda s: n + s)
    for (n, a), (_, b) in zip(m1.named_parameters(), m2.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, **tol, msg=lambda s: n + s)


def test_hidden_mutation_of_param_with_buffers():
    """Embedding(max_norm) renorms its weight (a leaf that requires grad) through a hidden
    mutation, batched with BatchNorm's buffers and an int64 counter that is returned."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.bn = nn.Embedding(10, 4, max_norm=1.0), nn.BatchNorm1d(4)
            self.register_buffer("cnt", torch.zeros((), dtype=torch.int64))

        def forward(self, i):
            self.cnt.add_(1)
            return self.bn(self.emb(i)).relu(), self.cnt

    torch.manual_seed(0)
    m1, m2 = M(), M()
    m2.load_state_dict(m1.state_dict())
    coil.reset()
    c = coil.compile(m2)
    for step in range(3):
        i = torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(step))
        o1, o2 = m1(i), c(i)
        torch.testing.assert_close(o2[0], o1[0])
        assert o2[1] is m2.cnt
        (o1[0] ** 2).sum().backward()
        (o2[0] ** 2).sum().backward()
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        torch.testing.assert_close(b, a, msg=lambda s: n + s)
    torch.testing.assert_close(m2.emb.weight.grad, m1.emb.weight.grad)


def test_batched_copy_bumps_version_counters():
    """A tensor saved by an eager op and then updated by the compiled graph's batched
    copy-back still makes that eager backward raise, as in eager."""
    def f(x, b1, b2):
        with torch.no_grad():
            b1.add_(1)
            b2.mul_(2)
        return x.sin()

    coil.reset()
    c = coil.compile(f)
    x, b1, b2 = torch.randn(3, requires_grad=True), torch.randn(3), torch.randn(3)
    w = torch.randn(3, requires_grad=True)
    saved = (w * b1).sum() + (w * b2).sum()
    versions = (b1._version, b2._version)
    c(x, b1, b2)
    assert (b1._version, b2._version) == (versions[0] + 1, versions[1] + 1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_batchnorm_train_under_no_grad_and_inference_mode(ctx):
    torch.manual_seed(0)
    m1, m2 = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    m2.load_state_dict(m1.state_dict())
    coil.reset()
    c = coil.compile(m2)
    x = torch.randn(5, 3)
    with ctx():
        for k in range(2):
            torch.testing.assert_close(c(x + k), m1(x + k))
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        torch.testing.assert_close(b, a, msg=lambda s: n + s)


def test_view_of_grad_leaf_mutated_under_no_grad():
    def f(x, v, b):
        with torch.no_grad():
            v.mul_(0.5)
            b.add_(1)
        return (x * v).sum()

    res = []
    for fn in (f, coil.compile(f)):
        torch.manual_seed(0)
        w, x, b = torch.randn(2, 3, requires_grad=True), torch.randn(3, requires_grad=True), torch.randn(3)
        fn(x, w[0], b).backward()
        res.append((x.grad, w.grad, w.detach().clone(), b))
    for p, q in zip(*res):
        torch.testing.assert_close(q, p)


# -- defects ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["mul_", "div_"])
def test_inplace_mul_of_input_by_grad_tensor_backward(op):
    """Fixed: the forward saves a clone of a mutated input that the backward reads
    (aot/compile.py ``_clone_saved_mutated_inputs``); it saved the input itself, which
    the epilogue then overwrote."""
    def f(x, y):
        getattr(y, op)(x)
        return x.cos()

    res = []
    for fn in (f, coil.compile(f)):
        x = torch.tensor([0.5, -1.5, 2.0], requires_grad=True)
        y = torch.tensor([1.0, 2.0, -3.0])
        o = fn(x, y)
        (o.sum() + y.sum()).backward()
        res.append((x.grad, y.detach()))
    for p, q in zip(*res):
        torch.testing.assert_close(q, p)


# == 2. rows of 2049..4096 elements: looped Triton reductions =================================

def _check(fn, args, backend="triton", atol=1e-4, rtol=1e-4, grad=False):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out, ref, a_out, a_ref = run_on_copies(fn, args, backend)
        assert_outputs_match(out, ref, atol, rtol)
        if grad:
            backward_both(out, ref)
            assert_grads_match(a_ref, a_out, atol, rtol)
    assert not _coil_warnings(w), _coil_warnings(w)


def _triton_sources(tmp_path, fn, args):
    coil.reset()
    coil.trace.set_dir(str(tmp_path))
    try:
        coil.compile(fn, options={"cpu_backend": "triton"})(*args)
    finally:
        coil.trace.set_dir(None)
    srcs = []
    for p in glob.glob(str(tmp_path / "*.jsonl")):
        for line in open(p):
            rec = json.loads(line)
            if rec.get("event") == "artifact" and rec.get("kind") == "triton":
                srcs.append(rec["text"])
    return srcs


@pytest.mark.parametrize("n,looped", [(2048, False), (2049, True), (4095, True)])
def test_row_length_picks_looped_kernel(tmp_path, n, looped):
    """The new threshold: 2048 persistent, 2049 and 4095 looped over the row (a few rows
    of 4096 are split in two stages on the CPU, _split_decision, so they do not loop)."""
    srcs = _triton_sources(tmp_path, lambda x: x.softmax(-1), [torch.randn(2, n)])
    red = [s for s in srcs if "rnumel =" in s]
    assert red and all(("for roffset in range" in s) == looped for s in red)


@pytest.mark.parametrize("n", LOOPED_ROWS)
def test_looped_row_reductions_match_eager(n):
    """sum, mean, var, std, var_mean, softmax, log_softmax, amax/amin, max.dim,
    argmax/argmin, logsumexp, layer_norm, rms_norm, prod, any/all, vector_norm on
    contiguous, transposed and strided-slice fp32 rows and fp16 / bf16 rows."""
    r = _gen(n)
    layouts = {"c": r(3, n), "t": r(n, 3).t(), "s": r(3, 2 * n)[:, ::2],
               "h": r(3, n).half(), "b": r(3, n).bfloat16()}
    for tag, v in layouts.items():
        tol = dict(atol=1e-4, rtol=1e-4) if v.dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        w, b = r(n).to(v.dtype), r(n).to(v.dtype)

        def f(x, w, b):
            return (x.sum(-1), x.mean(-1), x.var(-1), x.std(-1, correction=0),
                    *torch.var_mean(x, -1, keepdim=True), x.softmax(-1), x.log_softmax(-1),
                    x.softmax(-1, dtype=torch.float32), x.amax(-1), x.amin(-1), *x.max(-1),
                    x.argmax(-1), x.argmin(-1), x.logsumexp(-1), F.layer_norm(x, (n,), w, b),
                    F.rms_norm(x, (n,), w, eps=1e-6), (x > 3.2).any(-1), (x > -3.2).all(-1),
                    torch.linalg.vector_norm(x, dim=-1), x - x.mean(-1, keepdim=True))

        _check(f, [v, w, b], **tol)
        if v.dtype == torch.float32:  # eager's fp16 prod accumulates in fp16
            _check(lambda x: (1 + x * 1e-3).prod(-1), [v], **tol)


@pytest.mark.parametrize("n", [2049, 3000, 4096])
def test_looped_row_special_values_match_eager(n):
    """Ties, NaN, -inf / +inf rows for max/min/argmax/argmin, softmax, logsumexp,
    layer_norm, nansum; int and fp16 ties."""
    g = torch.Generator().manual_seed(n)
    ties = torch.randint(0, 5, (4, n), generator=g).float()
    nan = torch.randn(4, n, generator=g)
    nan[0, 1500] = nan[1, n - 1] = nan[2, 3] = nan[2, 2040] = float("nan")
    inf = torch.randn(4, n, generator=g)
    inf[0] = float("-inf")
    inf[1, ::2] = float("-inf")
    inf[2, n - 1] = float("inf")
    inf[3, 1024] = float("-inf")

    def f(x):
        return (x.amax(-1), x.amin(-1), *x.max(-1), *x.min(-1), x.argmax(-1), x.argmin(-1),
                x.sum(-1), x.var(-1), x.softmax(-1), x.log_softmax(-1), x.logsumexp(-1),
                F.layer_norm(x, (n,)), torch.nansum(x, -1))

    for v in (ties, nan, inf):
        _check(f, [v])
    for v in (torch.randint(0, 3, (4, n), generator=g), torch.randint(0, 5, (4, n), generator=g).half()):
        _check(lambda x: (x.argmax(-1), x.argmin(-1), *x.max(-1)), [v])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [2049, 4095])
def test_looped_int_and_bool_reductions(backend, n):
    g = torch.Generator().manual_seed(n)
    xi = torch.randint(-100, 100, (3, n), generator=g)
    _check(lambda x: (x.sum(-1), x.int().sum(-1), x.to(torch.int8).sum(-1), x.amax(-1),
                      x.argmax(-1), x.argmin(-1), (x % 3 - 1).prod(-1), (x > 0).sum(-1),
                      (x > -99).any(-1), (x > -99).all(-1), torch.count_nonzero(x, -1),
                      x.float().mean(-1), x.sum(-1, dtype=torch.float32)), [xi], backend)
    _check(lambda x: x.sum(-1), [torch.randint(0, 255, (3, n), dtype=torch.uint8, generator=g)], backend)


@pytest.mark.parametrize("n", [2049, 4096])
def test_looped_cross_entropy_variants(n):
    r = _gen(n)
    logits = r(3, n)
    tgt = torch.randint(0, n, (3,), generator=torch.Generator().manual_seed(n))
    ig = tgt.clone()
    ig[1] = -100

    def f(x, t, t_ig, w):
        return (F.cross_entropy(x, t), F.cross_entropy(x, t_ig, reduction="none"),
                F.cross_entropy(x, t_ig, ignore_index=-100), F.cross_entropy(x, t, label_smoothing=0.1),
                F.cross_entropy(x, t_ig, label_smoothing=0.2, reduction="sum"),
                F.cross_entropy(x, t_ig, weight=w, label_smoothing=0.1),
                F.cross_entropy(x, torch.full_like(t, -100)), F.nll_loss(x.log_softmax(-1), t_ig))

    _check(f, [logits, tgt, ig, torch.rand(n, generator=torch.Generator().manual_seed(1))])
    _check(lambda x, t: F.cross_entropy(x, t), [logits.bfloat16(), ig], atol=2e-2, rtol=2e-2)
    _check(lambda x, t: F.cross_entropy(x, t), [logits, torch.softmax(r(3, n), -1)])
    _check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), [logits.clone().requires_grad_(), ig],
           grad=True)


@pytest.mark.parametrize("n", [2049, 4096])
def test_looped_training_and_other_layouts(n):
    r = _gen(n)
    _check(lambda x, w, b: (F.layer_norm(x, (n,), w, b), x.softmax(-1), x.log_softmax(-1)),
           [r(3, n, grad=True), r(n, grad=True), r(n, grad=True)], atol=1e-3, rtol=1e-3, grad=True)
    _check(lambda x, w: F.rms_norm(x, (n,), w), [r(3, n, grad=True), r(n, grad=True)],
           atol=1e-3, rtol=1e-3, grad=True)
    _check(lambda x: (x.sum(0), x.mean(0), x.amax(0), x.argmax(0), x.var(0)), [r(n, 5)])
    _check(lambda x: (x.sum(), x.amax(), x.argmax(), x.var()), [r(n)])
    _check(lambda x: (x.sum(1), x.softmax(1)), [r(2, n, 3)])
    _check(lambda x: (x.softmax(0), x.t().softmax(-1), F.layer_norm(x.t(), (n,))), [r(n, 3)])
    _check(lambda x: (x.expand(3, n).sum(-1), x.expand(3, n).softmax(-1)), [r(1, n)])
    _check(lambda a, b: (a + b.t()).sum(-1), [r(3, n), r(n, 3)])
    m = torch.rand(3, n, generator=torch.Generator().manual_seed(2)) > 0.5
    m[0] = True
    _check(lambda x, m: x.masked_fill(m, float("-inf")).softmax(-1), [r(3, n), m])
    _check(lambda x: x.softmax(-1), [r(130, n)])  # more rows than one program's XBLOCK


# -- defects ----------------------------------------------------------------------------------

def test_triton_bool_amax_compiles():
    """Fixed: bool max/min/argmax/argmin reduce as uint8 (ir/lowering.py
    ``make_reduction``); Triton's codegen took torch.iinfo(torch.bool)."""
    x = torch.rand(3, 3000, generator=torch.Generator().manual_seed(0)) > 0.7
    _check(lambda x: (x.amax(-1), x.amin(-1)), [x])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["row_4096", "full_2048"])
def test_fp16_mean_of_split_reduction_overflows(backend, case):
    """Fixed: mean/var sum in the compute dtype (fp32) until divided (ir/lowering.py
    ``_mean`` / ``_var``); the fp16 sum overflowed before the division."""
    g = torch.Generator().manual_seed(0)
    if case == "row_4096":
        x = (torch.randn(3, 4096, generator=g) * 0.5 + 100).half()
        fn = lambda x: x - x.mean(-1, keepdim=True)  # noqa: E731
    else:
        x = (torch.randn(2048, generator=g) * 0.5 + 40).half()
        fn = lambda x: x - x.mean()  # noqa: E731
    _check(fn, [x], backend, atol=2e-2, rtol=2e-2)


# == 3. GPU launch candidates (read on CPU) ===================================================

def test_gpu_looped_candidates_are_sane():
    """Looped rows: one row per program, power-of-two warps between 1 and 32, at least two
    elements per thread (one warp for blocks under 64), RBLOCK no larger than the row's next power of two; persistent
    configs hold the whole row; launch_configs matches candidate_configs."""
    from coil.runtime.triton_runtime import _pow2, candidate_configs, launch_configs
    for numel in (1, 3, 100, 4096, 32768):
        for rnumel in (2, 17, 1000, 2048, 2049, 2500, 3000, 4095, 4096, 8192, 100001):
            for persistent in ((True, False) if rnumel <= 2048 else (False,)):
                for eb in (1, 2, 4, 8):
                    cs = candidate_configs(numel, rnumel, persistent, True, False, eb)
                    assert cs and len(cs) <= 4
                    assert cs == launch_configs(numel, rnumel, persistent, True, False, eb)
                    for c in cs:
                        nw, xb, rb = c["num_warps"], c["XBLOCK"], c["RBLOCK"]
                        assert 1 <= nw <= 32 and nw & (nw - 1) == 0, c
                        assert xb & (xb - 1) == 0 and rb & (rb - 1) == 0, c
                        assert rb <= _pow2(rnumel) and xb <= _pow2(numel), c
                        assert rb <= 4096, c     # (1, 8192, 16): an illegal memory access in Triton 3.6 (H200)
                        if persistent:
                            assert rb >= rnumel, c
                        else:
                            assert xb == 1 and nw <= max(1, xb * rb // 64), c


@pytest.mark.parametrize("rnumel,r_exact", [(4096, True), (8192, True), (2049, False),
                                            (3000, False), (4095, False)])
def test_gpu_looped_blocks_divide(rnumel, r_exact):
    """rmask is dropped only when every looped candidate's RBLOCK divides the row."""
    from coil.runtime.triton_runtime import blocks_divide, candidate_configs
    for eb in (2, 4):
        cs = candidate_configs(7, rnumel, False, True, False, eb)
        assert blocks_divide(cs, 7, rnumel) == (True, r_exact)
        assert all(rnumel % c["RBLOCK"] == 0 for c in cs) == r_exact
