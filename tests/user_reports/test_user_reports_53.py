"""Regressions from new-user trial 53 (FINDINGS_53.md): programs and models the authors did not write.

The xfail(strict=True) tests are open bugs: each fails today and starts passing (so must lose its mark) once fixed.
"""
import os
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


def _warnings_of(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in caught if "coil" in str(w.message)]


# ---------------------------------------------------------------------------------------------------------------
# Finding 1: a Python attribute set on a tensor / Parameter is invisible to getattr(..., default) and hasattr
# ---------------------------------------------------------------------------------------------------------------

def test_getattr_with_default_sees_an_attribute_set_on_an_input_tensor(coil_reset):
    def f(x, t):
        return x * (2 if getattr(t, "flag", False) else 3)

    t = torch.ones(2)
    t.flag = True
    x = torch.ones(2)
    torch.testing.assert_close(coil.compile(f)(x, t), f(x, t))   # eager 2, coil 3


def test_hasattr_sees_an_attribute_set_on_a_parameter(coil_reset):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))
            self.w._no_weight_decay = True

        def forward(self, x):
            return x * self.w * (3.0 if hasattr(self.w, "_no_weight_decay") else 1.0)

    m = M()
    x = torch.ones(3)
    torch.testing.assert_close(coil.compile(m)(x), m(x))


def test_getattr_sees_a_class_attribute_of_a_parameter_subclass(coil_reset):
    class QParam(nn.Parameter):
        quantized = True

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = QParam(torch.ones(3))

        def forward(self, x):
            return x * self.w * (3.0 if getattr(self.w, "quantized", False) else 1.0)

    m = M()
    x = torch.ones(3)
    torch.testing.assert_close(coil.compile(m)(x), m(x))


def test_parameter_grouping_by_attribute(coil_reset):
    def reg(params, x):
        tot = 0
        for p in params:
            if getattr(p, "_no_weight_decay", False):
                continue
            tot = tot + (p * x).sum()
        return tot

    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.full((3,), 2.0))
    b._no_weight_decay = True
    x = torch.ones(3)
    torch.testing.assert_close(coil.compile(reg)([a, b], x), reg([a, b], x))   # eager 3, coil 9


def test_getattr_sees_an_attribute_set_earlier_in_the_same_frame(coil_reset):
    def f(x):
        y = x * 2
        y.tag = 3
        return y * getattr(y, "tag", 1)

    torch.testing.assert_close(coil.compile(f)(torch.ones(2)), torch.full((2,), 6.0))   # coil: 2.0


def test_getattr_and_hasattr_see_an_attribute_of_a_dict_subclass(coil_reset):
    class Batch(dict):
        pass

    d = Batch(a=1)
    d.extra = 9
    f = lambda x, d: x * getattr(d, "extra", 0) + (2 if hasattr(d, "extra") else 3)  # noqa: E731
    x = torch.ones(2)
    torch.testing.assert_close(coil.compile(f)(x, d), f(x, d))   # eager 11, coil 3


def test_reading_a_parameter_attribute_is_captured(coil_reset):
    class TaggedParam(nn.Parameter):
        def scale(self):
            return 2.0

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = TaggedParam(torch.randn(4, 4))
            self.w.tag = "decay"

        def forward(self, x):
            s = 3.0 if self.w.tag == "decay" else 1.0
            return x @ self.w * s * self.w.scale()

    m = M()
    x = torch.randn(2, 4)
    out, warns = _warnings_of(coil.compile(m), x)
    torch.testing.assert_close(out, m(x))
    assert coil.capture.stats["fallbacks"] == 0 and coil.capture.stats["graphs"] == 1, (coil.capture.stats, warns)


def test_tensor_attribute_added_changed_or_removed_later_recompiles(coil_reset):
    """The attribute lookup is guarded: absent stays absent, a found value stays that value; an input returned by
    an in-place op (a new tracker without a source) is still looked up on the input."""
    def f(x, t):
        return x * (2 if getattr(t, "flag", False) else 3) * getattr(t.add_(0), "k", 1)

    cf, x, t = coil.compile(f), torch.ones(2), torch.ones(2)
    for change in (None, lambda: setattr(t, "flag", True), lambda: setattr(t, "k", 5),
                   lambda: setattr(t, "flag", False), lambda: delattr(t, "k")):
        if change:
            change()
        torch.testing.assert_close(cf(x, t), f(x, t))


