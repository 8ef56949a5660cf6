"""Minimal repros from the fourth round of user testing: 2-D tiled Triton pointwise
kernels (codegen/tiling.py), exact fake strides for every graph output
(ir/graph.py ``_output_spec``), channels-last convolutions (``conv_channels_last``) and
the per-code-object instruction cache of the translator; see FINDINGS_4.md.

Each test is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed) or a plain test for a pattern verified to work.
CPU only, both kernel backends ("cpp" and "triton" through its interpreter).
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
from report_helpers import (arg_copies, assert_arg_grads, assert_args_match, assert_outputs_match,
                            backward_both, rand, run_both)
import coil.codegen as CG
import coil.ir.graph as G

BACKENDS = ["cpp", "triton"]
bf16 = torch.bfloat16


def _check(fn, args, backend, *, grads=False, atol=1e-4, rtol=1e-4, options=None):
    """Run ``fn`` eagerly and compiled on separate copies of ``args``; compare outputs
    (values, dtype, shape, strides of every non-size-1 dim), mutated inputs and, with
    ``grads``, the gradients of the arguments that require grad (same random
    cotangents)."""
    a_ref, a_out = arg_copies(args), arg_copies(args)
    outs, refs = run_both(fn, a_ref, a_out, backend, options)
    assert len(outs) == len(refs)
    assert_outputs_match(outs, refs, atol, rtol, equal_nan=False)
    assert_args_match(a_ref, a_out, atol, rtol)
    if grads:
        backward_both(outs, refs)
        assert_arg_grads(a_ref, a_out, atol * 10, rtol * 10)
    return outs


_r = rand


@pytest.fixture
def tiled(monkeypatch):
    """Record the (Y, X) of every group that codegen runs as a 2-D tiled kernel."""
    hits = []
    orig = CG._tiling

    def recording(group, backend):
        r = orig(group, backend)
        if r is not None:
            hits.append(r)
        return r

    monkeypatch.setattr(CG, "_tiling", recording)
    return hits


# ---------------------------------------------------------------------------------
# Defects (xfail strict)
# ---------------------------------------------------------------------------------

def _helper_that_breaks(x):
    y = x + 1
    print("", end="")  # graph break inside the inlined call
    return y * 2


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
# fixed (aot/runtime.py _make_epilogue: single_leaf needs one leaf): regression test
def test_break_in_inlined_call_under_no_grad(backend):
    def f(x):
        with torch.no_grad():
            return _helper_that_breaks(x)

    coil.reset()
    x = torch.randn(3, 4)
    out = coil.compile(f, backend=backend, options={"cpu_backend": "cpp"} if backend == "coil" else None)(x)
    torch.testing.assert_close(out, f(x))


# fixed (aot/runtime.py _make_epilogue: single_leaf needs one leaf): regression test
def test_reflect_padded_conv_module_under_no_grad():
    torch.manual_seed(0)
    m = nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect").eval()

    def f(x):
        with torch.no_grad():
            return m(x)

    coil.reset()
    x = torch.randn(2, 4, 7, 8)
    torch.testing.assert_close(coil.compile(f, options={"cpu_backend": "cpp"})(x), f(x))


def test_graph_break_in_inlined_call_with_grad_enabled_is_fine():
    # the same program without no_grad: the first graph has no calls, none is compiled
    def f(x):
        return _helper_that_breaks(x)

    coil.reset()
    x = torch.randn(3, 4)
    torch.testing.assert_close(coil.compile(f, backend="aot_eager")(x), f(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_transposed_output_strides(backend):
    """Fixed (session 5, ir/graph.py ``_empty_eager``): zero-element outputs get eager's strides."""
    coil.reset()
    x = torch.randn(0, 17)
    f = lambda x: x.t().contiguous() + 1
    out, ref = coil.compile(f, options={"cpu_backend": backend})(x), f(x)
    assert out.shape == ref.shape
    assert out.stride() == ref.stride(), (out.stride(), ref.stride())


