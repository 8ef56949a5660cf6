"""Minimal repros from the eighth round of user testing: gather/scatter indexing, mutation
and aliasing of inputs and module buffers, and RNG; see FINDINGS_8.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed); the plain tests are compact versions of patterns
verified to work. CPU only, both kernel backends ("cpp" and "triton" through its
interpreter).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
from report_helpers import (arg_copies, assert_arg_grads, assert_args_match, assert_outputs_match,
                            backward_both, run_both)

BACKENDS = ["cpp", "triton"]


def _check(fn, args, backend, *, grad=False, atol=1e-4, rtol=1e-4, options=None):
    """Eager vs compiled on copies of ``args``: values, dtype, shape, the arguments after the
    call (mutation) and, with ``grad``, the arguments' gradients."""
    a_ref, a_out = arg_copies(args), arg_copies(args)
    outs, refs = run_both(fn, a_ref, a_out, backend, options)
    assert_outputs_match(outs, refs, atol, rtol, same=None, equal_nan=False)
    assert_args_match(a_ref, a_out, atol, rtol)
    if grad:
        backward_both(outs, refs)
        assert_arg_grads(a_ref, a_out, atol, rtol)
    return outs


def _compiled(fn, backend, **opts):
    coil.reset()
    return coil.compile(fn, options={"cpu_backend": backend, **opts})


# -- verified to work (compact versions of what was tried; FINDINGS_8.md lists more) ------

