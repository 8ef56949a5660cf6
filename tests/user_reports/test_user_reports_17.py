"""Minimal repros from the seventeenth round of user testing, aimed at the code added in
the report-16 session: exact GELU through ``ops.ndtr``, ``F.one_hot`` as a
bounds-checked ``index_select``, eager's dtype checks for index_add / index_copy /
index_put at capture, graph breaks at ``requires_grad_`` / ``requires_grad=True``
factories / ``retain_grad``, parameter-free ``torch.nn`` modules built inside
``forward`` (``InFrameModuleVariable``), and ``torch.compile(backend="coil",
dynamic=True)`` with Python floats (``coil/aot/scalars.py``); see FINDINGS_17.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with
the diagnosis, so it flips when fixed); the plain tests are compact versions of what was
verified to match eager. CPU only. Tests that use ``torch.compile`` call
``torch._dynamo.reset()`` before and after.
"""
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import coil
from coil.backends import lookup_backend
from coil.testing import CompileCounter

from report_helpers import arg_copies


pytestmark = pytest.mark.usefixtures("coil_reset")  # tests/user_reports/conftest.py


def _quiet():
    warnings.simplefilter("ignore")  # pytest restores the filters after each test


def _check(fn, *args, backend="cpp", grad=False, atol=1e-5, rtol=1e-5):
    """fn eagerly and through coil.compile on copies of args: values, dtype, shape,
    strides, mutated args and (grad=True) the args' grads agree."""
    a_ref, a_out = arg_copies(args), arg_copies(args)
    coil.reset()
    ref = fn(*a_ref)
    out = coil.compile(fn, options={"cpu_backend": backend})(*a_out)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert out.stride() == ref.stride()
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol, equal_nan=True)
    for x, y in zip(a_ref, a_out):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(y.detach(), x.detach(), atol=atol, rtol=rtol,
                                       equal_nan=True)
    if grad:
        torch.manual_seed(99)
        cot = torch.randn_like(ref)
        ref.backward(cot)
        out.backward(cot)
        for x, y in zip(a_ref, a_out):
            if isinstance(x, torch.Tensor) and x.requires_grad:
                torch.testing.assert_close(y.grad, x.grad, atol=10 * atol, rtol=10 * rtol)


# --------------------------------------------------------------------------------------
# 1. exact GELU through ops.ndtr
# --------------------------------------------------------------------------------------

_TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5, torch.float64: 1e-7}


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_gelu_and_backward_all_dtypes_cpp(dtype, approximate):
    torch.manual_seed(0)
    x = (torch.randn(3, 7) * 3).to(dtype).requires_grad_()
    _check(lambda x: F.gelu(x, approximate=approximate), x, grad=True,
           atol=_TOL[dtype], rtol=_TOL[dtype])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_triton_interpreter_tiny(approximate):
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        x = (torch.randn(2, 3) * 3).to(dtype).requires_grad_()
        _check(lambda x: F.gelu(x, approximate=approximate), x, backend="triton", grad=True,
               atol=_TOL[dtype], rtol=_TOL[dtype])


def test_gelu_layouts_0d_empty_integer_valued():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    _check(lambda x: F.gelu(x.t()), x)
    _check(lambda x: F.gelu(x), x.t())                              # transposed input
    _check(lambda x: F.gelu(x), torch.randn(1, 5).expand(4, 5))     # expanded input
    _check(lambda x, b: F.gelu(x + b), torch.randn(4, 1, 5), torch.randn(3, 1))
    _check(lambda x: F.gelu(x), torch.tensor(0.7, requires_grad=True), grad=True)
    _check(lambda x: F.gelu(x), torch.randn(0, 3, requires_grad=True), grad=True)
    _check(lambda x: F.gelu(x), torch.arange(-10, 10).float())


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_gelu_special_values_and_tails(backend):
    # +inf left out: eager's vectorized CPU gelu gives NaN there, its scalar path and
    # fp64 give inf (coil gives inf, the right value)
    x = torch.tensor([-float("inf"), float("nan"), -0.0, 0.0, 1e30, -1e30, -40.0, -10.0,
                      -5.0, -9.0, 3.0])
    _check(lambda x: F.gelu(x), x, backend=backend)
    _check(lambda x: F.gelu(x, approximate="tanh"), x, backend=backend)
    _check(lambda x: torch.ops.aten.gelu_backward(torch.ones_like(x), x), x, backend=backend)
    _check(lambda x: torch.ops.aten.gelu_backward(torch.ones_like(x), x), x.double(),
           backend=backend)
    _check(lambda x: F.gelu(x), torch.linspace(-12, 4, 200, dtype=torch.bfloat16),
           backend=backend, atol=1e-2, rtol=1e-2)