def test_attribute_set_on_a_tensor_inside_the_frame_is_kept(coil_reset):
    """Setting attributes works (a graph break each, then eager's object): on an input and on an output."""
    def f(x):
        x.seen = True
        y = x * 2
        y.tag = 3
        return y

    t = torch.ones(2)
    out = coil.compile(f)(t)
    assert t.seen is True and out.tag == 3
    torch.testing.assert_close(out, torch.full((2,), 2.0))


# ---------------------------------------------------------------------------------------------------------------
# Finding 3: a Python int beyond 64 bits as a graph input is wrapped instead of raising OverflowError
# ---------------------------------------------------------------------------------------------------------------

def test_python_int_beyond_int64_raises_like_eager(coil_reset):
    f = lambda x, s: x * s  # noqa: E731
    cf = coil.compile(f)
    x = torch.ones(3)
    for s in (2, 3):
        torch.testing.assert_close(cf(x, s), f(x, s))
    with pytest.raises(OverflowError):
        f(x, 2**70)
    with pytest.raises(OverflowError):
        cf(x, 2**70)          # coil: tensor([0., 0., 0.])


# ---------------------------------------------------------------------------------------------------------------
# Finding 4: frames that run eagerly (warned) where torch.compile captures them
# ---------------------------------------------------------------------------------------------------------------

def test_changing_negative_float_argument_squared_stays_compiled(coil_reset):
    f = lambda x, s: x * s ** 2  # noqa: E731
    cf = coil.compile(f)
    x = torch.ones(3)
    for s in (0.3, -0.4, -1.5):
        out, warns = _warnings_of(cf, x, s)
        torch.testing.assert_close(out, f(x, s))
    assert coil.capture.stats["fallbacks"] == 0, (coil.capture.stats, warns)


def test_changing_positive_float_argument_squared_stays_compiled(coil_reset):
    f = lambda x, s: x * s ** 2 + s ** 0.5  # noqa: E731
    cf = coil.compile(f)
    x = torch.ones(3)
    for s in (0.3, 0.4, 1.5):
        torch.testing.assert_close(cf(x, s), f(x, s))
    assert coil.capture.stats["fallbacks"] == 0, coil.capture.stats


def test_check_tensor_all_does_not_make_invalid_fx_code(coil_reset):
    def f(x):
        torch._check_tensor_all(x > 0)
        return x + 1

    out, warns = _warnings_of(coil.compile(f), torch.ones(3))
    torch.testing.assert_close(out, torch.full((3,), 2.0))
    assert not any("SyntaxError" in w for w in warns), warns
    assert coil.capture.stats["fallbacks"] == 0


def test_check_tensor_all_still_raises(coil_reset):
    def f(x):
        torch._check_tensor_all(x > 0)
        return x + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError):
            coil.compile(f)(-torch.ones(3))


def test_os_getenv_is_not_a_graph_break(coil_reset):
    def f(x):
        if os.getenv("COIL_TRIAL53_FLAG", "0") == "1":
            return x * 2
        return x + 1

    torch.testing.assert_close(coil.compile(f)(torch.ones(2)), torch.full((2,), 2.0))
    assert coil.capture.stats["graph_breaks"] == 0, coil.capture.stats


def test_int_power_of_a_changing_int_argument_generates_code(coil_reset):
    f = lambda x, s: x * 2 ** s  # noqa: E731
    cf = coil.compile(f)
    x = torch.ones(3)
    all_warns = []
    for s in (2, 3, -1, -2, 5):
        out, warns = _warnings_of(cf, x, s)
        all_warns += warns
        torch.testing.assert_close(out, f(x, s))
    assert not any("code generation failed" in w for w in all_warns), all_warns


def test_inference_mode_block_inside_is_captured(coil_reset):
    """``y * 2`` outside the block is an ordinary tensor in eager (only tensors made inside are inference tensors)."""
    def f(x, w):
        with torch.inference_mode():
            y = x @ w
        return y * 2

    x, w = torch.randn(2, 3), torch.randn(3, 3)
    out, warns = _warnings_of(coil.compile(f), x, w)
    want = f(x, w)
    torch.testing.assert_close(out, want)
    assert out.is_inference() == want.is_inference() is False
    assert coil.capture.stats["fallbacks"] == 0, (coil.capture.stats, warns)