EMPTY_PROGRAMS = {
    "permute_sin_add": (lambda x: x.permute(2, 0, 1).sin() + 1, lambda: [torch.randn(3, 0, 5)]),
    "several_outputs": (lambda x: (x + 1, x.t() - 1, x.t().softmax(-1)), lambda: [torch.randn(0, 4)]),
    "slice_of_nonempty": (lambda x: x[:, :0].t() + 1, lambda: [torch.randn(4, 3)]),
    "cast_and_cat": (lambda x: torch.cat([x.t(), x.t()]).to(torch.float64) * 2, lambda: [torch.randn(0, 3)]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(EMPTY_PROGRAMS))
def test_empty_outputs_have_eager_strides(backend, name):
    """Zero-element outputs take the strides of eager's ATen ops (run on empty tensors)."""
    fn, make = EMPTY_PROGRAMS[name]
    coil.reset()
    args = make()
    outs, refs = coil.compile(fn, options={"cpu_backend": backend})(*args), fn(*args)
    outs, refs = (outs, refs) if isinstance(refs, tuple) else ((outs,), (refs,))
    for o, r in zip(outs, refs):
        assert (o.shape, o.stride(), o.dtype) == (r.shape, r.stride(), r.dtype)


# ---------------------------------------------------------------------------------
# 2-D tiled pointwise kernels: verified patterns
# ---------------------------------------------------------------------------------

def _emb_t(w, i, x):
    return (F.embedding(i, w) * x.t()).contiguous()


TILED_PROGRAMS = {
    # name: (fn, args, expect a tiled kernel on the triton backend)
    "t_plus": (lambda x, y: x.t() + y, lambda: [_r(33, 17), _r(17, 33)], True),
    "prime": (lambda x: x.t().contiguous() + 1, lambda: [_r(97, 101)], True),
    "min_8x8": (lambda x: x.t().contiguous() + 1, lambda: [_r(8, 8)], True),
    "thin_8x200": (lambda x: x.t().contiguous() - 1, lambda: [_r(200, 8)], True),
    "nchw_nhwc": (lambda x: x.permute(0, 2, 3, 1).contiguous().sin(), lambda: [_r(2, 13, 7, 11)], True),
    "ncdhw_ndhwc": (lambda x: x.permute(0, 2, 3, 4, 1).contiguous() * 2, lambda: [_r(2, 11, 3, 4, 5)], True),
    "size1_mid": (lambda x: x.permute(2, 1, 0).contiguous() + 1, lambda: [_r(9, 1, 10)], True),
    "bool_and": (lambda x, y: x.t() & y, lambda: [torch.rand(31, 17) > .5, torch.rand(17, 31) > .5], True),
    "int64_floordiv": (lambda x: (x.t() // 3).contiguous() % 7,
                       lambda: [torch.randint(-1000, 1000, (29, 31))], True),
    "uint8": (lambda x: (x.t() + 3).contiguous(), lambda: [torch.randint(0, 255, (29, 31), dtype=torch.uint8)], True),
    "bf16_mixed": (lambda x, y: x.t() + y, lambda: [_r(29, 31, dtype=bf16), _r(31, 29)], True),
    "fp16_out": (lambda x: x.t().half().contiguous(), lambda: [_r(40, 30)], True),
    "view_offset_input": (lambda x: x.t().contiguous() * 2, lambda: [_r(40, 50)[3:, 5:]], True),
    "step_view_input": (lambda x: x.t().contiguous() * 2, lambda: [_r(40, 50)[1::2, 3:]], True),
    "3d_view_input": (lambda x: x.permute(0, 2, 1).contiguous() * 2, lambda: [_r(4, 30, 20)[1:3, 2:, 1:]], True),
    "view_offset_inside": (lambda x: x[3:, 2:].t().contiguous() + 1, lambda: [_r(40, 50)], True),
    "indirect_neg_index": (lambda w, i, x: w[i] + x.t(),
                           lambda: [_r(50, 24), torch.randint(-50, 50, (40,)), _r(24, 40)], True),
    "embedding": (_emb_t, lambda: [_r(50, 24), torch.randint(0, 50, (40,)), _r(24, 40)], True),
    "gather": (lambda x, i, y: torch.gather(x, 1, i) + y.t(),
               lambda: [_r(40, 30), torch.randint(0, 30, (40, 24)), _r(24, 40)], True),
    "index_2d": (lambda x, i, j, y: x[i[:, None], j[None, :]] + y.t(),
                 lambda: [_r(40, 30), torch.randint(0, 40, (16,)), torch.randint(0, 30, (20,)), _r(20, 16)], True),
    "cat": (lambda x, y: torch.cat([x.t(), y], 1).contiguous() * 2, lambda: [_r(24, 40), _r(40, 16)], True),
    "pad": (lambda x, y: F.pad(x.t(), (1, 2, 3, 4)) + y, lambda: [_r(24, 40), _r(47, 27)], True),
    "where": (lambda m, x, y: torch.where(m.t(), x, y), lambda: [torch.rand(24, 40) > .5, _r(40, 24), _r(40, 24)], True),
    "tril": (lambda x: torch.tril(x.t()).contiguous() + 1, lambda: [_r(40, 30)], True),
    "row_bcast": (lambda x, b: (x.t() + b[:, None]).contiguous(), lambda: [_r(24, 40), _r(40)], True),
    "x_plus_xt": (lambda x: x + x.t(), lambda: [_r(37, 37)], True),
    "after_mm": (lambda x, w: ((x @ w).t().contiguous() + 1) @ w.t(), lambda: [_r(64, 48), _r(48, 64)], True),
    "three_outputs": (lambda x: (x.t().contiguous() + 1, x.t() * 2, x + 3), lambda: [_r(40, 30)], True),
    "aliased_outputs": (lambda x: (lambda a: (a, a.t(), a[2:]))(x.t().contiguous() * 2), lambda: [_r(24, 40)], True),
    "flip_t": (lambda x: x.flip(1).t().contiguous() + 1, lambda: [_r(29, 31)], False),
    "permute_3d_201": (lambda x: x.permute(2, 0, 1).contiguous() + 1, lambda: [_r(9, 11, 13)], False),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(TILED_PROGRAMS))
def test_tiled_pointwise_programs(name, backend, tiled):
    torch.manual_seed(0)
    fn, make, expect = TILED_PROGRAMS[name]
    args = make()
    low = any(isinstance(a, torch.Tensor) and a.dtype in (bf16, torch.float16) for a in args) or name == "fp16_out"
    _check(fn, args, backend, atol=1e-2 if low else 1e-4, rtol=1e-2 if low else 1e-4)
    if backend == "triton" and expect:
        assert tiled, "expected a 2-D tiled kernel"
    if backend == "cpp":
        assert not tiled


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_dropout_mask_is_not_repeated(backend, tiled):
    # random numbers in a tiled kernel: the keep mask must not repeat along either axis
    coil.reset()
    f = coil.compile(lambda x: F.dropout(x.t(), 0.5, training=True).contiguous() * 1,
                     options={"cpu_backend": backend})
    o = f(torch.rand(64, 48) + 1)
    m = (o != 0).float()
    assert 0.4 < m.mean().item() < 0.6
    assert 0.4 < (m[:, :-1] == m[:, 1:]).float().mean().item() < 0.6
    assert 0.4 < (m[:-1] == m[1:]).float().mean().item() < 0.6


MUTATIONS = {
    "copy_t": (lambda x, y: x.copy_(y.t()), lambda: [_r(24, 40), _r(40, 24)]),
    "t_add_": (lambda x: (x.t().add_(1), x * 2)[1], lambda: [_r(24, 40)]),
    "perm_copy_4d": (lambda x, y: x.permute(0, 3, 1, 2).copy_(y), lambda: [_r(2, 9, 10, 12), _r(2, 12, 9, 10)]),
    "slice_t_add_": (lambda x, y: x[:, 2:10].t().add_(y), lambda: [_r(9, 16), _r(8, 9)]),
    "view_input_t_add_": (lambda x, y: x.t().add_(y), lambda: [_r(16, 20)[2:, 1:], _r(19, 14)]),
    "out_t_of_mutated": (lambda x, y: (x.add_(y.t()), x.t()), lambda: [_r(9, 16), _r(16, 9)]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutation_through_transposes(name, backend):
    torch.manual_seed(0)
    fn, make = MUTATIONS[name]
    _check(fn, make(), backend)


TRAINING = {
    "t_mul": (lambda x, w: (x.t().contiguous() * w).sin(), lambda: [_r(24, 40, grad=True), _r(40, 24, grad=True)]),
    "slice_t": (lambda x: (x[:, 1:30].t() * 2).contiguous().tanh(), lambda: [_r(24, 40, grad=True)]),
    "nhwc": (lambda x: x.permute(0, 2, 3, 1).contiguous().sigmoid() * x.permute(0, 2, 3, 1),
             lambda: [_r(2, 12, 9, 10, grad=True)]),
    "ncdhw_sum": (lambda x, y: (x.permute(0, 2, 3, 4, 1) * y).sum(-1),
                  lambda: [_r(2, 11, 3, 4, 5, grad=True), _r(3, 4, 5, 11, grad=True)]),
    "saved_t_step_slice_mm": (lambda x, w: ((x * 2).t()[1:, ::2]) @ w,
                              lambda: [_r(10, 9, grad=True), _r(5, 3, grad=True)]),
    "saved_expand_t": (lambda x, y: (x.sin() + 1).t().expand(4, -1, -1) * y,
                       lambda: [_r(6, 7, grad=True), _r(4, 7, 6, grad=True)]),
    "expand_output": (lambda x: ((x.sin() + 1).expand(4, -1, -1), x.cos()), lambda: [_r(6, 7, grad=True)]),
    "as_strided_output": (lambda x: torch.as_strided(x.exp(), (5, 4), (3, 1), 2), lambda: [_r(20, grad=True)]),
    "head_merge": (lambda x: (x * 2).transpose(1, 2).reshape(2, 9, 24).tanh(), lambda: [_r(2, 3, 9, 8, grad=True)]),
    "embedding_t": (lambda w, i: (F.embedding(i, w).transpose(0, 1) * 2).contiguous(),
                    lambda: [_r(50, 24, grad=True), torch.randint(0, 50, (40, 12))]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(TRAINING))
def test_training_through_transposes(name, backend):
    torch.manual_seed(0)
    fn, make = TRAINING[name]
    _check(fn, make(), backend, grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_aliasing_is_preserved(backend):
    # outputs that view one computed value share its storage, as in eager
    def f(x):
        a = x.cos() * 2
        return a, a.t(), a[1:], a.expand(3, -1, -1)

    coil.reset()
    x = torch.randn(6, 7)
    out, ref = coil.compile(f, options={"cpu_backend": backend})(x), f(x)
    base = out[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in out)
    assert [t.storage_offset() for t in out] == [t.storage_offset() for t in ref]
    out[0].add_(1)
    ref[0].add_(1)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)


NON_DENSE_OUTPUTS = {
    "unfold": (lambda x: (x * 2).unfold(1, 3, 2), lambda: [_r(5, 17)]),
    "diagonal": (lambda x: (x + 1).diagonal(1, 0, 2), lambda: [_r(7, 3, 9)]),
    "as_strided_overlap": (lambda x: torch.as_strided(x * 2, (5, 4), (1, 1)), lambda: [_r(20)]),
    "step_slice_t": (lambda x: (x * 2)[::2, 1::3].t(), lambda: [_r(9, 10)]),
    "expand_of_t": (lambda x: (x.t() + 1)[:, None, :].expand(-1, 3, -1), lambda: [_r(6, 7)]),
    "expand_of_reduction": (lambda x: (x.sum(1, keepdim=True) + 1).expand(-1, 5), lambda: [_r(6, 7)]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(NON_DENSE_OUTPUTS))
def test_non_dense_outputs_keep_fake_strides(name, backend):
    torch.manual_seed(0)
    fn, make = NON_DENSE_OUTPUTS[name]
    _check(fn, make(), backend)


# ---------------------------------------------------------------------------------
# Channels-last convolutions (CPU enabled for the test)
# ---------------------------------------------------------------------------------

@pytest.fixture
def cl_on_cpu(monkeypatch):
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))


def _no_grad(fn):
    def g(*a):
        with torch.no_grad():
            return fn(*a)
    return g


torch.manual_seed(123)
_W1, _B1 = torch.randn(8, 3, 3, 3), torch.randn(8)
_W2 = torch.randn(8, 8, 3, 3)
_W3 = torch.randn(4, 11, 1, 1)
_BN = [torch.randn(8), torch.rand(8) + .5, torch.randn(8), torch.randn(8)]


def _c1(x):
    return F.conv2d(x, _W1, _B1, padding=1)


CONV_PROGRAMS = {
    "groups_pad2": lambda x: F.conv2d(x, torch.ones(9, 1, 3, 3) * _W1[:1, :1], groups=3, padding=2),
    "stride_dilation": lambda x: F.conv2d(x, _W1, stride=2, dilation=2, padding=1),
    "depthwise": lambda x: F.conv2d(_c1(x), _W2[:, :1], groups=8, padding=1),
    "1x1_chain": lambda x: F.conv2d(F.conv2d(x, _W1[:, :, :1, :1]).relu(), _W2[:, :, 1:2, 1:2]),
    "C1_input": lambda x: F.conv2d(x[:, :1], _W1[:, :1]),
    "1x1_spatial_out": lambda x: F.conv2d(x[:, :, :3, :3], _W1),
    "transpose_conv": lambda x: F.conv_transpose2d(x, _W1.transpose(0, 1), stride=2),
    "residual": lambda x: F.conv2d(F.relu(_c1(x)), _W2, padding=1) + _c1(x),
    "bn_eval_relu_maxpool": lambda x: F.max_pool2d(F.relu(F.batch_norm(_c1(x), *_BN, False)), 3, 2, 1),
    "maxpool_indices": lambda x: F.max_pool2d(_c1(x), 2, return_indices=True),
    "avgpool_ceil": lambda x: F.avg_pool2d(_c1(x), 2, ceil_mode=True, count_include_pad=False),
    "adaptive": lambda x: F.adaptive_avg_pool2d(_c1(x), (3, 2)).flatten(1),
    "cat_then_conv": lambda x: F.conv2d(torch.cat([_c1(x), x], 1), _W3),
    "cat_output": lambda x: torch.cat([_c1(x), x], 1),
    "aliased_outputs": lambda x: (lambda h: (h, h[:, :3], h.transpose(2, 3)))(_c1(x)),
    "view_output": lambda x: (lambda h: (h, h.view(2, 8, 90)))(_c1(x)),
    "permute_output": lambda x: _c1(x).permute(0, 2, 3, 1) + 1,
    "slice_relu": lambda x: _c1(x)[:, :, 1:, ::2].relu(),
    "glu": lambda x: F.glu(_c1(x), 1),
    "pixel_shuffle": lambda x: F.pixel_shuffle(_c1(x), 2),
    "bilinear": lambda x: F.interpolate(_c1(x), scale_factor=2, mode="bilinear", align_corners=False),
    "argmax_channels": lambda x: _c1(x).argmax(1),
    "unbatched": lambda x: F.conv2d(x[0], _W1, _B1),
    "input_transposed": lambda x: F.conv2d(x.transpose(2, 3), _W1),
    "input_channels_last": lambda x: F.relu(F.conv2d(x.contiguous(memory_format=torch.channels_last), _W1)),
    "bf16": lambda x: F.conv2d(x.bfloat16(), _W1.bfloat16()).float(),
    "group_norm": lambda x: F.group_norm(_c1(x), 2),
    "se_block": lambda x: (lambda h: h * torch.sigmoid(h.mean((2, 3), keepdim=True)))(F.hardswish(_c1(x))),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CONV_PROGRAMS))
def test_channels_last_conv_programs(name, backend, cl_on_cpu):
    torch.manual_seed(0)
    tol = 2e-2 if name == "bf16" else 1e-4
    _check(_no_grad(CONV_PROGRAMS[name]), [_r(2, 3, 9, 10)], backend, atol=tol, rtol=tol,
           options={"conv_channels_last": True, "conv_channels_last_training": True})


def _bn_net():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, groups=2, stride=2), nn.BatchNorm2d(8))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["train_no_grad", "eval_inference_mode"])
def test_channels_last_batchnorm_modes(backend, mode, cl_on_cpu):
    # train mode under no_grad mutates running stats in an inference graph
    m1, m2 = _bn_net(), _bn_net()
    ctx = torch.no_grad
    if mode == "eval_inference_mode":
        m1.eval(), m2.eval()
        ctx = torch.inference_mode
    coil.reset()
    c = coil.compile(m2, options={"cpu_backend": backend, "conv_channels_last": True, "conv_channels_last_training": True})
    x = torch.randn(2, 3, 11, 10)
    with ctx():
        for s in (1.0, 2.0):
            r, o = m1(x * s), c(x * s)
            torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
            assert o.stride() == r.stride()
    for (n, p), (_, q) in zip(m1.named_buffers(), m2.named_buffers()):
        torch.testing.assert_close(q, p, atol=1e-4, rtol=1e-4, msg=n)