def test_special_ndtr_values_grads_and_int_input():
    torch.manual_seed(0)
    _check(torch.special.ndtr, (torch.randn(10) * 4).requires_grad_(), grad=True)
    _check(torch.special.ndtr, torch.randn(10, dtype=torch.float64) * 4)
    _check(torch.special.ndtr, torch.arange(-5, 5))


def test_inplace_gelu_variants():
    torch.manual_seed(0)

    def on_intermediate(x):
        y = x * 2
        return torch._C._nn.gelu_(y)

    def on_input(x):
        torch._C._nn.gelu_(x, approximate="tanh")
        return x

    _check(on_intermediate, torch.randn(5))
    _check(on_input, torch.randn(5))
    _check(lambda x: nn.GELU("tanh")(x), torch.randn(5))


def test_gelu_in_residual_layer_norm_fusion_with_grads():
    torch.manual_seed(0)

    def block(x, r, w, b):
        return F.gelu(F.layer_norm(x + r, (x.shape[-1],), w, b)) + x

    _check(block, torch.randn(4, 8, requires_grad=True), torch.randn(4, 8),
           torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True), grad=True)


def test_gelu_double_backward_is_a_clear_error():
    def f(x):
        g, = torch.autograd.grad(F.gelu(x).sum(), x, create_graph=True)
        return g

    x = torch.randn(6, requires_grad=True)
    with pytest.raises(RuntimeError, match="double backward"):
        coil.compile(f)(x).sum().backward()


# --------------------------------------------------------------------------------------
# 2. F.one_hot as a bounds-checked index_select
# --------------------------------------------------------------------------------------

def test_one_hot_forms_match_eager(dynamo_reset):
    torch.manual_seed(0)
    i = torch.randint(0, 5, (3, 4))
    for f, a in [(lambda i: F.one_hot(i, 5), i), (lambda i: F.one_hot(i), i),
                 (lambda i: F.one_hot(i, num_classes=7), i),
                 (lambda i: F.one_hot(i, 5), torch.tensor(3)),
                 (lambda i: F.one_hot(i, 5), torch.zeros(0, 3, dtype=torch.long)),
                 (lambda i: F.one_hot(i.t(), 5), i),
                 (lambda i: F.one_hot(i, 5).float() * 2, i),
                 (lambda i: F.one_hot(i, 50000).sum(-1), torch.randint(0, 50000, (8,)))]:
        coil.reset()
        ref, out = f(a), coil.compile(f)(a)
        assert out.dtype == ref.dtype and out.stride() == ref.stride() and torch.equal(out, ref)
        torch._dynamo.reset()
        assert torch.equal(torch.compile(f, backend="coil")(a), ref)


def test_one_hot_errors_like_eager():
    for dtype in (torch.int32, torch.uint8, torch.float32):
        with pytest.raises(RuntimeError, match="LongTensor"):
            coil.compile(lambda i: F.one_hot(i, 5))(torch.tensor([0, 1], dtype=dtype))
    with pytest.raises(RuntimeError, match="empty tensor"):
        coil.compile(lambda i: F.one_hot(i))(torch.zeros(0, dtype=torch.long))
    with pytest.raises((RuntimeError, IndexError), match="out of bounds|smaller"):
        coil.compile(lambda i: F.one_hot(i, 3))(torch.tensor([0, 3]))
    with pytest.raises((RuntimeError, IndexError), match="out of bounds|negative"):
        coil.compile(lambda i: F.one_hot(i, 3))(torch.tensor([0, -1]))


