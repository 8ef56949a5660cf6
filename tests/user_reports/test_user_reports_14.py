"""Minimal repros from the fourteenth round of user testing: the three fixes of 9fb22e7
(``coil/aot/compile.py`` ``_clone_saved_mutated_inputs``: the training forward saves a
clone of a mutated input that the backward reads; ``coil/ir/lowering.py`` ``_mean`` /
``_var``: fp16/bf16 sums stay in fp32 until divided; ``make_reduction``: bool
max/min/argmax/argmin reduce as uint8); see FINDINGS_14.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed); the plain tests are compact versions of what was
verified to match eager (values, dtypes, shapes, gradients, mutated inputs and their
``_version``). CPU only; the Triton cases run through Triton's interpreter.
"""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil

from report_helpers import arg_copies

BACKENDS = ["cpp", "triton"]


def _gen(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda *s, grad=False: torch.randn(*s, generator=g).requires_grad_(grad)  # noqa: E731


def _compile(fn, backend):
    coil.reset()
    if backend == "aot_eager":
        return coil.compile(fn, backend="aot_eager")
    return coil.compile(fn, options={"cpu_backend": backend})


def _tup(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def _check_mutation(fn, args, backend, atol=1e-4, rtol=1e-4, versions=True):
    """Eager vs compiled on copies of ``args``: outputs, mutated args (values and, with
    ``versions``, ``_version``), then a backward with the same random cotangents through
    every output that requires grad; grads of the args that required grad on entry."""
    a_ref, a_out = arg_copies(args), arg_copies(args)
    leaf_grad = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    ref = _tup(fn(*a_ref))
    out = _tup(_compile(fn, backend)(*a_out))
    assert len(out) == len(ref)
    for i, (o, r) in enumerate(zip(out, ref)):
        assert o.shape == r.shape and o.dtype == r.dtype, (i, o.shape, r.shape, o.dtype, r.dtype)
        assert o.requires_grad == r.requires_grad, i
        torch.testing.assert_close(o, r, atol=atol, rtol=rtol)
    for i, (y, x) in enumerate(zip(a_out, a_ref)):
        torch.testing.assert_close(y.detach(), x.detach(), atol=atol, rtol=rtol)
        assert y.stride() == x.stride(), i
        if versions:
            assert y._version == x._version, (i, y._version, x._version)
    g = torch.Generator().manual_seed(99)
    pairs = [(o, r) for o, r in zip(out, ref) if r.requires_grad]
    cot = [torch.randn(r.shape, generator=g).to(r.dtype) for _, r in pairs]
    torch.autograd.backward([r for _, r in pairs], cot)
    torch.autograd.backward([o for o, _ in pairs], cot)
    for i, (y, x, lg) in enumerate(zip(a_out, a_ref, leaf_grad)):
        if lg:
            assert y.grad is not None, i
            torch.testing.assert_close(y.grad, x.grad, atol=atol, rtol=rtol)


# == 1. aot: the forward saves a clone of a mutated input the backward reads ==================

# -- verified to work -----------------------------------------------------------------------

def _m_mul(x, y):
    y.mul_(x)
    return x.cos()


def _m_ret(x, y):
    y.mul_(x)
    return y, x * 2, y.t()


def _m_chain(x, y):  # backward reads y before each op (y0 and the intermediate)
    y.mul_(x)
    y.add_(1)
    y.mul_(x)
    return x.cos()


def _m_exp(x, y):  # exp_'s backward reads the result, mul_'s the input
    y.mul_(x)
    y.exp_()
    return y


def _m_sigmoid(x, y):
    y.mul_(x)
    y.sigmoid_()
    return y.sum()


def _m_tanh(x, y):
    y.mul_(x)
    y.tanh_()
    return y * 2


def _m_pow(x, y):
    y.mul_(x)
    y.pow_(2)
    return y


def _m_addcmul(x, y):
    y.addcmul_(x, x.exp())
    return y + x


def _m_clamp(x, y):
    y.clamp_(min=x - 0.5, max=x + 0.5)
    return y


def _m_div(x, y):
    y.div_(x.exp())
    return x.cos()


def _m_lerp(x, y):
    y.lerp_(x, 0.3)
    return y


def _m_atan2(x, y):
    y.atan2_(x)
    return x * 1


def _m_two(x, y, z):
    y.mul_(x)
    z.mul_(y)
    return x.cos()


def _m_view_add(x, y):  # mutation through a view whose backward reads nothing of y
    y[0].add_(x[0])
    return y


def _m_view_then_mul(x, y):  # the saved value is the post-exp_ node, not a view of y
    y[0].exp_()
    y.mul_(x)
    return y


ONE_OP = {"mul": _m_mul, "ret": _m_ret, "addcmul": _m_addcmul, "clamp": _m_clamp,
          "div": _m_div, "lerp": _m_lerp, "atan2": _m_atan2, "view_add": _m_view_add}
MULTI_OP = {"chain": _m_chain, "exp": _m_exp, "sigmoid": _m_sigmoid, "tanh": _m_tanh,
            "pow": _m_pow, "view_then_mul": _m_view_then_mul}


@pytest.mark.parametrize("name", list(ONE_OP) + list(MULTI_OP))
def test_mutated_input_saved_for_backward(name):
    r = _gen(1)
    fn = {**ONE_OP, **MULTI_OP}[name]
    # eager bumps _version once per in-place op, coil once per call (see FINDINGS_14)
    _check_mutation(fn, [r(4, 5, grad=True), r(4, 5)], "cpp", versions=name in ONE_OP)


@pytest.mark.parametrize("backend", ["triton", "aot_eager"])
@pytest.mark.parametrize("name", ["mul", "ret", "exp", "clamp"])
def test_mutated_input_saved_other_backends(backend, name):
    r = _gen(2)
    fn = {**ONE_OP, **MULTI_OP}[name]
    _check_mutation(fn, [r(4, 5, grad=True), r(4, 5)], backend, versions=name in ONE_OP)


def test_two_mutated_inputs_saved():
    r = _gen(3)
    _check_mutation(_m_two, [r(4, 5, grad=True), r(4, 5), r(4, 5)], "cpp")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_mutated_input_other_dtypes(dtype):
    """y of another dtype than x (type promotion into y's dtype)."""
    r = _gen(4)
    _check_mutation(_m_mul, [r(4, 5, grad=True), r(4, 5).to(dtype)], "cpp", atol=2e-2, rtol=2e-2)
    _check_mutation(_m_ret, [r(4, 5).to(dtype).requires_grad_(), r(4, 5).to(dtype)], "cpp",
                    atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("layout", ["t", "slice", "offset", "channels_last"])
def test_mutated_input_layouts(layout):
    """Views of a bigger base and channels-last tensors as the mutated input: the base's
    other elements are kept, and the grad through ``y`` matches."""
    r = _gen(5)

    def make(base):
        return {"t": lambda: base[:5, :4].t(), "slice": lambda: base[:4, ::2],
                "offset": lambda: base[1:5, 3:8]}[layout]()

    def fy(x, y):
        y.mul_(x)
        return y.sum()

    for fn in (_m_mul, fy):
        if layout == "channels_last":
            y1 = r(2, 3, 4, 5).to(memory_format=torch.channels_last)
            y2, b1, b2 = y1.clone(), None, None
        else:
            b1 = r(6, 10)
            b2 = b1.clone()
            y1, y2 = make(b1), make(b2)
        x1 = r(*y1.shape, grad=True)
        x2 = x1.detach().clone().requires_grad_()
        o1, o2 = fn(x1, y1), _compile(fn, "cpp")(x2, y2)
        g = torch.randn(o1.shape, generator=torch.Generator().manual_seed(0))
        (o1 * g).sum().backward()
        (o2 * g).sum().backward()
        torch.testing.assert_close(o2, o1)
        torch.testing.assert_close(y2, y1)
        assert y2.stride() == y1.stride() and y2._version == y1._version
        torch.testing.assert_close(x2.grad, x1.grad)
        if b1 is not None:
            torch.testing.assert_close(b2, b1)


def test_expanded_mutated_input_refused_like_eager():
    r = _gen(6)
    y = r(1, 5).expand(4, 5)
    with pytest.raises(RuntimeError, match="more than one element"):
        _m_mul(r(4, 5, grad=True), y)
    with pytest.raises(RuntimeError, match="more than one element"):
        _compile(_m_mul, "cpp")(r(4, 5, grad=True), y)


def test_mutated_buffer_two_training_steps():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 5))
            self.register_buffer("b", torch.randn(4, 5))

        def forward(self, x):
            self.b.mul_(self.w * x)
            return (self.b * 2).sum() + x.sum()

    torch.manual_seed(0)
    m1, m2 = M(), M()
    m2.load_state_dict(m1.state_dict())
    c = _compile(m2, "cpp")
    r = _gen(7)
    for _ in range(2):
        x = r(4, 5)
        l1, l2 = m1(x), c(x)
        l1.backward()
        l2.backward()
        torch.testing.assert_close(l2, l1, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(m2.b, m1.b, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(m2.w.grad, m1.w.grad, rtol=1e-4, atol=1e-4)
        m1.b.detach_()
        m2.b.detach_()


def test_mutated_nonleaf_input_requiring_grad():
    r = _gen(8)
    x1, w1 = r(4, 5, grad=True), r(4, 5, grad=True)
    x2, w2 = x1.detach().clone().requires_grad_(), w1.detach().clone().requires_grad_()

    def fn(x, y):
        y.mul_(x)
        return y.exp()

    y1, y2 = w1 * 3, w2 * 3
    o1, o2 = fn(x1, y1), _compile(fn, "cpp")(x2, y2)
    g = r(4, 5)
    (o1 * g).sum().backward()
    (o2 * g).sum().backward()
    torch.testing.assert_close(o2, o1)
    torch.testing.assert_close(y2, y1)
    assert y2._version == y1._version
    torch.testing.assert_close(x2.grad, x1.grad)
    torch.testing.assert_close(w2.grad, w1.grad)


def test_retain_graph_and_autograd_grad_and_repeated_calls():
    r = _gen(9)

    def fn(x, y):
        y.mul_(x)
        return (y * x).exp()

    x1, y1 = r(4, 5, grad=True), r(4, 5)
    x2, y2 = x1.detach().clone().requires_grad_(), y1.clone()
    o1, o2 = fn(x1, y1), _compile(fn, "cpp")(x2, y2)
    g = r(4, 5)
    torch.testing.assert_close(torch.autograd.grad(o2, x2, g, retain_graph=True),
                               torch.autograd.grad(o1, x1, g, retain_graph=True))
    for k in (1.0, 2.0):
        o1.backward(g * k, retain_graph=True)
        o2.backward(g * k, retain_graph=True)
    torch.testing.assert_close(x2.grad, x1.grad)

    def f3(x, y):  # three calls before one backward: each saved its own y
        y.mul_(x)
        return (x * 2).exp()

    x1, y1 = r(4, 5, grad=True), r(4, 5)
    x2, y2 = x1.detach().clone().requires_grad_(), y1.clone()
    cf = _compile(f3, "cpp")
    outs1 = [f3(x1, y1) for _ in range(3)] + [y1]
    outs2 = [cf(x2, y2) for _ in range(3)] + [y2]
    sum((o * g).sum() for o in outs1).backward()
    sum((o * g).sum() for o in outs2).backward()
    torch.testing.assert_close(y2, y1)
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-4, atol=1e-4)


# -- defects ----------------------------------------------------------------------------------

def _v_select(x, y):
    y[0].mul_(x[0])
    return x.sin()


def _v_flat(x, y):
    y.view(-1).mul_(x.view(-1))
    return x.sin()


def _v_t(x, y):
    y.t().mul_(x.t())
    return y


VIEW_MUT = {"select": _v_select, "flat": _v_flat, "t": _v_t}


@pytest.mark.parametrize("backend,name", [("cpp", "select"), ("cpp", "flat"), ("cpp", "t"),
                                          ("triton", "select"), ("aot_eager", "select")])
def test_mutation_through_view_saved_for_backward(backend, name):
    """Fixed: a saved view of a mutated input is cloned too (aot/compile.py
    ``_clone_saved_mutated_inputs``)."""
    r = _gen(10)
    _check_mutation(VIEW_MUT[name], [r(4, 5, grad=True), r(4, 5)], backend)


def test_torch_compile_recompile_with_mutated_input():
    """Fixed: the compile-time aliasing check skips fake example inputs (the per-call
    check sees the real tensors)."""
    import torch._dynamo
    torch._dynamo.reset()

    def fn(x, y):
        y.mul_(2)
        return (x * y).cos()

    cf = torch.compile(fn, backend="coil")
    r = _gen(11)
    try:
        for n in (5, 7):
            x, y = r(4, n), r(4, n)
            y2 = y.clone()
            torch.testing.assert_close(cf(x, y2), fn(x, y))
            torch.testing.assert_close(y2, y)
    finally:
        torch._dynamo.reset()


# == 2. fp16/bf16 mean/var sum in fp32 until divided =========================================

LOW = [torch.float16, torch.bfloat16]


def _tol(dt):
    return dict(atol=1e-2, rtol=1e-2) if dt == torch.float16 else dict(atol=5e-2, rtol=2e-2)


def _check_values(fn, args, backend, **tol):
    ref = _tup(fn(*args))
    out = _tup(_compile(fn, backend)(*args))
    assert len(out) == len(ref)
    for i, (o, r) in enumerate(zip(out, ref)):
        assert o.shape == r.shape and o.dtype == r.dtype, (i, o.shape, r.shape, o.dtype, r.dtype)
        torch.testing.assert_close(o, r, equal_nan=True, **tol)


def _stats(x):
    return (x.mean(-1), x.var(-1), x.std(-1, keepdim=True), *torch.var_mean(x, -1, correction=0),
            x.mean(), x.var(), x.std(), x.t().mean(0), x.t().contiguous().var(0),
            x.mean((0, 1), keepdim=True), x.mean(-1, dtype=torch.float32), x.mean(0, dtype=torch.float64))


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [7, 1000, 2049, 4096, 8192, 65536])
def test_low_precision_mean_var_std_cpp(dtype, n):
    x = (_gen(20)(3, n) * 3 + 100).to(dtype)  # sums ~100 * N: beyond fp16's range
    _check_values(_stats, [x], "cpp", **_tol(dtype))


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [2049, 8192])
def test_low_precision_mean_var_std_triton(dtype, n):
    x = (_gen(21)(3, n) * 3 + 100).to(dtype)
    _check_values(_stats, [x], "triton", **_tol(dtype))