# ---------------------------------------------------------------------------------
# Capture: instruction cache per code object
# ---------------------------------------------------------------------------------

def _long_function_with_break():
    body = "\n".join(f"            x = x * {1 + i / 100000} + {i / 10000}" for i in range(100))
    src = ("def long_brk(x, flag):\n    for k in range(3):\n        if flag:\n" + body +
           "\n        print('', end='')\n        if k == 1:\n            x = x.cos()\n"
           "            continue\n" + body.replace("            x", "        x") + "\n    return x\n")
    ns = {}
    exec(src, ns)
    return ns["long_brk"]


def test_extended_arg_function_with_break_and_loop():
    import dis
    f = _long_function_with_break()
    assert any(i.opname == "EXTENDED_ARG" for i in dis.get_instructions(f))
    coil.reset()
    cf = coil.compile(f, options={"cpu_backend": "cpp"})
    for i in range(4):
        x, flag = torch.randn(5), bool(i % 2)
        torch.testing.assert_close(cf(x, flag), f(x, flag), atol=1e-4, rtol=1e-4)


def _make_scale(k):
    def g(x):
        return x * k
    return g


_SCALES = [_make_scale(k) for k in range(1, 5)]


def _rec(x, n):
    return x if n == 0 else _rec(x * 2 + 1, n - 1)


def _gen(x):
    for i in range(4):
        yield x * i


def _helper(x, a):
    return x.sin() * a


def test_same_code_inlined_many_ways():
    # closures sharing one code object with different cells, recursion, a generator, and
    # one helper inlined from several call sites (incl. a comprehension), recompiled
    def f(x):
        for g in _SCALES:
            x = g(x) + 1
        y = _rec(x, 5) + sum(_gen(x))
        z = _helper(_helper(y, 2), 3) + sum(_helper(x, i) for i in range(3))
        return z

    coil.reset()
    cf = coil.compile(f, options={"cpu_backend": "cpp"})
    for n in (5, 6, 5, 7, 5):
        x = torch.randn(n)
        torch.testing.assert_close(cf(x), f(x), atol=1e-4, rtol=1e-4)