def test_one_hot_in_a_loss_with_grads():
    torch.manual_seed(0)
    y = torch.randint(0, 5, (6,))
    _check(lambda x: -(F.one_hot(y, 5) * F.log_softmax(x, -1)).sum(-1).mean(),
           torch.randn(6, 5, requires_grad=True), grad=True)


# fixed: the substitute is applied to torch's graphs too (coil/backends/registry.py); coil's bounds-check message, not eager's text
def test_one_hot_out_of_range_raises_under_torch_compile(dynamo_reset):
    with pytest.raises(RuntimeError, match="out of bounds"):   # eager: "smaller than num_classes"
        torch.compile(lambda i: F.one_hot(i, 3), backend="coil")(torch.tensor([0, 4]))


# fixed: substitutes.one_hot raises for num_classes=0
def test_one_hot_zero_classes_nonempty_raises():
    with pytest.raises(RuntimeError, match="smaller than num_classes"):
        coil.compile(lambda i: F.one_hot(i, 0))(torch.tensor([0]))


# fixed: coil.exc.KernelIndexError is an IndexError and a RuntimeError
def test_one_hot_out_of_range_error_type_is_runtime_error():
    with pytest.raises(RuntimeError):
        coil.compile(lambda i: F.one_hot(i, 3))(torch.tensor([0, 3]))


# --------------------------------------------------------------------------------------
# 3. eager dtype checks at capture
# --------------------------------------------------------------------------------------

_X, _I, _S = torch.zeros(4, 3), torch.tensor([0, 2]), torch.ones(2, 3)


@pytest.mark.parametrize("fn", [
    lambda x, i, s: x.index_add(0, i, s, alpha=2),
    lambda x, i, s: x.index_add_(0, i, s),
    lambda x, i, s: torch.index_add(x, dim=0, index=i, source=s),
    lambda x, i, s: x.index_add(dim=0, index=i, source=s),
    lambda x, i, s: x.index_copy(0, i, s),
    lambda x, i, s: x.index_copy_(0, i, s),
    lambda x, i, s: torch.index_copy(x, 0, i, source=s),
    lambda x, i, s: x.index_put((i,), s),
    lambda x, i, s: x.index_put_((i,), s, accumulate=True),
    lambda x, i, s: torch.index_put(x, indices=(i,), values=s),
    lambda x, i, s: x.index_put((i,), s.sum()),
    lambda x, i, s: x[:, :3].index_add_(0, i, s),
], ids=["ia_alpha", "ia_", "torch_ia_kw", "ia_method_kw", "ic", "ic_", "torch_ic_kw", "ip",
        "ip_acc", "torch_ip_kw", "ip_0d", "ia_on_view"])
def test_index_ops_dtype_checks(fn):
    # same dtype works and matches eager
    _check(fn, _X, _I, _S)
    # a different dtype raises eager's error
    for src in (_S.double(), _S.bfloat16()):
        with pytest.raises(RuntimeError) as eager:
            fn(_X.clone(), _I, src)
        coil.reset()
        with pytest.raises(RuntimeError) as compiled:
            coil.compile(fn)(_X.clone(), _I, src)
        assert str(eager.value).split(",")[0] in str(compiled.value)


def test_other_scatter_family_dtype_errors_and_duplicates():
    for fn in (lambda x, i, s: x.scatter_add(0, i.view(2, 1).expand(2, 3), s),
               lambda x, i, s: x.index_reduce(0, i, s, "prod"),
               lambda x, i, s: x.masked_scatter(x == 0, s),
               lambda x, i, s: x.put_(i, s[0, :2])):
        coil.reset()
        with pytest.raises(RuntimeError):
            coil.compile(fn)(_X.clone(), _I, _S.double())
    _check(lambda x, s: x.index_put_((torch.tensor([0, 0]),), s, accumulate=True), _X, _S)