class _ScaleByConfig(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        ctx.k = cfg["k"]
        return x * cfg["k"]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


_CFG = {"k": 2.0}


def test_autograd_function_with_a_dict_argument_is_not_a_graph_break(coil_reset):
    def f(x):
        return _ScaleByConfig.apply(x.sin(), _CFG).cos()

    x = torch.randn(3, requires_grad=True)
    out = coil.compile(f)(x)
    want = f(x)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])
    assert coil.capture.stats["graph_breaks"] == 0, coil.capture.stats


def test_unknown_cpu_backend_value_is_rejected(coil_reset):
    with pytest.raises(ValueError):
        coil.compile(lambda x: x + 1, options={"cpu_backend": "CPP"})(torch.ones(2))


def _scaled(x, scale=2.0, flag=False):
    return x * scale


_SIG = __import__("inspect").signature(_scaled)


def test_signature_bind_is_not_a_graph_break(coil_reset):
    def f(x, **kw):
        b = _SIG.bind(x, **kw)
        b.apply_defaults()
        return _scaled(*b.args, **b.kwargs) + b.arguments["scale"]

    x = torch.ones(2)
    torch.testing.assert_close(coil.compile(f)(x, scale=3.0), f(x, scale=3.0))
    assert coil.capture.stats["graph_breaks"] == 0, coil.capture.stats


# ---------------------------------------------------------------------------------------------------------------
# Things that work (kept as regressions)
# ---------------------------------------------------------------------------------------------------------------

INT_CASES = {
    "int8 wrap": (lambda x: (x + x, x * 3, -x, x.abs()), torch.tensor([-128, -7, -1, 0, 1, 7, 127], dtype=torch.int8)),
    "uint8 wrap and promotion": (lambda x: (x - 10, x + torch.tensor([1], dtype=torch.int8), x << 1, x.sum()),
                                 torch.tensor([0, 1, 7, 128, 200, 255, 3], dtype=torch.uint8)),
    "int32 floor/trunc div and mod signs": (
        lambda x: (x // torch.tensor([3, -3, 2, -2, 5, -5, 3], dtype=torch.int32),
                   torch.div(x, -3, rounding_mode="trunc"), x % -3, torch.fmod(x, -3), torch.remainder(x, 3)),
        torch.tensor([-2**31, -7, -1, 0, 1, 7, 2**31 - 1], dtype=torch.int32)),
    "int32 shifts past the width": (lambda x: (x << 31, x >> 31, x << 33, x >> 40),
                                    torch.tensor([-5, -1, 0, 1, 7], dtype=torch.int32)),
    "float to int casts": (lambda x: (x.to(torch.int32), x.to(torch.int8), x.bool()),
                           torch.tensor([-2.7, -0.5, 0.5, 2.7, 100.9, 127.9, -128.9])),
    "bool arithmetic": (lambda x: (x + x, x * x, x.sum(), x.cumsum(0), ~x), torch.tensor([True, False, True])),
    "round half to even": (lambda x: (torch.round(x), torch.round(x * 10, decimals=-1)),
                           torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5])),
}


@pytest.mark.parametrize("name", list(INT_CASES))
def test_integer_and_rounding_semantics(name, coil_reset):
    fn, x = INT_CASES[name]
    got, want = coil.compile(fn)(x.clone()), fn(x.clone())
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("calls", [[(0.0,), (-0.0,)], [(True,), (1,), (1.0,)], [(2,), (2.0,)]],
                         ids=["neg-zero", "bool-int-float", "int-float"])
def test_python_scalar_arguments_of_equal_value_and_other_type_or_sign(calls, coil_reset):
    """0.0 then -0.0 (equal under ==, but 1/s differs), True then 1 then 1.0 (equal, other dtypes)."""
    def f(x, s):
        signed = torch.copysign(x, torch.tensor(s, dtype=torch.float32)) if isinstance(s, float) else x
        return signed, torch.full((2,), s)

    cf = coil.compile(f)
    x = torch.ones(2)
    for (s,) in calls:
        for g, w in zip(cf(x, s), f(x, s)):
            assert g.dtype == w.dtype, (s, g.dtype, w.dtype)
            torch.testing.assert_close(g, w)


