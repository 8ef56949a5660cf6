"""Minimal repros from the third round of user testing: the loop-order / strided-view /
output-layout / padded-matmul-operand changes (c95b685, ea8fc42, 72e8cd9); see
FINDINGS_3.md.

Each test is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed) or a plain test for a pattern verified to work.
CPU only, both kernel backends ("cpp" and "triton" through its interpreter).
"""
import pytest
import torch
import torch.nn.functional as F

import coil
from report_helpers import (arg_copies, assert_arg_grads, assert_outputs_match, backward_both, rand,
                            run_both, strides_agree)
import coil.ir.graph as G

BACKENDS = ["cpp", "triton"]
bf16 = torch.bfloat16


def _dense(t):
    """Whether ``t`` is dense and non-overlapping in some dim order (eager promises its
    strides then)."""
    pairs = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1)
    expect = 1
    for st, n in pairs:
        if st != expect:
            return False
        expect *= n
    return True


def _check(fn, args, backend, *, grads=False, atol=1e-4, rtol=1e-4, strides=True):
    """Run ``fn`` eagerly and compiled on separate copies of ``args``; compare outputs
    (values, dtype, shape; strides where eager's output is dense) and, with ``grads``,
    the gradients of the arguments that require grad (same random cotangents)."""
    a_ref, a_out = arg_copies(args), arg_copies(args)
    outs, refs = run_both(fn, a_ref, a_out, backend)
    assert len(outs) == len(refs)
    same = (lambda o, r: not _dense(r) or strides_agree(o, r)) if strides else None
    assert_outputs_match(outs, refs, atol, rtol, same=same, equal_nan=False)
    if grads:
        backward_both(outs, refs)
        assert_arg_grads(a_ref, a_out, atol * 10, rtol * 10)
    return outs


_r = rand


@pytest.fixture
def pad_on_cpu(monkeypatch):
    """Enable the misaligned-matmul padding on CPU and count the mm operands it padded."""
    monkeypatch.setattr(G, "_PAD_DEVICES", ("cuda", "cpu"))
    hits = []
    orig = G.GraphLowering._mm_with_padded_operand

    def counting(self, args, meta):
        r = orig(self, args, meta)
        if r is not None:
            hits.append(tuple(int(s) for s in args[0].get_size()))
        return r

    monkeypatch.setattr(G.GraphLowering, "_mm_with_padded_operand", counting)
    return hits