@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_style_indexing(backend):
    torch.manual_seed(0)
    x = torch.randn(8, 5, requires_grad=True)
    y = torch.randn(4, 6, 5, requires_grad=True)
    w = torch.randn(10, 4, requires_grad=True)
    i, j = torch.tensor([[0], [-2], [3], [0]]), torch.tensor([1, -1, 4, 1])
    ids = torch.tensor([[0, 2, 9], [2, 2, 0]])

    def f(x, y, w, i, j, ids):
        return (x[i[:, 0]], x[i, j], x[i, 1:3], y[:, i], y[j[:3] % 4, :, i[:3, 0]], x[None, ..., j],
                torch.index_select(x, 1, j % 5), torch.gather(x, 1, (ids % 5).repeat(4, 1)),
                torch.take_along_dim(x, (ids % 5).repeat(4, 1), 1), torch.take(x, j * 7),
                F.embedding(ids, w, padding_idx=2), F.embedding(ids, w, scale_grad_by_freq=True),
                x[x.detach() > 0], x[torch.tensor(-2), j])
    _check(f, [x, y, w, i, j, ids], backend, grad=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_style_ops(backend):
    torch.manual_seed(0)
    x = torch.randn(6, 5, requires_grad=True)
    s = torch.randn(6, 5, requires_grad=True)
    dup = torch.tensor([1, 3, 1, -1, 0, 1])
    ri = torch.randint(0, 3, (6, 5))
    m = torch.randn(6, 5) > 0

    def f(x, s, dup, ri, m):
        out = [torch.index_put(x, (dup,), s, accumulate=True),
               torch.index_put(x, (dup[:2], dup[2:4]), s[0, :2], accumulate=True),
               x.index_add(0, dup % 6, s, alpha=2), torch.scatter_add(x, 0, ri, s),
               x.masked_scatter(m, s), torch.slice_scatter(x, s[:, :2], 1, 1, 5, 2),
               torch.select_scatter(x, s[:, 0], 1, -1), torch.diagonal_scatter(x, s[0, :4], -2)]
        for red in ("sum", "prod", "amax", "amin", "mean"):
            for inc in (True, False):
                out.append(torch.scatter_reduce(x, 0, ri, s, red, include_self=inc))
        return tuple(out)
    _check(f, [x, s, dup, ri, m], backend, grad=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cat_stack_pad(backend):
    torch.manual_seed(0)
    a, e = torch.randn(3, 4, requires_grad=True), torch.randn(0, 4, requires_grad=True)
    b = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 3, 6, 7, requires_grad=True)

    def f(a, e, b, x):
        return (torch.cat([e, a, e]), torch.cat([a, b]), torch.cat([a > 0, a.long()]),
                torch.stack([a, a * 2], 2), F.pad(x, (-2, -1, 1, -3), value=1.5),
                F.pad(x, (3, -4)), F.pad(x, (2, 1, 3, 0), mode="reflect"),
                F.pad(x, (2, 1, 3, 0), mode="replicate"), F.pad(x, (0, -1, 2, 2), mode="circular"))
    _check(f, [a, e, b, x], backend, grad=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_on_inputs_and_views_and_aliased_outputs(backend):
    torch.manual_seed(0)

    def f(x, y, z, i, v):
        x[:, 0] = y
        x.t()[1].mul_(2)
        x.diagonal().zero_()
        x.view(-1)[::3].fill_(3)
        z.index_put_((i,), v, accumulate=True)
        z.clamp_(-0.5, 0.5)
        return x.sum(1), z.view(-1), z[0], x.t()[1:]
    args = [torch.randn(4, 5), torch.randn(4), torch.randn(6, 5), torch.tensor([0, 0, -1]),
            torch.randn(3, 5)]
    a_ref, a_out = arg_copies(args), arg_copies(args)
    outs, refs = run_both(f, a_ref, a_out, backend)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r)
    for x, y in zip(a_ref, a_out):
        torch.testing.assert_close(y, x)
    a_out[2].add_(100)  # z.view(-1) and z[0] alias z as in eager
    torch.testing.assert_close(outs[1], a_out[2].view(-1))
    torch.testing.assert_close(outs[2], a_out[2][0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_buffers_batchnorm_train(backend):
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(3)
            self.register_buffer("ema", torch.zeros(3))

        def forward(self, x):
            y = self.bn(x)
            self.ema.mul_(0.9).add_(y.mean((0, 2, 3)).detach(), alpha=0.1)
            return y - self.ema[:, None, None]
    m1 = M()
    m2 = copy.deepcopy(m1)
    cm = _compiled(m2, backend)
    for _ in range(2):
        x = torch.randn(4, 3, 5, 5)
        torch.testing.assert_close(cm(x), m1(x), atol=1e-4, rtol=1e-4)
    for (n, b1), b2 in zip(m1.named_buffers(), m2.buffers()):
        torch.testing.assert_close(b2, b1, atol=1e-5, rtol=1e-4, msg=lambda s: f"{n}: {s}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rng_shapes_ranges_determinism_and_fallback_random(backend):
    x = torch.ones(200, 500)

    def f(x):
        return (torch.rand(200, 500), torch.randn(200, 500), F.dropout(x, 0.3, training=True),
                torch.bernoulli(x * 0.25), torch.rand_like(x.half()))
    cf = _compiled(f, backend)
    torch.manual_seed(0)
    a = cf(x)
    b = cf(x)
    torch.manual_seed(0)
    c = cf(x)
    for u, v, w in zip(a, b, c):
        assert not torch.equal(u, v) and torch.equal(u, w)
    r, n, d, bern, h = a
    assert 0 <= r.min() and r.max() < 1 and abs(r.mean() - 0.5) < 0.01
    assert abs(n.mean()) < 0.01 and abs(n.std() - 1) < 0.01
    assert set(d.unique().tolist()) <= {0.0, torch.tensor(1 / 0.7).item()} and abs(d.mean() - 1) < 0.01
    assert abs(bern.mean() - 0.25) < 0.01 and h.dtype == torch.float16
    cf = _compiled(f, backend, fallback_random=True)
    torch.manual_seed(0)
    got = cf(x)
    torch.manual_seed(0)
    for u, v in zip(got, f(x)):
        assert torch.equal(u, v)


# -- defects ----------------------------------------------------------------------------

# 1. Guards do not cover input aliasing. The first call refuses aliased inputs with one of
# them mutated (coil/aot/compile.py _refuse_mutated_aliased_inputs), but that check only
# runs at compile time: a later call that passes the same tensor twice (or overlapping
# views) hits the cache entry built for distinct inputs and silently returns values
# computed as if they did not share memory.
# fixed: a graph that mutates an input checks aliasing on every call and runs the captured
# graph eagerly for aliased inputs (coil/aot/compile.py _check_aliasing_per_call)
@pytest.mark.parametrize("backend", BACKENDS)
def test_aliased_inputs_on_a_cache_hit(backend):
    def f(x, y):
        x.mul_(2)
        return y + 1
    cf = _compiled(f, backend)
    cf(torch.ones(3), torch.ones(3))  # compiled for distinct inputs
    a = torch.ones(3)
    out = cf(a, a)  # eager: y is x, so y + 1 == 3
    torch.testing.assert_close(out, torch.full((3,), 3.0))
    torch.testing.assert_close(a, torch.full((3,), 2.0))
    b = torch.arange(5.0)
    x, y = b[:3], b[2:]  # overlapping views, the compiled shapes: a cache hit too
    ref_b = torch.arange(5.0)
    ref = f(ref_b[:3], ref_b[2:])
    torch.testing.assert_close(cf(x, y), ref)
    torch.testing.assert_close(b, ref_b)
    # distinct inputs still run the compiled graph
    u, v = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(cf(u.clone(), v), f(u.clone(), v))


# 2. fixed: Triton: an out-of-range gather index read out of bounds and returned garbage
# (tl.device_assert was a no-op outside Triton's debug mode). Under the interpreter the
# check now runs, and raises coil.exc.KernelIndexError (an IndexError) as the C++ backend.
@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_index_raises(backend):
    cf = _compiled(lambda x, i: x[i] * 2, backend)
    with pytest.raises(IndexError):
        cf(torch.randn(8, 3), torch.tensor([8]))


# 3. fixed: scatter_add in bfloat16/float16 accumulated in the low precision; eager's CPU
# scatter_add accumulates in float32 (512 x 0.1 in bf16: eager 51.25, coil gave 32). On CPU
# coil now scatters into an fp32 copy (coil/ir/lowering_views.py _scatter).
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scatter_add_low_precision_accumulation(backend, dtype):
    idx = torch.zeros(512, dtype=torch.long)
    src = torch.full((512,), 0.1, dtype=dtype)
    _check(lambda x, i, s: x.scatter_add(0, i, s), [torch.zeros(2, dtype=dtype), idx, src],
           backend, atol=0, rtol=0)


# 4. Triton: accumulate=True index_put / index_add / scatter_add on a bfloat16 tensor raises
# "InterpreterError: ValueError('Unsupported data type')" (the atomic add); eager and C++ work.
@pytest.mark.parametrize("backend", ["cpp", "triton"])  # Triton accumulates bf16 through an fp32 copy
def test_bf16_index_put_accumulate(backend):
    _check(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
           [torch.zeros(6, dtype=torch.bfloat16), torch.tensor([1, 3, 1]),
            torch.tensor([0.5, 1.0, 2.0], dtype=torch.bfloat16)], backend, atol=0, rtol=0)


# 5. fixed: F.embedding(max_norm=...) renormalises through weight.detach(), so the mutation
# is not under no_grad; the runtime wrote it back to the grad-requiring leaf with autograd
# on and failed. Leaves that require grad are now written back under no_grad
# (coil/aot/runtime.py epilogue): a differentiable in-place op on one fails while tracing.
@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_max_norm_weight_requires_grad(backend):
    torch.manual_seed(0)
    m1 = nn.Embedding(10, 4, max_norm=1.0)
    m2 = copy.deepcopy(m1)
    i = torch.tensor([1, 2, 2, 7])
    out = _compiled(m2, backend)(i)
    ref = m1(i)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(m2.weight, m1.weight)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(m2.weight.grad, m1.weight.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_in_place_on_grad_leaf_still_raises(backend):
    w = nn.Parameter(torch.randn(3))

    def f(x, w):
        w.add_(1)
        return x * w
    with pytest.raises(RuntimeError, match="leaf Variable"):
        _compiled(f, backend)(torch.randn(3), w)


# 6. Negative indices to index_select / gather / index_add / scatter are wrapped (the
# indirect_indexing of every lowering adds the size); eager raises ("index out of range in
# self" / "index -1 is out of bounds"). Both backends return a result.
# Fixed: ops.indirect_indexing(..., wrap_neg=False) from these lowerings; the Triton
# backend's check (a tl.device_assert: always on in the interpreter, on a GPU in Triton's
# debug mode) reads the index as given, and the kernel still wraps a negative one so that
# it stays inside the tensor where the assert is off.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["index_select", "gather", "scatter"])
def test_negative_index_select_raises(backend, op):
    f = {"index_select": lambda x, i: torch.index_select(x, 0, i) * 2,
         "gather": lambda x, i: x.gather(0, i.view(2, 1).expand(2, 5)) * 2,
         "scatter": lambda x, i: x.scatter(0, i.view(2, 1).expand(2, 5), 1.0) * 2}[op]
    cf = _compiled(f, backend)
    with pytest.raises((IndexError, RuntimeError)):
        cf(torch.randn(8, 5), torch.tensor([-1, 0]))
    x, i = torch.randn(8, 5), torch.tensor([7, 0])
    torch.testing.assert_close(cf(x, i), f(x, i))


# 7. A buffer updated in place from a value that requires grad (no detach), e.g.
# ``self.ema.mul_(0.9).add_(x.mean(0), alpha=0.1)``: the second training step's backward
# raises "Trying to backward through the graph a second time" (it walks into the first
# step's compiled autograd node, whose saved tensors are freed); eager's ops there save
# nothing, so eager runs.
# (fixed: a compiled node that saves no tensors does not call save_for_backward, so nothing of it is freed)
@pytest.mark.parametrize("backend", BACKENDS)
def test_buffer_with_grad_history_two_steps(backend):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ema", torch.zeros(3))

        def forward(self, x):
            self.ema.mul_(0.9).add_(x.mean(0), alpha=0.1)
            return x - self.ema
    xs = [torch.randn(4, 3) for _ in range(2)]
    grads = []
    for m in (M(), _compiled(M(), backend)):
        a = [x.clone().requires_grad_() for x in xs]
        for x in a:
            m(x).sum().backward()
        grads.append([x.grad for x in a])
    torch.testing.assert_close(grads[1], grads[0])