def _norms(x):
    n = x.shape[-1]
    return (F.layer_norm(x, (n,)), F.rms_norm(x, (n,)), F.normalize(x, dim=-1),
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_norms_long_rows(backend, dtype):
    x = (_gen(22)(3, 8192) * 3 + 100).to(dtype)
    _check_values(_norms, [x], backend, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_group_batch_norm(backend, dtype):
    r = _gen(23)
    x = (r(4, 8, 32, 32) * 2 + 50).to(dtype)
    w, b = r(8).to(dtype), r(8).to(dtype)
    rm, rv = r(8).to(dtype), (r(8).abs() + 0.5).to(dtype)

    def fn(x, rm, rv):
        return (F.group_norm(x, 2, w, b), F.batch_norm(x, rm, rv, w, b, training=False),
                F.batch_norm(x, rm.clone(), rv.clone(), w, b, training=True),
                *torch.var_mean(x, (0, 2, 3)))

    _check_values(fn, [x, rm, rv], backend, **_tol(dtype))


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_tall_leading_reductions(dtype):
    t = (_gen(24)(8192, 3) * 5 + 200).to(dtype)
    _check_values(lambda x: (*torch.var_mean(x, 0), x.std(0), x.mean(0, keepdim=True),
                             *torch.var_mean(x.view(2, 4096, 3), (0, 1)), x.view(8, 1024, 3).mean(1)),
                  [t], "cpp", **_tol(dtype))


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_stats_grads(dtype):
    x = (_gen(25)(4, 5000) * 3 + 100).to(dtype).requires_grad_()

    def fn(x):
        y = F.layer_norm(x, (x.shape[-1],)) + x.var(-1, keepdim=True) * 1e-3 + x.mean(0)
        return torch.autograd.grad(y.float().pow(2).sum(), x)[0]

    _check_values(fn, [x], "cpp", atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool])
def test_integer_mean_with_dtype(dtype):
    xi = torch.randint(0, 100, (5, 5000), generator=torch.Generator().manual_seed(26))
    x = (xi > 50) if dtype == torch.bool else xi.to(dtype)
    _check_values(lambda x: (x.mean(-1, dtype=torch.float32), x.mean(dtype=torch.float64),
                             x.mean(0, dtype=torch.float16), x.mean(-1, dtype=torch.bfloat16)),
                  [x], "cpp", atol=5e-2, rtol=1e-2)
    if dtype != torch.bool:
        with pytest.raises(RuntimeError, match="could not infer output dtype"):
            _compile(lambda x: x.mean(-1), "cpp")(x)


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_stats_edge_sizes(dtype):
    r = _gen(27)
    _check_values(lambda x: (x.mean(-1), x.var(-1), x.mean(0)), [r(3, 0).to(dtype)], "cpp")
    _check_values(lambda x: (x.var(-1), x.std(-1), x.var(-1, correction=0)),
                  [(r(3, 1) + 100).to(dtype)], "cpp")
    x = (r(2, 8192) * 200).to(dtype)
    _check_values(lambda x: (x.var(-1), x.std(), x.var(0), x.float().mean(-1, dtype=dtype)),
                  [x], "cpp", **_tol(dtype))


# == 3. bool max/min reduce as uint8 ==========================================================

def _bool_input(shape, seed):
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.6
    if x.dim() > 1 and shape[0] > 1:
        x[0] = True   # an all-True row
        x[1] = False  # an all-False row
    return x


def _bool_reductions(x):
    if x.dim() == 1:
        return (x.amax(-1), x.amin(0, keepdim=True), *x.max(0), *x.min(0), *torch.aminmax(x),
                torch.max(x), torch.min(x), x[::3].amax(), *x[::2].max(0))
    xt = x.transpose(0, -1)
    return (x.amax(-1), x.amin(-1), x.amax(0), x.amin(0, keepdim=True),
            *x.max(-1), *x.min(-1), *x.max(0, keepdim=True), *x.min(0),
            *torch.aminmax(x), *torch.aminmax(x, dim=-1), *torch.aminmax(x, dim=0, keepdim=True),
            torch.max(x), torch.min(x), x.amax(), x.amin(),
            xt.amax(-1), *xt.max(-1), *xt.min(0))


def _check_exact(fn, args, backend):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the FX interpreter
        out = _tup(_compile(fn, backend)(*args))
    ref = _tup(fn(*args))
    assert len(out) == len(ref)
    for i, (o, r) in enumerate(zip(out, ref)):
        assert o.dtype == r.dtype and o.shape == r.shape, (i, o.dtype, r.dtype, o.shape, r.shape)
        assert torch.equal(o, r), (i, o, r)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(3, 7), (4, 3000), (2, 5, 9), (1, 1), (6, 1), (2050,)])