def test_complex_real_view_written_in_place(coil_reset):
    def f(z):
        z.real.mul_(2)
        torch.view_as_real(z)[..., 1].add_(1)
        return z.abs(), z.angle()

    z = torch.randn(5, dtype=torch.complex64)
    z2 = z.clone()
    got, want = coil.compile(f)(z2), f(z)
    torch.testing.assert_close(z2, z)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_set_grad_enabled_and_autocast_state_leak_out_like_eager(coil_reset):
    """``torch.set_grad_enabled(False)`` / ``torch.set_autocast_enabled`` as plain calls inside the frame leave the
    global state changed after the call, as in eager."""
    def f(x):
        torch.set_grad_enabled(False)
        return x * 2

    x = torch.randn(3, requires_grad=True)
    try:
        out = coil.compile(f)(x)
        assert not torch.is_grad_enabled() and not out.requires_grad
    finally:
        torch.set_grad_enabled(True)

    lin = nn.Linear(4, 4)

    def g(x):
        torch.set_autocast_enabled("cpu", True)
        return lin(x)

    try:
        out = coil.compile(g)(torch.randn(2, 4))
        assert torch.is_autocast_enabled("cpu") and out.dtype == torch.get_autocast_dtype("cpu")
    finally:
        torch.set_autocast_enabled("cpu", False)


def test_forward_hooks_with_kwargs_that_rewrite_kwargs_and_count_calls(coil_reset):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.calls = 0

        def forward(self, x, scale=1.0):
            return self.lin(x) * scale

    def pre(mod, args, kwargs):
        mod.calls += 1
        return args, {**kwargs, "scale": kwargs.get("scale", 1.0) * 2}

    def post(mod, args, kwargs, out):
        return out + kwargs["scale"]

    torch.manual_seed(0)
    m = M()
    m.register_forward_pre_hook(pre, with_kwargs=True)
    m.register_forward_hook(post, with_kwargs=True)
    cm = coil.compile(m)
    x = torch.randn(2, 4)
    for s in (1.0, 3.0, 3.0):
        want = m(x, scale=s)
        torch.testing.assert_close(cm(x, scale=s), want)
    assert m.calls == 6


def test_fullgraph_error_names_the_user_line_in_a_helper(coil_reset):
    def helper(x):
        n = int(x.sum())   # the offending line
        return x[:n]

    def g(x):
        return helper(x)

    with pytest.raises(Exception, match="the offending line"):
        coil.compile(g, fullgraph=True)(torch.ones(3))


def test_special_functions_at_edge_values(coil_reset):
    e = torch.tensor([-3.0, -2.5, -1.0, -0.5, -1e-8, 0.0, 1e-8, 0.3, 0.5, 1.0, 2.0, 7.5, 30.0, 100.0, 1e4,
                      float("inf"), -float("inf"), float("nan")])
    sp = torch.special

    def f(x):
        return (torch.lgamma(x), torch.digamma(x), torch.polygamma(1, x), sp.i0e(x), sp.i1(x), sp.log_ndtr(x),
                sp.erfcx(x), sp.bessel_j0(x), sp.modified_bessel_k1(x), sp.zeta(x, 2.0), torch.sinc(x),
                torch.logit(x, eps=1e-6), F.softplus(x, beta=2, threshold=5), F.mish(x), torch.frexp(x)[0],
                torch.nextafter(x, torch.zeros_like(x)), torch.remainder(x, -2.0), torch.float_power(x, 2.5))

    for g, w in zip(coil.compile(f)(e), f(e)):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_greedy_decode_with_a_growing_concatenated_cache(coil_reset):
    torch.manual_seed(0)
    emb, proj = nn.Embedding(20, 16), nn.Linear(16, 20)
    att = nn.MultiheadAttention(16, 2, batch_first=True)

    def step(tok, k, v):
        h = emb(tok)
        k, v = torch.cat([k, h], 1), torch.cat([v, h], 1)
        o, _ = att(h, k, v, need_weights=False)
        return proj(o[:, -1]).argmax(-1, keepdim=True), k, v

    outs = []
    for fn in (step, coil.compile(step)):
        tok, k, v, toks = torch.tensor([[1], [2]]), torch.zeros(2, 0, 16), torch.zeros(2, 0, 16), []
        with torch.no_grad():
            for _ in range(8):
                tok, k, v = fn(tok, k, v)
                toks.append(tok)
        outs.append(torch.cat(toks, 1))
    assert torch.equal(outs[1], outs[0])
    assert coil.capture.stats["recompiles"] <= 2, coil.capture.stats   # sizes 0, 1, then symbolic