# ---------------------------------------------------------------------------------
# Fixed defects (were xfail strict; fixed by the exact-strides rule of
# GraphLowering._output_spec): plain regression tests now
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_saved_slice_of_pointwise_gives_wrong_grad(backend):
    # forward returns [sin, slice_1] with slice_1 = (x*2)[:, 1:5] materialized (6, 4) with
    # strides (4, 1); the backward graph's input slice_1 has the fake strides (7, 1), so its
    # kernel loads slice_1[7*i0 + i1 - 1]: rows 1.. are read from the wrong places (and past
    # the end of the 24-element buffer)
    _check(lambda x: (x * 2)[:, 1:5].sin(), [_r(6, 7, grad=True)], backend, grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_saved_slice_of_pointwise_into_mm_crashes_backward(backend):
    # RuntimeError: setStorage: sizes [4, 6], strides [1, 7] ... out of bounds for storage of size 96
    _check(lambda x, w: (x * 2)[:, 1:5] @ w, [_r(6, 7, grad=True), _r(4, 3, grad=True)], backend,
           grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_swiglu_chunk_of_pointwise_grads(backend):
    # the everyday form of the defect above: a pointwise op (scale + bias) before .chunk(2, -1)
    def swiglu(x, w, b):
        h = (x @ w) * 0.5 + b
        a, c = h.chunk(2, -1)
        return F.silu(a) * c

    _check(swiglu, [_r(8, 16, grad=True), _r(16, 24, grad=True), _r(24, grad=True)], backend,
           grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prog", ["halves", "step"])
def test_rotary_halves_and_step_slice_of_pointwise_grads(backend, prog):
    # rotate-half style x[..., :d/2] / x[..., d/2:] of a computed value, and a step slice
    # (when the value has more readers it is realized first and its slices are strided
    # views with eager's strides: that case is right)
    fns = {"halves": lambda x: (x * 1.5)[..., :4].sin() + (x * 1.5)[..., 4:].cos(),
           "step": lambda x: (x * 1.5)[:, ::2].sin()}
    _check(fns[prog], [_r(2, 3, 8, grad=True)], backend, grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_logits_slice_saved_for_backward(backend, pad_on_cpu):
    # 72e8cd9 copies a view output of a padded matmul with the fake strides only when the
    # fake tensor is dense; logits[:, :1000] is not: it gets (1000, 1) while the backward
    # reads it with (1027, 1). (Without padding, the same program is right: the slice is
    # then a ReinterpretView with eager's strides.)
    _check(lambda h, w: (h @ w)[:, :1000].sin(), [_r(1100, 64, grad=True, dtype=bf16),
                                                  _r(64, 1027, grad=True, dtype=bf16)],
           backend, grads=True, atol=5e-2, rtol=5e-2)


# ---------------------------------------------------------------------------------
# Verified to work (plain tests)
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_permuted_pointwise_outputs_keep_eager_strides(backend):
    def f(x, y):
        a = (x.permute(3, 1, 0, 2) + 1).sin()           # loop order [3, 1, 0, 2]-ish
        b = x.permute(0, 2, 1, 3) * 2                   # transposed middle dims
        c = torch.where(y.t() > 0, y.t() * 2, -y.t())   # (1, N) strides
        return a, b, c, (y.t() + 1).sum(0)

    _check(f, [_r(3, 17, 9, 33), _r(17, 9)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposed_value_to_matmul_and_returned(backend):
    # one materialization of y shared by the extern mm and the output (graph._materialize)
    def f(x, w):
        y = (x + 1).t()
        return y @ w, y, y.t()

    _check(f, [_r(5, 4, grad=True), _r(5, 3, grad=True)], backend, grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_views_of_mm_slices(backend):
    # view_strides: reshapes of a (6, 32) mm result's column slices stay strided views
    def f(x, w):
        y = x @ w
        a = y[:, 8:16].view(3, 2, 2, 4).transpose(1, 2)
        b = y[:, 16:].reshape(6, 4, 4).permute(2, 0, 1)
        return a, b, torch.bmm(b, b.transpose(1, 2)), a.sum(-1)

    _check(f, [_r(6, 7), _r(7, 32)], backend, strides=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_qkv_attention_training_views(backend):
    def attn(x, w):
        B, S, D, H = 2, 16, 32, 4
        qkv = (x @ w).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(B, S, D), v

    _check(attn, [_r(2, 16, 32, grad=True), _r(32, 96, grad=True)], backend, grads=True,
           strides=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_mlp_transposed_outputs_training(backend):
    def mlp(x, w1, w2):
        h = F.gelu(x @ w1, approximate="tanh")
        return (h @ w2).transpose(0, 1), h.t()

    _check(mlp, [_r(24, 16, grad=True, dtype=bf16), _r(16, 40, grad=True, dtype=bf16),
                 _r(40, 8, grad=True, dtype=bf16)], backend, grads=True, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_of_permuted_input_training(backend):
    def conv(x, w):
        y = x.permute(0, 3, 1, 2).relu()
        return F.conv2d(y, w, padding=1).permute(0, 2, 3, 1), y

    _check(conv, [_r(2, 8, 8, 3, grad=True), _r(4, 3, 3, 3, grad=True)], backend, grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reductions_over_permuted_values_training(backend):
    def red(x):
        y = (x * 3).permute(2, 0, 1)
        return y.sum(-1), y.amax(0), y.mean((0, 2)), torch.softmax(y, -1)

    _check(red, [_r(4, 5, 6, grad=True)], backend, grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_same_tensor_twice_and_views_alias_like_eager(backend):
    def f(x):
        y = x.sin()
        return y, y, y.t(), y[1:]

    outs = _check(f, [_r(4, 5)], backend, strides=False)
    base = outs[0].untyped_storage().data_ptr()
    assert all(o.untyped_storage().data_ptr() == base for o in outs)
    outs[0].add_(1)  # the views see the update, as in eager
    torch.testing.assert_close(outs[2], outs[0].t())


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_on_view_of_mm_result_and_input(backend):
    def f(x, w):
        y = x @ w
        q = y[:, :8].view(2, 2, 2, 4).transpose(1, 2)
        o = torch.matmul(q, q.transpose(-1, -2))
        y[:, :8].zero_()
        x.mul_(2)
        return o, q, y

    x, w = _r(4, 6), _r(6, 16)
    x2 = x.clone()
    _check(f, [x, w], backend, strides=False)
    # inputs were copied by _check; check the input mutation separately
    coil.reset()
    coil.compile(f, options={"cpu_backend": backend})(x2, w)
    torch.testing.assert_close(x2, x * 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size_and_size_one_permuted_outputs(backend):
    def f(x, z):
        return (x + 1).unsqueeze(1).transpose(0, 2), (z + 1).permute(1, 0, 2), (x * 2)[:, 2:2].t()

    _check(f, [_r(4, 5), _r(4, 0, 5)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_mm_operands_k_and_m(backend, pad_on_cpu):
    # K = 1025 row-major (padded columns, shared by two matmuls) and a transposed input
    # with M = 1001 (padded rows, result is a row prefix), forward and backward
    def f(a, b, c, t, d):
        y = a * 2
        return y @ b, y @ c, t[1:].t() @ d

    _check(f, [_r(1024, 1025, dtype=bf16), _r(1025, 64, dtype=bf16), _r(1025, 128, dtype=bf16),
               _r(1100, 1001, dtype=bf16), _r(1099, 64, dtype=bf16)],
           backend, atol=5e-2, rtol=5e-2)
    assert (1024, 1025) in pad_on_cpu and (1001, 1099) in pad_on_cpu, pad_on_cpu


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_mm_operand_training(backend, pad_on_cpu):
    _check(lambda t, b: (t.t() @ b).sin(), [_r(1100, 1001, grad=True, dtype=bf16),
                                            _r(1100, 64, grad=True, dtype=bf16)],
           backend, grads=True, atol=5e-2, rtol=5e-2)
    assert len(pad_on_cpu) >= 2, pad_on_cpu
