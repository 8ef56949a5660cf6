"""Minimal repros from the seventh round of user testing: edge semantics. NaN/+-inf
through reductions (persistent, looped, split and dim-0), softmax-like rows of all -inf,
floating and integer division, bool and small-int arithmetic with scalars, dtype
promotion and empty / size-1 tensors; see FINDINGS_7.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed); the plain tests are compact versions of patterns
verified to work. CPU only, both kernel backends ("cpp" and "triton" through its
interpreter).
"""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from report_helpers import assert_args_match, assert_outputs_match, run_both

BACKENDS = ["cpp", "triton"]
NAN, INF = float("nan"), float("inf")


def _check(fn, args, backend, *, atol=1e-4, rtol=1e-4):
    """Eager vs compiled on copies of ``args``: values (NaN where eager has NaN), dtype,
    shape, strides of every non-size-1 dim, and the arguments after the call (mutation)."""
    a_ref = [a.clone() for a in args]
    a_out = [a.clone() for a in args]
    outs, refs = run_both(fn, a_ref, a_out, backend)
    assert_outputs_match(outs, refs, atol, rtol)
    assert_args_match(a_ref, a_out, 0, 0, equal_nan=True)
    return outs


def _triton_only(reason):
    """Backends parametrization where only the Triton backend has the defect."""
    return ["cpp", pytest.param("triton", marks=pytest.mark.xfail(strict=True, reason=reason))]


def _cpp_only(reason):
    return [pytest.param("cpp", marks=pytest.mark.xfail(strict=True, reason=reason)), "triton"]


# -- verified to work (compact versions of what was tried; FINDINGS_7.md lists more) ------

