"""coil's own decompositions equal eager, and no prims reach compilers."""
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from coil.aot.decompositions import COIL_DECOMPOSITIONS, get_decompositions

aten = torch.ops.aten


# complex64: the variance is real, sum |x - mean|^2 (it was complex, sum (x - mean)^2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("dim,correction,keepdim", [(None, 1, False), ([1], 0, True), ([0, 2], 1, False)])
def test_var_std_family(dtype, dim, correction, keepdim):
    x = (torch.randn(3, 5, 4, dtype=dtype if dtype.is_complex else None) * 2 + 1).to(dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    for op in (aten.var_mean.correction, aten.var.correction, aten.std.correction, aten.std_mean.correction):
        ref = op(x, dim, correction=correction, keepdim=keepdim)
        got = COIL_DECOMPOSITIONS[op](x, dim, correction=correction, keepdim=keepdim)
        torch.testing.assert_close(got, ref, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_layer_norm(dtype):
    x = torch.randn(2, 3, 8).to(dtype)
    w, b = torch.randn(8).to(dtype), torch.randn(8).to(dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    ref = aten.native_layer_norm.default(x, [8], w, b, 1e-5)
    got = COIL_DECOMPOSITIONS[aten.native_layer_norm.default](x, [8], w, b, 1e-5)
    for r, g in zip(ref, got):
        assert r.dtype == g.dtype and r.shape == g.shape
        torch.testing.assert_close(g, r, **tol)


CASES = {
    "var_mean": lambda x: sum(torch.var_mean(x, 1)),
    "std": lambda x: torch.std(x, 0),
    "layer_norm": lambda x: F.layer_norm(x, (8,)),
    "batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
    "softmax": lambda x: F.log_softmax(x, -1) + F.softmax(x, 0),
    "gelu_silu": lambda x: F.gelu(x) + F.silu(x),
    "cross_entropy": lambda x: F.cross_entropy(x, torch.tensor([1, 2, 3, 0])),
    "to_half": lambda x: x.half().float(),
    "norm": lambda x: torch.linalg.vector_norm(x, dim=1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_prims_forward_and_backward(name):
    f = CASES[name]

    def fwbw(x):
        out = f(x)
        return out, torch.autograd.grad(out.sum(), x)

    x = torch.randn(4, 8, requires_grad=True)
    gm = make_fx(fwbw, decomposition_table=get_decompositions(), tracing_mode="fake")(x)
    prims = [n.format_node() for n in gm.graph.nodes
             if n.op == "call_function" and str(n.target).startswith("prims.")]
    assert not prims


def test_fallback_random_keeps_random_ops():
    assert aten.bernoulli.default in get_decompositions(fallback_random=False)
    assert aten.bernoulli.default not in get_decompositions(fallback_random=True)


@pytest.mark.parametrize("dynamic", [False, True])
def test_multilabel_margin_loss_is_the_aten_op(dynamic):
    """report 22 #5: torch's decomposition (also the op's Autograd kernel under the Python dispatcher of
    symbolic traces) counts the targets after the first -1; the ATen op runs, its backward too."""
    import coil

    x = torch.tensor([[0.1, 0.2, 0.4, 0.8], [0.3, 0.1, -1.0, 2.0]])
    t = torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1]])
    for red in ("mean", "none"):
        f = lambda x, t: F.multilabel_margin_loss(x, t, reduction=red)  # noqa: E731
        coil.reset()
        cf = coil.compile(f, backend="aot_eager", dynamic=dynamic)
        for xs, ts in ((x, t), (x[1], t[1])):
            xa, xb = xs.clone().requires_grad_(), xs.clone().requires_grad_()
            out, exp = cf(xa, ts), f(xb, ts)
            torch.testing.assert_close(out, exp)
            torch.testing.assert_close(torch.autograd.grad(out.sum(), xa)[0], torch.autograd.grad(exp.sum(), xb)[0])


def test_affine_grid_5d_grad_under_symbolic_sizes():
    """report 22 #9: affine_grid_generator's ATen backward needs concrete sizes; it is decomposed above
    autograd in symbolic traces."""
    import coil

    f = lambda t: F.affine_grid(t, [t.shape[0], 1, 2, 3, 4], align_corners=True)  # noqa: E731
    coil.reset()
    cf = coil.compile(f, backend="aot_eager", dynamic=True)
    for n in (2, 3):
        ta = torch.randn(n, 3, 4, requires_grad=True)
        tb = ta.detach().clone().requires_grad_()
        out, exp = cf(ta), f(tb)
        torch.testing.assert_close(out, exp)
        g = torch.randn_like(exp)
        torch.testing.assert_close(torch.autograd.grad(out, ta, g)[0], torch.autograd.grad(exp, tb, g)[0])


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_select_scatter_keeps_the_input_dtype(backend):
    """torch's select_scatter decomposition is a ``where``, which promoted: float32 x with a float64 src gave
    float64 (eager: float32, src cast). select_scatter is kept whole; its lowering casts src."""
    import coil
    x, y = torch.randn(3, 3), torch.randn(3, 3).double()
    for f in (lambda x, y: torch.select_scatter(x, y[0], 0, 1), lambda x, y: torch.select_scatter(x, y[:, 0].half(), 1, -1)):
        want, got = f(x, y), coil.compile(f, backend=backend)(x, y)
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 5)])
@pytest.mark.parametrize("dtype,weight", [(torch.float32, True), (torch.float32, False), (torch.bfloat16, True)])
def test_batch_norm_backward_broadcasts_with_one_view(train, shape, dtype, weight):
    """coil's native_batch_norm_backward equals ATen's kernel, and broadcasts each per-channel vector with one
    ``view`` (torch's decomposition unsqueezed it a dim at a time: 12 of a 4-D BatchNorm's 28 backward ops)."""
    x, dy = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    c = shape[1]
    w = torch.rand(c) + 0.5 if weight else None
    rm, rv = torch.randn(c), torch.rand(c) + 0.5
    mean, invstd = x.float().mean([d for d in range(x.dim()) if d != 1]), torch.rand(c) + 0.5
    args = (dy, x, w, rm, rv, mean, invstd, train, 1e-5, [True, weight, True])
    ref = aten.native_batch_norm_backward.default(*args)
    fn = COIL_DECOMPOSITIONS[aten.native_batch_norm_backward.default]
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    for r, g in zip(ref, fn(*args)):
        assert (r is None) == (g is None)
        if r is not None:
            assert r.dtype == g.dtype and r.shape == g.shape
            torch.testing.assert_close(g, r, **tol)
    if weight:  # traced: 4 views, no unsqueeze
        gm = make_fx(lambda *a: fn(*a, *args[7:]), tracing_mode="fake")(*args[:7])
        assert [str(n.target) for n in gm.graph.nodes if "squeeze" in str(n.target) or "view" in str(n.target)] == \
            ["aten.view.default"] * 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_logit_clamps_to_eps_bounds_in_the_input_dtype(dtype, backend):
    """eager's logit kernels take eps and 1 - eps in x's dtype: for bf16 eps=1e-3 the upper bound is 1.0 and
    logit(1.0) is inf (torch's decomposition clamped to 0.999: 6.9); bf16 eps=0.01 clamps to 0.98828125 (4.44, not
    4.59). The backward's zero region uses the same bounds."""
    import coil
    x = torch.tensor([0.5, 0.999, 1.0, 0.0001, 0.0, 1.5, -0.5, 0.98828125, 0.9921875], dtype=dtype)
    for eps in (1e-3, 1e-6, 0.01):
        f = lambda x: torch.logit(x, eps)  # noqa: E731
        torch.testing.assert_close(coil.compile(f, backend=backend)(x), f(x), rtol=0, atol=0)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        f(xe).sum().backward()
        coil.compile(f, backend=backend)(xc).sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-2, atol=0)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_soft_margin_loss_rounds_each_step_to_the_input_dtype(reduction, backend):
    """eager's soft_margin_loss takes log1p(exp(-x * target)) an op at a time in x's dtype: a float16 exp(12) is inf,
    and so is the loss (torch's decomposition, in float32, gave 12.0); a float32 x with a float16 target is float32."""
    import coil
    x = torch.tensor([-12.0, 3.0, 0.5, 11.5, -20.0, 1.0], dtype=torch.float16)
    t = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    f = lambda x, t: F.soft_margin_loss(x, t, reduction=reduction)  # noqa: E731
    for a, b in ((x, t), (x, t.half()), (x.float(), t.half()), (x / 8, t)):
        torch.testing.assert_close(coil.compile(f, backend=backend)(a, b), f(a, b), rtol=1e-3, atol=0)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_multi_margin_loss_of_an_unbatched_input_without_reduction_is_0d(dynamic, backend):
    """eager's multi_margin_loss of a 1-d (or 0-d) input with reduction="none" is 0-d; torch's decomposition (also
    the op's Autograd kernel under the Python dispatcher) returned shape (1,). Batched inputs keep (N,)."""
    import coil
    f = lambda x, t: F.multi_margin_loss(x, t, p=2, margin=0.5, reduction="none")  # noqa: E731
    for x, t in ((torch.tensor([0.7, 0.2, -0.3]), torch.tensor(1)), (torch.tensor(0.7), torch.tensor(0)),
                 (torch.tensor([[0.7, 0.2, -0.3], [0.1, 0.9, 0.4]]), torch.tensor([1, 2]))):
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = f(xe, t), coil.compile(f, backend=backend, dynamic=dynamic)(xc, t)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
        want.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_integer_linspace_of_non_integer_endpoints_steps_from_the_converted_ends(backend):
    """eager's integer linspace converts start and end to the dtype first (-3.3 to 7.9 is -3 to 7), then steps in
    double and truncates; torch's reference stepped from the unconverted ends: [..., 0, 1, 2, 3, ...] for eager's
    [..., 0, 1, 1, 2, ...] (FINDINGS_73 6). The op stays whole, also for a symbolic number of steps; a float
    linspace is decomposed still."""
    import coil
    coil.reset()
    f = lambda x: torch.linspace(-3.3, 7.9, 13, dtype=torch.int64) + x  # noqa: E731
    x = torch.zeros((), dtype=torch.int64)
    torch.testing.assert_close(coil.compile(f, backend=backend)(x), f(x), rtol=0, atol=0)
    g = lambda x: torch.linspace(97.45, -37.97, x.shape[0], dtype=x.dtype) + x  # noqa: E731
    compiled = coil.compile(g, backend=backend, dynamic=True)
    for n, dtype in ((13, torch.int64), (40, torch.int64), (7, torch.int64), (1, torch.int64)):
        x = torch.zeros(n, dtype=dtype)
        torch.testing.assert_close(compiled(x), g(x), rtol=0, atol=0)
    h = lambda x: torch.linspace(-3.3, 7.9, 13) + x  # noqa: E731
    torch.testing.assert_close(coil.compile(h, backend=backend)(torch.zeros(())), h(torch.zeros(())))


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_masked_fill_of_a_0d_tensor_value_beyond_the_dtype_raises_as_eager(backend):
    """eager's masked_fill converts a 0-d tensor value to x's dtype and raises where it overflows (c10's
    ``overflows``: float32 70000 for float16); the decomposition, a where, gave inf (FINDINGS_73 7). Values in range,
    inf/NaN for a float x, and -255 for uint8 (wraps) are filled as eager."""
    import coil
    f = lambda a: a.masked_fill(a < 0, torch.tensor(70000.0))  # noqa: E731
    a = torch.tensor([1.0, -1.0], dtype=torch.float16)
    with pytest.raises(RuntimeError, match="value cannot be converted to type c10::Half without overflow"):
        coil.compile(f, backend=backend)(a)
    g = lambda a, v: a.masked_fill(a < 1, v)  # noqa: E731
    t, f64 = torch.tensor, torch.float64
    for dtype, v, error in ((torch.float16, t(65504.0), None), (torch.float16, t(-65520.0), "c10::Half"),
                            (torch.float16, t(float("-inf")), None), (torch.float16, t(2 ** 40), "c10::Half"),
                            (torch.bfloat16, t(70000.0), None), (torch.bfloat16, t(1e39, dtype=f64), "c10::BFloat16"),
                            (torch.float32, t(float("nan")), None), (torch.int8, t(300), "int8_t"),
                            (torch.int8, t(200, dtype=torch.uint8), "int8_t"), (torch.uint8, t(-255), None),
                            (torch.uint8, t(-256), "uint8_t"), (torch.uint8, t(-1.0), "uint8_t"),
                            (torch.int32, t(float("nan")), "int"), (torch.int32, t(2.5), None),
                            (torch.int64, t(3e9, dtype=f64), None)):
        coil.reset()
        a = torch.tensor([0, 3], dtype=dtype)
        if error is None:
            torch.testing.assert_close(coil.compile(g, backend=backend)(a, v), g(a, v), rtol=0, atol=0, equal_nan=True)
        else:
            with pytest.raises(RuntimeError, match=f"type {error} without overflow"):
                g(a, v)
            with pytest.raises(RuntimeError, match=f"type {error} without overflow"):
                coil.compile(g, backend=backend)(a, v)


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_index_fill_of_a_0d_tensor_value_of_another_dtype_converts_it_as_eager(backend):
    """eager's index_fill converts a 0-d tensor value to x's dtype (a float32 2.0 into float16), raising where it
    overflows as masked_fill's; torch's decomposition passed the float32 value to index_copy, whose scatter refused it:
    a compile error."""
    import coil
    f = lambda a, idx, v: a.index_fill(0, idx, v)  # noqa: E731
    idx = torch.tensor([0, 2])
    for a, v in ((torch.randn(4, 3, dtype=torch.float16), torch.tensor(2.0)),
                 (torch.zeros(4, dtype=torch.int8), torch.tensor(2.7, dtype=torch.float64)),
                 (torch.randn(4, 2), torch.tensor(3))):
        coil.reset()
        torch.testing.assert_close(coil.compile(f, backend=backend)(a, idx, v), f(a, idx, v), rtol=0, atol=0)
    coil.reset()
    with pytest.raises(RuntimeError, match="value cannot be converted to type c10::Half without overflow"):
        coil.compile(f, backend=backend)(torch.randn(4, dtype=torch.float16), idx, torch.tensor(70000.0))