# fixed: meta_checks._setitem
def test_setitem_advanced_index_dtype_mismatch_raises():
    def f(x, i, s):
        x[i] = s
        return x

    with pytest.raises(RuntimeError, match="Index put requires"):
        f(_X.clone(), _I, _S.double())
    with pytest.raises(RuntimeError, match="Index put requires"):
        coil.compile(f)(_X.clone(), _I, _S.double())


# fixed: coil/backends/registry.py runs capture's meta_checks on torch's graphs
def test_index_add_dtype_mismatch_raises_under_torch_compile(dynamo_reset):
    with pytest.raises(Exception, match="same scalar type"):
        torch.compile(lambda x, i, s: x.index_add(0, i, s), backend="coil")(
            _X.clone(), _I, _S.double())


# --------------------------------------------------------------------------------------
# 4. requires_grad_ / requires_grad=True factories / retain_grad are graph breaks
# --------------------------------------------------------------------------------------

def _same(fn, *args):
    a_ref, a_out = arg_copies(args), arg_copies(args)
    coil.reset()
    ref, out = fn(*a_ref), coil.compile(fn)(*a_out)
    ref = ref if isinstance(ref, tuple) else (ref,)
    out = out if isinstance(out, tuple) else (out,)
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, r)
    return a_ref, a_out


def test_autograd_leaf_made_inside_frame_gets_grads():
    torch.manual_seed(0)

    def saliency(x):
        y = (x * 2).detach().requires_grad_()
        return torch.autograd.grad((y.sin() ** 2).sum(), y)[0]

    def factory(x):
        w = torch.ones(5, requires_grad=True)
        (w * x).sum().backward()
        return w.grad

    def loop(x):
        acc = []
        for k in range(3):
            y = (x + k).requires_grad_(True)
            (y ** 3).sum().backward()
            acc.append(y.grad)
        return torch.stack(acc)

    def no_grad_region(x):
        x = x.clone().requires_grad_()
        with torch.no_grad():
            s = x * 3
        return torch.autograd.grad((x * s).sum(), x)[0]

    def attr_set(x):
        y = x.detach()
        y.requires_grad = True
        return torch.autograd.grad((y * y).sum(), y)[0]

    def full_like(x):
        z = torch.full_like(x, 2.0, requires_grad=True)
        return torch.autograd.grad((z * x).sum(), z)[0]

    for f in (saliency, factory, no_grad_region, attr_set, full_like):
        _same(f, torch.randn(5))
    _same(loop, torch.randn(4))


def test_retain_grad_and_returned_leaf():
    def f(x):
        y = x * 2
        y.retain_grad()
        (y ** 2).sum().backward()
        return y.grad, x.grad

    a_ref, a_out = _same(f, torch.randn(3, requires_grad=True))

    def g(x):
        t = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        return (t * x).sum(), t

    out, t = coil.compile(g)(torch.full((3,), 2.0))
    assert t.is_leaf and t.requires_grad and out.requires_grad
    out.backward()
    torch.testing.assert_close(t.grad, torch.full((3,), 2.0))


def test_saliency_in_module_forward_and_tc(dynamo_reset):
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            x = x.detach().requires_grad_()
            return torch.autograd.grad(self.lin(x).tanh().sum(), x)[0] * 2

    m, x = M(), torch.randn(2, 4)
    torch.testing.assert_close(coil.compile(m)(x), m(x))

    def loop(x):
        acc = []
        for k in range(3):
            y = (x + k).requires_grad_(True)
            (y ** 3).sum().backward()
            acc.append(y.grad)
        return torch.stack(acc)

    torch.testing.assert_close(torch.compile(loop, backend="coil")(x[0]), loop(x[0]))