def test_bool_max_min_values_and_indices(backend, shape):
    """Values and first-occurrence indices (ties everywhere in a bool row) match eager."""
    _check_exact(_bool_reductions, [_bool_input(shape, 30)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bool_reductions_in_fused_expressions(backend):
    x = _bool_input((4, 3000), 31)
    y = torch.rand(4, generator=torch.Generator().manual_seed(32)) > 0.5
    z = _bool_input((4, 5, 6), 33)
    _check_exact(lambda x, y, z: ((x.float() - 0.5 > 0).amax(-1) & y, (x.amax(-1) | y).sum(),
                                  x.max(-1).indices * 2 + x.amin(-1), x.amax(-1).float() + x.float().mean(-1),
                                  z.amax((0, 2)), z.amin((1, 2), keepdim=True), z.amax((0, 1, 2)),
                                  torch.where(z, z.amax(-1, keepdim=True), ~z).amin(1)),
                 [x, y, z], backend)


def test_bool_ties_pick_first_index():
    x = torch.ones(3, 50, dtype=torch.bool)
    x[1] = False
    x[2, 10:] = False
    x[2, 3] = False
    _check_exact(lambda x: (*x.max(-1), *x.min(-1), *x.t().max(0), *x.t().min(0)), [x], "cpp")


def test_bool_empty_dims():
    e = torch.zeros(3, 0, dtype=torch.bool)
    _check_exact(lambda x: (x.amax(0), *x.max(0), *torch.aminmax(x, dim=0)), [e], "cpp")
    for fn in (lambda x: x.amax(-1), lambda x: x.max(-1)):
        with pytest.raises(IndexError, match="non-zero size"):
            fn(e)
        with pytest.raises(IndexError, match="non-zero size"):
            _compile(fn, "cpp")(e)