def _nan_inf_rows(r, c):
    torch.manual_seed(0)
    x = torch.randn(r, c)
    x[0, c // 3] = NAN
    x[1, 0], x[1, c - 1] = INF, -INF
    x[2, 1] = INF
    x[r - 1, c // 2] = NAN
    x[r - 1, 0] = -INF
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(5, 33), (3, 4097), (4, 20000)])  # persistent, looped, split
def test_reductions_with_nan_inf(backend, shape):
    def f(x):
        return (x.sum(1), x.mean(1), x.var(1), x.amax(1), x.amin(1), x.argmax(1), x.argmin(1),
                *x.max(1), *x.min(1), x.softmax(1), x.log_softmax(1), x.logsumexp(1),
                x.nansum(1), (x > 1).any(1), x.all(1), x.norm(dim=1))
    _check(f, [_nan_inf_rows(*shape)], backend, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dim0_and_full_reductions_with_nan_inf(backend):
    x = _nan_inf_rows(5, 33).t().contiguous()
    _check(lambda x: (x.sum(0), x.amax(0), x.argmax(0), *x.min(0), x.softmax(0), x.logsumexp(0),
                      x.amax(), x.argmax(), x.sum(), x.min()), [x], backend, atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_rows_all_neg_inf_and_cross_entropy_inf(backend):
    torch.manual_seed(0)
    x = torch.randn(4, 4097)  # looped (online softmax on Triton)
    x[0] = -INF
    x[1, 3] = x[1, 5] = INF
    x[2, :100] = -INF
    t = torch.tensor([1, 3, 7, -100])
    _check(lambda x, t: (x.softmax(1), x.log_softmax(1), x.logsumexp(1),
                         F.cross_entropy(x, t, reduction="none"), F.cross_entropy(x[1:], t[1:])),
           [x, t], backend, atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_pointwise_min_max_clamp(backend):
    x = torch.tensor([NAN, 1., -INF, INF, -0., 0., 2., NAN, -3.])
    y = torch.tensor([1., NAN, 0., NAN, 0., -0., INF, NAN, -INF])
    lo = torch.tensor([0., 0., NAN, 0., -1., 0., 3., 0., -1.])
    _check(lambda x, y, lo: (torch.maximum(x, y), torch.minimum(x, y), torch.fmax(x, y),
                             torch.fmin(x, y), x.clamp(-0.5, 0.5), x.clamp(min=NAN), x.clamp(max=NAN),
                             x.clamp(min=lo), x.clamp(lo, lo + 1), torch.where(x > y, x, y),
                             x.nan_to_num(), x.nan_to_num(1., 2., -3.), x.half().nan_to_num(),
                             x % y, torch.fmod(x, y), torch.div(x, y, rounding_mode="trunc")),
           [x, y, lo], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_wraparound_division_shifts(backend):
    def f(a, b):
        s = -3 if a.dtype.is_signed else 3  # uint8 with a negative scalar: see below
        return (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc"), a // s,
                a % s, a.abs(), -a, a * a, a + a, a << (b.abs() % 8), a >> (b.abs() % 8), ~a,
                a.sum(), a.sum(0, dtype=a.dtype), a.cumsum(0), a * 2.5, a - 1)
    for dt in (torch.int8, torch.int16, torch.int64, torch.uint8):
        info = torch.iinfo(dt)
        a = torch.tensor([info.min, info.max, -7, 7, 5, -1, 0, 3]).to(dt)
        b = torch.tensor([3, -1, 2, -2, -3, 7, 5, 1]).to(dt)  # INT_MIN / -1: see below
        _check(f, [a, b], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalar_promotion_and_casts(backend):
    torch.manual_seed(0)
    i, f = torch.randint(-100, 100, (4, 6), dtype=torch.int32), torch.randn(4, 6)
    bf, b = f.bfloat16(), f > 0
    _check(lambda i, f, bf, b: (i * 2.5, i / 2, bf + 1e-3, bf + f, bf * torch.tensor(0.1), b * 1.5,
                                b.sum(1), i.type_as(f), f.type_as(i), (f * 1e5).half(),
                                (f * 100).to(torch.int8), torch.where(b, i, 2.5),
                                i.masked_fill(b, 3.7), f.to(torch.float32, copy=True).add_(1)),
           [i, f, bf, b], backend, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_size1_reductions(backend):
    def f(x):
        return (x.sum(0), x.sum(1), x.sum(), x.mean(0), x.mean(1), x.prod(1), x.var(1),
                x.any(1), x.all(), x.logsumexp(0), x.softmax(1), x.cumsum(1), x.reshape(-1) * 2)
    for shape in [(0, 5), (5, 0), (1, 5), (5, 1)]:
        _check(f, [torch.randn(*shape)], backend)


# -- failures ------------------------------------------------------------------------------

# fixed: ir/lowering.py _div_mode computed floor(a / b); now _float_floordiv (eager's and
# CPython's fmod-based floor division): 1.0 // 0.1 was 10 (eager 9), inf // 2 inf (nan)
@pytest.mark.parametrize("backend", BACKENDS)
def test_float_floor_division(backend):
    a = torch.tensor([1.0, 0.7, INF, 5.0, -7.5, 0.0, -0.0, 3.0])
    b = torch.tensor([0.1, 0.1, 2.0, -INF, 2.0, -3.0, 2.0, 0.0])
    _check(lambda a, b: (a // b, torch.floor_divide(a, b), torch.div(a, b, rounding_mode="floor"),
                         a // 0.1), [a, b], backend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # (bf16: eager rounds each step to bf16)
@pytest.mark.parametrize("backend", BACKENDS)
def test_float_floor_division_random(backend, dtype):
    torch.manual_seed(0)
    a = (torch.randn(4096) * 10).to(dtype)
    b = (torch.randn(4096) * 3).to(dtype)
    _check(lambda a, b: (a // b, torch.remainder(a, b), a // -0.3), [a, b], backend)


# fixed: Triton emitted bool + bool as int1 addition (True + True wrapped to False)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bool_add(backend):
    a = torch.tensor([True, True, False, False])
    b = torch.tensor([True, False, True, False])
    _check(lambda a, b: (a + b, a + True, a.clone().add_(b)), [a, b], backend)


# fixed: Triton's looped argmax/argmin never took an element equal to the start value
# (-inf rows for argmax, iinfo.min for ints) and returned 2147483647
@pytest.mark.parametrize("backend", BACKENDS)
def test_looped_argmax_of_row_at_the_init_value(backend):
    x = torch.randn(3, 4097)  # > triton_persistent_rnumel: looped; odd: not split
    x[0] = -INF
    y = torch.full((2, 4097), -128, dtype=torch.int8)
    _check(lambda x, y: (x.argmax(1), (-x).argmin(1), x.max(1).indices, y.argmax(1)),
           [x, y], backend)


# fixed: codegen/cpp/prelude.h coil_tanh clamped |x| to 9 before exp, so tanh never reached
# +-1 and gelu(approximate='tanh') of -1e7 was -0.298 (eager -0); now exactly +-1 from eager's
# saturation point on (tests/codegen/cpp/test_cpp_int_edge.py has the dense sweep)
@pytest.mark.parametrize("backend", BACKENDS)
def test_cpp_tanh_saturation(backend):
    x = torch.tensor([-3e38, -1e7, -INF, 20.0, -20.0, INF])
    out, = _check(lambda x: F.gelu(x, approximate="tanh"), [x], backend)
    o, r = run_both(lambda x: x.tanh(), [x.clone()], [x.clone()], backend)
    assert torch.equal(o[0], r[0]), (o[0].tolist(), r[0].tolist())


# fixed: Triton's online sum(exp(x - max)) gave 0 for a looped row of only -inf (eager NaN)
@pytest.mark.parametrize("backend", BACKENDS)
def test_online_sum_exp_of_all_neg_inf_row(backend):
    x = torch.randn(2, 4097)  # looped, not split
    x[0] = -INF
    _check(lambda x: (x - x.amax(1, keepdim=True)).exp().sum(1), [x], backend)


# fixed: Triton emitted Python int scalars unwrapped (300 as a uint8 literal was rejected);
# _lit wraps them into the dtype's range as eager converts the scalar
@pytest.mark.parametrize("backend", BACKENDS)
def test_small_int_with_out_of_range_scalar(backend):
    u = torch.tensor([0, 1, 200, 255], dtype=torch.uint8)
    i = torch.tensor([-128, -1, 0, 127], dtype=torch.int8)
    _check(lambda u, i: (u + 300, u * -1, i + 1000), [u, i], backend)


# fixed: Triton sent int ** int tensor to libdevice.pow (floats only; the interpreter raised
# for negative exponents); now _pow_int (squaring, wrapping, eager's negative-exponent rule)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_int_pow_negative_int_tensor(backend, dtype):
    a = torch.tensor([1, -1, 2, 3, -2, 0, 5, 7], dtype=dtype)
    e = torch.tensor([-1, -3, -1, -2, -1, 3, 13, 40], dtype=dtype)
    _check(lambda a, e: a ** e, [a, e], backend)


_INT_MIN_DIV = """
import torch, coil
f = lambda a, b: (a // b, a % b, torch.fmod(a, b))  # eager's own trunc div traps here
a = torch.tensor([torch.iinfo(torch.int64).min, 7]); b = torch.tensor([-1, 2])
out = coil.compile(f, options={"cpu_backend": "BACKEND"})(a, b)
assert all(torch.equal(o, r) for o, r in zip(out, f(a, b))), (out, f(a, b))
"""


# fixed: codegen/cpp/prelude.h coil_floordiv / coil_mod and the C++ '%' of fmod trapped
# (SIGFPE) on INT_MIN / -1 and on a divisor of 0; now INT_MIN, 0 and 0 for a divisor of 0
# (tests/codegen/cpp/test_cpp_int_edge.py has the int8..int64 edge cases)
@pytest.mark.parametrize("backend", BACKENDS)
def test_int_min_divided_by_minus_one(backend):
    # in a subprocess: the C++ kernel kills the interpreter
    p = subprocess.run([sys.executable, "-c", _INT_MIN_DIV.replace("BACKEND", backend)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