def test_requires_grad_fullgraph_message():
    def f(x):
        y = (x * 2).detach().requires_grad_()
        return torch.autograd.grad(y.sum(), y)[0]

    with pytest.raises(Exception, match=r"requires_grad_\(\) makes an autograd leaf"):
        coil.compile(f, fullgraph=True)(torch.randn(3))


# --------------------------------------------------------------------------------------
# 5. parameter-free torch.nn modules built inside forward
# --------------------------------------------------------------------------------------

_XM = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
_YM = torch.tensor([0, 3, 2, 4])

_INFRAME = {
    "ce_ls_sum": lambda x: nn.CrossEntropyLoss(label_smoothing=0.1, reduction="sum")(x, _YM),
    "ce_ignore": lambda x: nn.CrossEntropyLoss(ignore_index=2)(x, _YM),
    "nll_none": lambda x: nn.NLLLoss(reduction="none")(x.log_softmax(-1), _YM),
    "mse": lambda x: nn.MSELoss(reduction="sum")(x, x * 0.5),
    "huber": lambda x: nn.HuberLoss(delta=0.5)(x, x * 0.1),
    "bce_logits": lambda x: nn.BCEWithLogitsLoss()(x, (x > 0).float()),
    "kldiv": lambda x: nn.KLDivLoss(reduction="batchmean", log_target=True)(
        x.log_softmax(-1), x.flip(0).log_softmax(-1)),
    "relu_inplace": lambda x: nn.ReLU(inplace=True)(x),
    "leaky_inplace": lambda x: nn.LeakyReLU(0.2, inplace=True)(x),
    "elu_inplace": lambda x: nn.ELU(alpha=0.5, inplace=True)(x),
    "softplus": lambda x: nn.Softplus(beta=2, threshold=5)(x),
    "softmax0": lambda x: nn.Softmax(dim=0)(x),
    "upsample": lambda x: nn.Upsample(scale_factor=2, mode="bilinear")(x.view(1, 1, 4, 5)),
    "pixel_shuffle": lambda x: nn.PixelShuffle(2)(x.sum() + torch.arange(32.).view(1, 8, 2, 2)),
    "unflatten": lambda x: nn.Unflatten(1, (1, 5))(x),
    "layernorm": lambda x: nn.LayerNorm(5, elementwise_affine=False, eps=1e-2)(x),
    "batchnorm": lambda x: nn.BatchNorm1d(5, affine=False, track_running_stats=False)(x),
    "groupnorm": lambda x: nn.GroupNorm(1, 4, affine=False)(x.unsqueeze(0)),
    "ctc": lambda x: nn.CTCLoss(zero_infinity=True)(
        x.view(4, 1, 5).log_softmax(-1), torch.tensor([[1, 2]]), torch.tensor([4]),
        torch.tensor([2])),
    "maxpool_idx": lambda x: nn.MaxPool1d(2, return_indices=True)(x.unsqueeze(0))[1],
    "sequential": lambda x: nn.Sequential(nn.ReLU(), nn.Softmax(-1))(x),
    "triplet": lambda x: nn.TripletMarginLoss(margin=0.5)(x, x.flip(0), x * 2),
}


@pytest.mark.parametrize("name", sorted(_INFRAME))
def test_in_frame_module_matches_eager_in_one_graph(name):
    fn = _INFRAME[name]
    _check(fn, _XM, atol=1e-5, rtol=1e-5)
    cnt = CompileCounter()
    coil.reset()
    coil.compile(fn, backend=cnt)(_XM.clone())
    assert cnt.frame_count == 1


def test_in_frame_dropout_state_and_rebuild():
    x = torch.randn(4, 5)

    class Parent(nn.Module):
        def forward(self, x, p):
            return nn.Dropout(p)(x)  # a new Dropout is in training mode, parent eval or not

    cf = coil.compile(Parent().eval())
    assert cf(x, 1.0).eq(0).all() and torch.equal(cf(x, 0.0), x)

    def eval_then_break(x):
        d = nn.Dropout(0.5)
        d.eval()
        y = d(x)
        print("", end="")
        return (d(y) - y).abs().max()

    assert coil.compile(eval_then_break)(x) == 0

    def returned(x):
        d = nn.Dropout(0.5)
        d.eval()
        m = nn.Hardtanh(float("-inf"), 2.0)
        return m(x), d, m, m

    out, d, m, m2 = coil.compile(returned)(x)
    assert d.training is False and m is m2 and m.min_val == float("-inf")
    torch.testing.assert_close(out, x.clamp(max=2.0))


