"""Regressions from new-user trial 53b (FINDINGS_53b.md): adversarial programs against the day's changes (concat
buffers and their families, the partitioner's save cost for non-leaf inputs, floats read by extern ATen ops,
checkpoint with tensor methods, recompile reasons for aliased arguments, reduce-overhead on CPU)."""
import json
import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import coil
from coil import trace


def _same(got, want, atol=1e-5, rtol=1e-4):
    got, want = list(got) if isinstance(got, (list, tuple)) else [got], \
        list(want) if isinstance(want, (list, tuple)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)
        if w.numel() > 1:
            assert g.stride() == w.stride(), (g.stride(), w.stride())


# ----------------------------------------------------------------------------- bugs (xfail, strict)

_CONST_BOUND = {
    "clamp_min_float": lambda x, k: x.clamp(k, 10.0),
    "clamp_max_float": lambda x, k: x.clamp(-10.0, k),
    "hardtanh": lambda x, k: F.hardtanh(x, k, 1.0),
    "clip": lambda x, k: torch.clip(x, k, 2.0),
    "clamp_int_bound": lambda x, k: x.clamp(k, 10),
}


@pytest.mark.parametrize("op", sorted(_CONST_BOUND))
def test_clamp_with_a_changing_float_and_a_constant_bound_compiles_at_most_twice(op, coil_reset):
    fn = _CONST_BOUND[op]
    cf = coil.compile(fn)
    x = torch.randn(6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(10):
            k = -0.1 * i - 0.05
            torch.testing.assert_close(cf(x, k), fn(x, k))
    assert coil.capture.stats["frames"] <= 2 and coil.capture.stats["eager_limit"] == 0, coil.capture.stats


def test_clamp_with_two_changing_floats_compiles_twice(coil_reset):
    """The same clamp with both bounds changing floats stays symbolic (the control for the xfail above)."""
    fn = lambda x, k, j: x.clamp(k, j)
    cf = coil.compile(fn)
    x = torch.randn(6)
    for i in range(10):
        torch.testing.assert_close(cf(x, -0.1 * i - 0.05, 0.07 * i + 0.2), fn(x, -0.1 * i - 0.05, 0.07 * i + 0.2))
    assert coil.capture.stats["frames"] == 2


def test_clamp_by_a_float_live_across_an_item_break_compiles_a_few_times(coil_reset):
    """``s = k * 0.5``, then ``x.max().item()`` (a graph break), then ``x.clamp(s, m)`` in the resume function: ``m``
    is the same every call (a constant bound), ``s`` changes: the resume function recompiles per value (same cause as
    the xfail above)."""
    def fn(x, k):
        s = k * 0.5
        m = x.max().item()
        return x.clamp(s, m)

    cf = coil.compile(fn)
    x = torch.randn(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(10):
            torch.testing.assert_close(cf(x, 0.1 * i + 0.05), fn(x, 0.1 * i + 0.05))
    assert coil.capture.stats["frames"] <= 5 and coil.capture.stats["eager_limit"] == 0, coil.capture.stats


_TRAIN_FLOAT = {
    "pow": lambda x, k: x.abs().add(0.1).pow(k).sum(),
    "lerp": lambda x, k: torch.lerp(x, x.flip(0), k).pow(2).sum(),
    "foreach_lerp": lambda x, k: torch._foreach_lerp([x], [x.flip(0)], k)[0].pow(2).sum(),
    "celu": lambda x, k: F.celu(x, k).pow(2).sum(),
    "vector_norm": lambda x, k: torch.linalg.vector_norm(x, ord=2 + k),
    "dist": lambda x, k: torch.dist(x, x.flip(0), p=1 + k),
}


@pytest.mark.parametrize("op", sorted(_TRAIN_FLOAT))
def test_training_with_a_changing_float_compiles_at_most_twice(op, coil_reset):
    fn = _TRAIN_FLOAT[op]
    cf = coil.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(9):
            k = 0.3 + 0.13 * i
            x0 = torch.randn(4, 6)
            xe, xc = x0.clone().requires_grad_(), x0.clone().requires_grad_()
            fn(xe, k).backward()
            cf(xc, k).backward()
            torch.testing.assert_close(xc.grad, xe.grad, atol=1e-4, rtol=1e-4)
    assert coil.capture.stats["frames"] <= 2 and coil.capture.stats["eager_limit"] == 0, coil.capture.stats


def test_training_with_a_float_and_no_grad_regions_keeps_eager_gradients(coil_reset):
    """A float read beside a ``no_grad`` region and a ``detach``: the joint is not traced from the forward ATen graph
    (which forgets both), so the gradients stay eager's."""
    def fn(x, k):
        with torch.no_grad():
            y = x * k
        return (torch.lerp(x, y, k) + x.detach() * k * x).sum()

    cf = coil.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(4):
            x0, k = torch.randn(4, 6), 0.3 + 0.13 * i
            xe, xc = x0.clone().requires_grad_(), x0.clone().requires_grad_()
            fn(xe, k).backward()
            cf(xc, k).backward()
            torch.testing.assert_close(xc.grad, xe.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("op", sorted(_TRAIN_FLOAT))
def test_inference_with_a_changing_float_compiles_twice(op, coil_reset):
    """The control for the xfail above: the same programs under no_grad stay at two graphs."""
    fn = _TRAIN_FLOAT[op]
    cf = coil.compile(fn)
    with torch.no_grad():
        for i in range(6):
            x, k = torch.randn(4, 6), 0.3 + 0.13 * i
            torch.testing.assert_close(cf(x, k), fn(x, k))
    assert coil.capture.stats["frames"] == 2


@pytest.mark.parametrize("body", ["tanh_add_", "relu__mul_"])
def test_checkpoint_body_writing_its_saved_output_in_place(body, coil_reset):
    fns = {"tanh_add_": lambda z: z.tanh().add_(1.0), "relu__mul_": lambda z: torch.relu_(z * 2).mul_(2)}

    def f(x):
        return checkpoint(fns[body], x, use_reentrant=False).sum()

    x0 = torch.randn(5)
    xe, xc = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    f(xe).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coil.compile(f)(xc).backward()
    torch.testing.assert_close(xc.grad, xe.grad)


# ----------------------------------------------------------------------------- concat buffers (pass)

def _family_branches(x):
    fs = [x, x + 1, x + 2, x + 3, x + 4]
    p = torch.cat(fs, 1)
    q = torch.cat(fs + [x * 5], 1)
    r = torch.cat(fs + [x * 6, x * 7, x * 9], 1)
    s = torch.cat(fs + [x * 5, x * 8], 1)
    p.add_(100)    # a prefix written after the longer ones were made
    return p, q, r.sum(1), s


def _mixed_inputs(x, y, i):
    return torch.cat([x, y.t(), x.sin(), y.t().exp(), x[:, :0], x.double(), x.sum(0, keepdim=True).expand_as(x),
                      i.float().expand_as(x), x, x * y.t(), (x @ y).diagonal().unsqueeze(1).expand_as(x), x.flip(0)],
                     -1)


def _slice_input_returned_and_viewed(x, y):
    a = x * 2
    out = torch.cat([a, y, a, y + 1, x - y, a], 1)
    out[:, :2].mul_(10)       # a slice of the result written in place
    return out, a, a.view(-1), a.view(torch.int32), a.transpose(0, 1)


def _cat_of_cat_mutated_input(x, y):
    x.mul_(3)
    a = torch.cat([x, y, x * 2, y + 1, x - y], 0)
    b = torch.cat([a, x, a.sin(), y.repeat(2, 1, 1), a], 0)
    x.add_(1)
    return b, a


@pytest.mark.parametrize("case", ["family_branches", "mixed_inputs", "slice_input_returned", "cat_of_cat"])
def test_concat_buffers_match_eager(case, coil_reset):
    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    fn, args = {"family_branches": (_family_branches, (x,)),
                "mixed_inputs": (_mixed_inputs, (torch.randn(4, 3), torch.randn(3, 4), torch.arange(4).view(4, 1))),
                "slice_input_returned": (_slice_input_returned_and_viewed, (x, y)),
                "cat_of_cat": (_cat_of_cat_mutated_input, (x, y))}[case]
    ea, ca = [a.clone() for a in args], [a.clone() for a in args]
    want, got = fn(*ea), coil.compile(fn)(*ca)
    _same(got, want)
    _same(ca, ea)


def test_concat_slice_returned_is_its_own_memory(coil_reset):
    def f(x):
        a = x + 1
        return torch.cat([a, a, x, a, x], 0), a

    out, a = coil.compile(f)(torch.ones(2, 3))
    a.add_(100)
    assert torch.equal(out, torch.cat([torch.full((2, 3), 2.0)] * 2 + [torch.ones(2, 3)] + [torch.full((2, 3), 2.0)]
                                      + [torch.ones(2, 3)]))


def _dense(x, w):
    fs = [x]
    for _ in range(6):
        h = torch.cat(fs, 1)
        fs.append((h @ w[: h.shape[1], :2]).tanh())
    return torch.cat(fs, 1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_dense_family_gradients_match_eager(dynamic, coil_reset):
    cf = coil.compile(_dense, dynamic=dynamic)
    for n in ((3, 5, 2) if dynamic else (3,)):
        x0, w0 = torch.randn(n, 2), torch.randn(14, 2)
        xe, we = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        xc, wc = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        oe, oc = _dense(xe, we), cf(xc, wc)
        _same(oc, oe)
        g = torch.randn_like(oe)
        oe.backward(g)
        oc.backward(g)
        torch.testing.assert_close(xc.grad, xe.grad)
        torch.testing.assert_close(wc.grad, we.grad)
    assert coil.capture.stats["frames"] == 1


def test_concat_channels_last_and_bf16_autocast(coil_reset):
    def f(img, k):
        c = F.conv2d(img, k, padding=1)
        return torch.cat([c, img, c.relu(), img * 2, c.sigmoid(), img[:, :2]], 1)

    img = torch.randn(2, 4, 5, 5).to(memory_format=torch.channels_last)
    k = torch.randn(3, 4, 3, 3)
    _same(coil.compile(f)(img, k), f(img, k))
    with torch.autocast("cpu", torch.bfloat16):
        got, want = coil.compile(f)(img, k), f(img, k)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


# ----------------------------------------------------------------------------- partition (pass)

@pytest.mark.parametrize("op", ["exp", "softmax", "max_dim", "sigmoid_sum", "mm_const", "expand_exp"])
@pytest.mark.parametrize("write", ["add_", "maskset", "view_mul_"])
def test_activation_across_a_break_written_after_the_call(op, write, coil_reset):
    """``h = x @ w`` crosses a print() break; the second graph reads it; the caller then writes ``h`` in place. Eager's
    autograd did not save ``h``; the compiled backward must not fail the version check either."""
    op2 = {"exp": lambda h: h.exp(), "softmax": lambda h: h.softmax(-1), "max_dim": lambda h: h.max(-1)[0],
           "sigmoid_sum": lambda h: h.sigmoid().sum(-1), "mm_const": lambda h: h @ torch.ones(5, 2),
           "expand_exp": lambda h: h[:, :1].expand(-1, 5).exp()}[op]

    def f(x, w):
        h = x @ w
        print("", end="")
        return op2(h), h

    def run(fn):
        torch.manual_seed(0)
        x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
        o, h = fn(x, w)
        {"add_": lambda: h.add_(1), "maskset": lambda: h.__setitem__(h > 0, 1.0),
         "view_mul_": lambda: h.view(-1)[:3].mul_(0)}[write]()
        o.sum().backward()
        return o.detach(), x.grad, w.grad

    torch.testing.assert_close(run(coil.compile(f)), run(f))


# ----------------------------------------------------------------------------- floats read by externs (pass)

_IDX = torch.tensor([0, 2, 1, 0])
_EXTERN_FLOAT = {
    "index_put_accumulate": lambda x, k: x.view(-1).index_put((_IDX,), torch.full((4,), k), accumulate=True),
    "scatter_reduce_amax": lambda x, k: x.view(-1)[:8].scatter_reduce(0, _IDX, x.view(-1)[:4] * k, "amax",
                                                                      include_self=False),
    "embedding_bag": lambda x, k: F.embedding_bag(_IDX, x.view(-1, 4), torch.tensor([0, 2]), mode="sum",
                                                  per_sample_weights=torch.ones(4) * k),
    "grid_sample": lambda x, k: F.grid_sample(x, torch.linspace(-1, 1, 12).view(1, 3, 2, 2).expand(2, 3, 2, 2) * k,
                                              align_corners=False),
    "nll_loss_ignore": lambda x, k: F.nll_loss(x.view(8, -1)[:, :3].log_softmax(-1) * k,
                                               torch.tensor([0, 1, 2, 1, 2, 0, 1, 1]), ignore_index=1),
    "foreach_addcdiv": lambda x, k: torch._foreach_addcdiv([x], [x], [x + 2], value=k * 2)[0],
    "foreach_ema_alpha": lambda x, k: torch._foreach_add(torch._foreach_mul([x], k), [x * 3], alpha=1 - k)[0],
}


@pytest.mark.parametrize("op", sorted(_EXTERN_FLOAT))
def test_changing_float_read_by_an_extern_op(op, coil_reset):
    fn = _EXTERN_FLOAT[op]
    cf = coil.compile(fn)
    for i in range(6):
        x, k = torch.rand(2, 3, 2, 2) + 0.1, 0.3 + 0.27 * i
        torch.testing.assert_close(cf(x, k), fn(x, k))
    assert coil.capture.stats["frames"] == 2


# ----------------------------------------------------------------------------- checkpoint (pass)

def test_checkpoint_methods_nested_kwargs_and_rng(coil_reset):
    lin = torch.nn.Linear(6, 6)

    def blk(x):
        y = x.sin().view(2, 3, 6).transpose(1, 2).contiguous().view(-1, 6)
        return lin(y).mul_(2).relu_().cos().add_(x)

    def kw(x, scale=1.0, *, shift=None):
        return (x * scale).sin().add_(shift).tanh()

    def body(x):
        inner = checkpoint(blk, x.relu(), use_reentrant=False).sigmoid()
        return inner * checkpoint(kw, x, 0.5, shift=torch.ones(6, 6), use_reentrant=False) \
            + F.dropout(x.exp(), 0.5, training=True)

    def f(x):
        return checkpoint(body, x, use_reentrant=False).sum()

    res = []
    for fn in (f, coil.compile(f, options={"fallback_random": True})):
        lin.zero_grad(set_to_none=True)
        x = torch.randn(6, 6, generator=torch.Generator().manual_seed(0)).requires_grad_()
        torch.manual_seed(5)
        out = fn(x)
        out.backward()
        res.append((out.detach(), x.grad, lin.weight.grad.clone(), torch.rand(1)))
    torch.testing.assert_close(res[1], res[0])


# ----------------------------------------------------------------------------- aliasing reasons (pass)

def test_aliasing_recompiles_name_their_arguments(tmp_path, coil_reset):
    def f(x, y, z):
        y.mul_(2)
        return x + y + z

    def args(p):
        base = torch.arange(12.0)
        a, c, e = torch.arange(4.0) + 10, torch.arange(4.0) - 3, torch.ones(4)
        return {"abc": (a, c, e), "aab": (a, a, c), "aba": (a, c, a), "aaa": (a, a, a),
                "views": (base[:4], base[4:8], base[8:]), "overlap": (base[:4], base[2:6], base[8:])}[p]

    trace.set_dir(str(tmp_path))
    try:
        cf = coil.compile(f)
        for p in ["abc", "aab", "aba", "aaa", "views", "overlap", "abc", "aab"]:
            ea, ca = args(p), args(p)
            torch.testing.assert_close(cf(*ca), f(*ea))
            torch.testing.assert_close(ca, ea)
    finally:
        trace.set_dir(None)
    recs = []
    for name in os.listdir(tmp_path):
        with open(tmp_path / name) as fh:
            recs += [json.loads(line) for line in fh]
    recompiles = [r for r in recs if r.get("event") == "recompile"]
    assert recompiles and all(r.get("reason") for r in recompiles), recompiles


# ----------------------------------------------------------------------------- reduce-overhead on CPU (pass)

def test_reduce_overhead_on_cpu_mutations_and_outputs(coil_reset):
    def f(x, y):
        x.mul_(2)
        y[0].add_(1)
        return x + y, x.t(), torch.cat([x, y[0], x.sin(), y[1], x * 3], 0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf = coil.compile(f, mode="reduce-overhead")
        kept = []
        for _ in range(4):
            a, b = torch.randn(3), torch.randn(2, 3)
            ea, eb, ca, cb = a.clone(), b.clone(), a.clone(), b.clone()
            want, got = f(ea, eb), cf(ca, cb)
            _same(got, want)
            _same([ca, cb], [ea, eb])
            kept.append((got, [t.clone() for t in got]))
    for got, snap in kept:   # a later call did not overwrite an earlier call's outputs
        for g, s in zip(got, snap):
            assert torch.equal(g, s)
    assert coil.capture.stats["frames"] == 1


def _saved_names(tmp_path, fn, x):
    trace.set_dir(str(tmp_path))
    try:
        coil.compile(fn)(x).backward()
    finally:
        trace.set_dir(None)
    recs = []
    for name in os.listdir(tmp_path):
        with open(tmp_path / name) as fh:
            recs += [json.loads(line) for line in fh]
    parts = [r for r in recs if r.get("event") == "aot_partition"]
    assert len(parts) == 1
    return [s["name"] for s in parts[0]["saved"]]


def test_checkpoint_of_tensor_methods_saves_only_its_input(tmp_path, coil_reset):
    def f(x):
        return checkpoint(lambda z: z.sin().view(8, 8).t().exp().tanh() + 1, x, use_reentrant=False).sum()

    assert _saved_names(tmp_path, f, torch.randn(64, requires_grad=True)) == ["primals_1"]


@pytest.mark.parametrize("style", ["methods", "functions"])
def test_nested_checkpoint_saves_only_the_outer_input(style, tmp_path, coil_reset):
    if style == "methods":
        inner = lambda z: z.sin().exp()
        outer = lambda z: checkpoint(inner, z.cos(), use_reentrant=False).tanh() + 1
    else:
        inner = lambda z: torch.exp(torch.sin(z))
        outer = lambda z: torch.tanh(checkpoint(inner, torch.cos(z), use_reentrant=False)) + 1

    def f(x):
        return checkpoint(outer, x, use_reentrant=False).sum()

    x = torch.randn(64, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    f(xe).backward()
    names = _saved_names(tmp_path, f, x)
    torch.testing.assert_close(x.grad, xe.grad)
    assert names == ["primals_1"], names