def test_in_frame_module_with_parameters_breaks_but_runs():
    x = torch.randn(3, 1, 4)

    def f(x):
        return nn.MultiheadAttention(4, 1)(x, x, x)[0].shape

    assert coil.compile(f)(x) == f(x)


# --------------------------------------------------------------------------------------
# 6. torch.compile(backend="coil", dynamic=True) with Python floats
# --------------------------------------------------------------------------------------

def _dyn(fn, calls):
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="coil", dynamic=True)
    for args in calls:
        ref, out = fn(*args), cf(*args)
        ref = ref if isinstance(ref, tuple) else (ref,)
        out = out if isinstance(out, tuple) else (out,)
        for r, o in zip(ref, out):
            if isinstance(r, torch.Tensor):
                assert o.dtype == r.dtype
                torch.testing.assert_close(o, r, atol=1e-6, rtol=1e-3)
            else:
                assert o == r


def test_dynamic_floats_pointwise_and_factories(dynamo_reset):
    _quiet()
    torch.manual_seed(0)
    x = torch.randn(4, 5)
    xh = torch.tensor([1e-3, 2e-3, 1e-5, 0.5], dtype=torch.float16)
    xb = torch.randn(8, dtype=torch.bfloat16)
    i = torch.arange(5)
    _dyn(lambda x, t: torch.softmax(x / t, -1), [(x, 0.7), (x, 1.3), (x, 2.0)])
    _dyn(lambda x, s: x * s, [(xh, 1e5), (xh, 2e5)])
    _dyn(lambda x, s: x / s, [(xh, 1e-8), (xh, 2e-8)])
    _dyn(lambda x, s: x * s, [(xb, 0.1), (xb, 0.3)])
    _dyn(lambda i, s: i * s, [(i, 0.5), (i, 1.5)])
    _dyn(lambda i, s: torch.clamp(i, min=s), [(i, 1.5), (i, 2.5)])
    _dyn(lambda x, s: x * 2 if s > 0.5 else x * 3, [(x, 0.7), (x, 0.2), (x, 0.9)])
    _dyn(lambda x, s: torch.full((3,), s, dtype=torch.int64), [(x, 2.7), (x, -1.5)])
    _dyn(lambda x, s: (s - x, s / x, x.abs() ** s, s ** x, x // s, x % s),
         [(x, 0.3), (x, 2.0)])
    _dyn(lambda x, s: (torch.where(x > 0, x, s), x.masked_fill(x > 0, s),
                       torch.lerp(x, x * 2, s), F.leaky_relu(x, s),
                       torch.addcmul(x, x, x, value=s), torch.add(x, x, alpha=s)),
         [(x, 0.3), (x, 0.7)])
    _dyn(lambda x, e: F.layer_norm(x, (5,), eps=e), [(x, 1e-5), (x, 1e-1), (x, 10.0)])
    _dyn(lambda x, s: (x * s, s * 2), [(x, 2.0), (x, 3.0)])
    _dyn(lambda x, s: x == s, [(torch.tensor([0.1, 0.2]), 0.1), (torch.tensor([0.1, 0.2]), 0.2)])
    _dyn(lambda x, s: x > s, [(torch.arange(4), 1.5), (torch.arange(4), 2.0000001)])


def test_dynamic_float_in_training_step(dynamo_reset):
    _quiet()
    torch.manual_seed(0)
    w0, x = torch.randn(5, 3), torch.randn(4, 5)

    def step(w, x, lr, t):
        loss = (torch.softmax(x @ w / t, -1) * torch.arange(3.0)).sum()
        g, = torch.autograd.grad(loss, w)
        with torch.no_grad():
            w.sub_(lr * g)
        return loss.detach()

    cf = torch.compile(step, backend="coil", dynamic=True)
    we, wc = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    for lr, t in [(0.1, 1.0), (0.05, 0.5), (0.2, 2.0)]:
        torch.testing.assert_close(cf(wc, x, lr, t), step(we, x, lr, t))
        torch.testing.assert_close(wc, we)

    def fwd(w, x, t):
        return (torch.tanh(x @ w * t) * t).sum()

    cf = torch.compile(fwd, backend="coil", dynamic=True)
    for t in (0.5, 1.5, 3.0):
        we, wc = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        fwd(we, x, t).backward()
        cf(wc, x, t).backward()
        torch.testing.assert_close(wc.grad, we.grad)


def test_autograd_grad_under_torch_compile_dynamic_smallest(dynamo_reset):
    """Smallest input of the case above: after the graph break at autograd.grad, torch.compile's
    hook traced coil's backward and its generated wrapper as user code (the saved size became a
    SymInt: RuntimeError in as_strided). The backward is opaque now: coil's backend sees only
    the user's graph."""
    _quiet()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("coil")(gm, example_inputs)

    def step(w, x):
        g, = torch.autograd.grad((x @ w).sum(), w)
        return g

    w, x = torch.randn(5, 3, requires_grad=True), torch.randn(4, 5)
    torch.testing.assert_close(torch.compile(step, backend=counting, dynamic=True)(w, x),
                               step(w, x))
    assert len(graphs) == 1


def test_bf16_compare_with_python_float():
    """A bf16 tensor compared with a Python float: eager's CPU kernel rounds the scalar to
    bf16 first (0.1 -> 0.10009765625); coil compared in fp32 against 0.1 (lowering.round_scalars)."""
    xb = torch.tensor([0.1, 0.2], dtype=torch.bfloat16)
    f = lambda x: x == 0.1  # noqa: E731
    assert f(xb).tolist() == [True, False]
    assert coil.compile(f)(xb).tolist() == [True, False]


def test_fp16_eq_and_sub_bf16_gt_python_float():
    """Same: fp16 ``x == 0.1`` and ``x - 0.1``, bf16 ``x > 0.1`` against the rounded scalar."""
    xh = torch.tensor([0.1, 0.2], dtype=torch.float16)
    eq, sub = coil.compile(lambda x: (x == 0.1, x - 0.1))(xh)
    gt = coil.compile(lambda x: x > 0.1)(xh.bfloat16())
    assert (eq.tolist(), sub[0].item(), gt.tolist()) == ([True, False], 0.0, [False, True])


def test_bf16_compare_with_dynamic_float_torch_compile(dynamo_reset):
    """The symbolic float, tensorized by aot/scalars.py as a 0-dim tensor, is rounded to bf16
    before the comparison, as eager rounds the scalar (comparisons cast to the common dtype)."""
    _quiet()
    xb = torch.tensor([0.1, 0.2], dtype=torch.bfloat16)
    cf = torch.compile(lambda x, s: x == s, backend="coil", dynamic=True)
    assert cf(xb, 0.1).tolist() == [True, False]
    assert cf(xb, 0.2).tolist() == [False, True]


def test_dynamic_float_derived_slice_view(dynamo_reset):
    """x[:int(x.shape[0] * f)] with a dynamic float f: the aliased output's size binds f's
    symbol to its 0-d input's .item() (was CoilError 'symbolic sizes [...] of an aliased
    output are not sizes of the graph's inputs')."""
    _quiet()
    x = torch.randn(4, 5)
    cf = torch.compile(lambda x, f: x[:int(x.shape[0] * f)], backend="coil", dynamic=True)
    assert cf(x, 0.5).shape == (2, 5)
    for f in (0.8, 0.3, 1.0):
        torch.testing.assert_close(cf(x, f), x[:int(x.shape[0] * f)])
