"""Smallest inputs of the silent mismatches coil's differential fuzzer found
(docs/fuzzing.md), each checked against eager through ``coil.bench.fuzz.check``
(outputs, dtypes, strides of views, which input an output shares memory with, the
inputs afterwards) on both CPU kernel backends."""
import math

import pytest
import torch

import coil
from coil import trace
from coil.bench.fuzz import check

BACKENDS = ["cpp", "triton"]


def _ok(fn, make_inputs, backend):
    r = check(fn, make_inputs, backend)
    assert r.outcome == "ok", f"{r.outcome} {r.kind}: {r.detail}"


# -- views of inputs as another dtype (view(dtype)) --------------------------------

def _view_returned(a):
    a.relu_()
    return (a.view(torch.float32),)


def _write_through_view(a):
    v0 = a.view(torch.float64)  # an extern op whose output shares its argument's memory
    v0.fill_(-3.0)
    return (torch.softmax(v0, -1),)


def _sub_through_view(b):
    v1 = b.view(torch.int32)
    v1.sub_(torch.prod(b, dim=1).expand((1, 4)).to(torch.int32))
    return (v1,)


def _views_at_offsets(a):
    return a[1:].view(torch.int16), a[2:].view(torch.int64), a.view(torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,make_inputs", [
    (_view_returned, lambda: [torch.tensor(-3, dtype=torch.int32)]),
    (_write_through_view, lambda: [torch.tensor(-1, dtype=torch.int64)]),
    (_sub_through_view, lambda: [torch.ones(1, 4)]),
    (_views_at_offsets, lambda: [torch.arange(6, dtype=torch.int32)]),
], ids=["returned", "fill_", "sub_", "offsets"])
def test_view_as_dtype_of_input(fn, make_inputs, backend):
    _ok(fn, make_inputs, backend)


# -- special and extreme values of transcendental functions ------------------------

_HUGE = [9223372036854775804.0, 3.4028235e38, -3.4028235e38, 1e18, -1e24, 1048576.0,
         1048575.9, 2.0 ** 60 + 2.0 ** 37, 123456789.0, -0.0, float("inf"), float("nan")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["sin", "cos"])
def test_trig_of_huge_values(op, backend):
    """sin/cos beyond the small-range reduction (C++: NaN from 1e18 on, wrong digits
    from ~1e13) are eager's to 1 ulp; int64 9223372036854775804 converted to float32
    is the fuzzer's case."""
    f = getattr(torch, op)
    _ok(lambda c: (f(c),), lambda: [torch.tensor(9223372036854775804, dtype=torch.int64)], backend)
    _ok(lambda c: (f(c),), lambda: [torch.tensor(_HUGE)], backend)
    x = torch.logspace(0, 38, 3000) * torch.tensor([1.0, -1.0]).repeat(1500)
    _ok(lambda c: (f(c),), lambda: [x.clone()], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_sin_rounds_as_eagers(backend):
    """fuzz seed 90 #2138: C++ float32 sin(1) was an ulp above eager's (correctly rounded)
    value; remainder of a float64 by it multiplies that ulp by the quotient (3e-7)."""
    _ok(lambda a, b: (torch.remainder(a, torch.sin(b).expand(1, 1)),),
        lambda: [torch.tensor([1.0, -3.4999850795678418], dtype=torch.float64), torch.tensor(1.0)],
        backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_atan2_of_equal_values_is_eagers(backend):
    """fuzz seed 90 #826 (Triton interpreter): NumPy's float32 atan2(0.3012721, 0.3012721)
    is an ulp below eager's pi/4, so a row of pi/4 from atan2(inf, inf) and 1 was not
    constant and layer_norm made -1.3e-5 of it, eager 0. Under the interpreter,
    libdevice functions and sin/cos/exp/log of float32 run in float64, rounded once."""
    _ok(lambda a: (torch.nn.functional.layer_norm(torch.atan2(a, a), (3,)), torch.sin(a[:1])),
        lambda: [torch.tensor([0.3012721, float("inf"), 1.0])], backend)
    # seed 81 #2269: NumPy's float32 exp(2) is an ulp below eager's; a float64 prod shows it
    _ok(lambda a: (torch.prod(a.exp(), dtype=torch.float64),),
        lambda: [torch.tensor([2.0, 0.0, -2.0, 3.0, -1.0])], backend)


def _cos_of_atan(a):  # s1033 #729
    return (torch.cos(torch.atan(torch.nn.functional.pad(a.reshape(1, 1, -1), (0, 1), mode='replicate'))),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_trig_of_an_inverse_is_not_folded(dtype, backend):
    """s1033 #729: ``cos(atan(nan))`` of float64 was 0 in coil's C++ kernel, eager NaN: with ``-fno-math-errno`` GCC 12
    folds ``cos(atan(x))`` into ``1 / sqrt(x*x + 1)`` behind a ``|x| <`` test that NaN fails (``sin(atan(nan))`` gave
    1, ``cos(atan(inf))`` 0 for 6.1e-17, others an ulp off; ``sinh``/``cosh`` of ``atanh`` alike)."""
    _ok(_cos_of_atan, lambda: [torch.tensor(math.nan, dtype=dtype)], backend)
    x = lambda: [torch.tensor([math.nan, math.inf, -math.inf, 2.0, -0.3, 1e200, 0.999999999], dtype=dtype)]  # noqa
    _ok(lambda a: (torch.cos(torch.atan(a)), torch.sin(torch.atan(a)), torch.sinh(torch.atanh(a)),
                   torch.cosh(torch.atanh(a)), torch.tanh(torch.atanh(a))), x, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_gelu_of_infinities(dtype, backend):
    """Exact GELU at ±inf as eager's CPU kernel gives it for contiguous tensors: NaN at
    +inf for fp32/bf16 where oneDNN runs it with AVX-512, inf on AVX2 CPUs and for fp16/fp64
    (the lowering asks eager which, once per dtype; a fixed NaN failed on AVX2); NaN at -inf;
    the tanh form and both backward forms too."""
    def fn(a):
        g = torch.ones_like(a)
        return (torch.nn.functional.gelu(a), torch.nn.functional.gelu(a, approximate="tanh"),
                torch.ops.aten.gelu_backward(g, a), torch.ops.aten.gelu_backward(g, a, approximate="tanh"))
    _ok(fn, lambda: [torch.tensor([float("inf"), -float("inf"), 1.5, -30.0, float("nan")], dtype=dtype)],
        backend)


# -- dtypes eager's kernels refuse and fake tensors accept -------------------------

@pytest.mark.parametrize("fn,make_inputs,message", [
    (lambda a, b: (a // b, torch.var(b, correction=2)),
     lambda: [torch.tensor(7, dtype=torch.int32), torch.tensor([-2], dtype=torch.int32).expand(2)],
     "std and var only support floating point and complex dtypes"),
    (lambda a: (a.std(dim=0),), lambda: [torch.tensor([[1, 2], [3, 4]])], "std and var only"),
    (lambda a: (torch.argmin(a > 0, dim=-1),), lambda: [torch.tensor([[1, 2], [3, 4]])],
     "does not support bool"),
    (lambda a: (torch.frac(a),), lambda: [torch.tensor([1, 2])], "not implemented for 'Long'"),
    (lambda b, c: (c ** b,), lambda: [torch.tensor(False), torch.tensor(True)],
     "not implemented for 'Bool'"),
    (lambda a: (torch.nn.functional.silu(a == a),), lambda: [torch.tensor([1.0, 2.0])],
     "not implemented for 'Bool'"),
    (lambda a: (a.reshape(2, -1) % a.reshape(2, -1),), lambda: [torch.tensor([True, True])],
     "not implemented for 'Bool'"),  # fuzz seed 90 #3527
    (lambda a: (a - (-0.5),), lambda: [torch.tensor(False)], "with a bool tensor"),  # s91 #562
    (lambda a, c: (torch.logical_and(c, a) - 1,), lambda: [torch.tensor(-5), torch.tensor(1.0)],
     "with a bool tensor"),  # seed 91 #2466
], ids=["var", "std", "argmin-bool", "frac-int", "pow-bool", "silu-bool", "mod-bool", "rsub-bool",
        "sub-bool"])
def test_refused_dtypes_raise_eagers_error(fn, make_inputs, message):
    r = check(fn, make_inputs, "cpp")
    assert r.outcome == "both_raise" and message in r.detail, f"{r.outcome} {r.kind}: {r.detail}"


def test_allowed_dtypes_still_compile():
    import coil
    from coil.testing import CompileCounter

    cnt = CompileCounter()
    def fn(a, x):
        return (a.argmax(), a ** 2, abs(a), 2 ** a, x.var(), x.pow(2), torch.topk(a, 2).values,
                torch.softmax(a, 0, dtype=torch.float32))
    f = coil.compile(fn, backend=cnt)
    a, x = torch.tensor([1, 5, 2]), torch.tensor([1.0, 2.0])
    for c, e in zip(f(a, x), fn(a, x)):
        assert torch.equal(c, e)
    assert cnt.frame_count == 1


# -- writes through a no-op expand() of an input ------------------------------------

def _masked_fill_through_expand(b):
    v0 = b.expand(-1)
    v0.masked_fill_(b > 0, 0.25)
    return ()


def _mul_through_expand(b):
    b.expand(3).mul_(2)
    return ()


@pytest.mark.parametrize("backend", BACKENDS + ["aot_eager"])
@pytest.mark.parametrize("fn", [_masked_fill_through_expand, _mul_through_expand])
def test_write_through_noop_expand_of_input(fn, backend):
    """The write-back was base + (new - base): NaN where the input held inf."""
    _ok(fn, lambda: [torch.tensor([float("inf"), 1.0, -2.0])], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pow_minus_half_is_rsqrt(backend):
    """ATen computes x ** -0.5 as 1 / sqrt(x): -0.0 -> -inf, -inf -> NaN."""
    _ok(lambda x: (x ** -0.5, torch.pow(x, -0.5)),
        lambda: [torch.tensor([-0.0, 0.0, -float("inf"), float("inf"), 4.0, -1.0])], backend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_pow_half_is_sqrt(backend, dtype):
    """ATen computes x ** 0.5 as sqrt(x) (not fp16 on CPU): -inf -> NaN, where pow gives inf."""
    _ok(lambda x: (x ** 0.5, torch.pow(x, 0.5)),
        lambda: [torch.tensor([-0.0, 0.0, -float("inf"), float("inf"), 4.0, -1.0], dtype=dtype)], backend)


def test_pow_half_of_fp16_on_cpu_is_pow():
    """fp16 on CPU is the exception: ATen's pow there (-inf ** 0.5 is inf, -0.0 ** -0.5 is inf)."""
    _ok(lambda x: (x ** 0.5, x ** -0.5),
        lambda: [torch.tensor([-0.0, 0.0, -float("inf"), float("inf"), 4.0, -1.0], dtype=torch.float16)], "cpp")


# -- float -> integer casts of NaN and out-of-range values ---------------------------

def _nan_cast_of_constant(a):
    return (torch.full((4,), torch.nan, dtype=torch.bfloat16).to(torch.int64) + a,)


def _nan_written_then_copied(a, c):  # fuzz seed 22 #1703: scatter_ of a NaN source
    a[1:] = torch.nan
    c.copy_(a.to(torch.int64))
    return ()


@pytest.mark.parametrize("fn,make_inputs", [
    (_nan_cast_of_constant, lambda: [torch.ones(4, dtype=torch.int64)]),
    (_nan_written_then_copied, lambda: [torch.ones(4, dtype=torch.bfloat16),
                                        torch.ones(4, dtype=torch.int64)]),
], ids=["constant", "written"])
def test_nan_cast_to_int64(fn, make_inputs):
    """C++: a static_cast of NaN is undefined and GCC folded a known NaN to 0 (eager,
    x86: INT64_MIN); casts go through coil_ftoi."""
    _ok(fn, make_inputs, "cpp")


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_float_to_int_casts_of_special_values(src, dst):
    """NaN, ±inf and out-of-range values cast as eager's x86 kernels do: INT64_MIN or
    INT32_MIN, narrower types the low bits of the int32 result."""
    vals = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e20, -3e9, 3e9, 70000.0,
                         -300.0, 200.5, -1.5, -0.0, 2.0 ** 31, -2.0 ** 31, 2.0 ** 63])

    def fn(a):
        b = a.clone()
        b[:2] = torch.nan  # a NaN the compiler knows
        return a.to(dst), b.to(dst)
    _ok(fn, lambda: [vals.to(src).repeat(8)], "cpp")


# -- a write through a slice whose negative start is past the beginning ------------

def _masked_write_into_short_slice(a):
    v = a[..., -4:]  # 2 elements: eager clamps the start to 0
    v[v > 0] = 1.0
    return (v,)


def _add_into_short_slice(a):
    a[-4:].add_(1)
    return (a,)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_masked_write_into_short_slice, _add_into_short_slice])
def test_write_into_slice_with_start_before_the_first_element(fn, backend):
    """slice_scatter of ``a[-4:]`` with ``a`` of 2-3 elements: the start was -1, not 0,
    so the write landed one element late and the first read garbage (fuzz seed 33 #1082)."""
    _ok(fn, lambda: [torch.tensor([0.5, -0.25])], backend)
    _ok(fn, lambda: [torch.tensor([-0.75, 1.5, 0.125])], backend)


# -- scalars that do not fit a float dtype ----------------------------------------------

def _masked_fill_of_empty_view(c):  # fuzz seed 24 #1246
    c[2:0:3].masked_fill_(torch.mean(c) > 0, 1e30)
    return ()


def _dead_index_fill(a):
    a.index_fill(0, torch.tensor([0]), 1e30)  # its value unused: eager raises anyway
    return (a + 1,)


def _clamp_bf16(a):
    return (a.clamp(max=1e39),)


def _fill_fp32(a):
    a.fill_(-1e39)
    return ()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,make_inputs", [
    (_masked_fill_of_empty_view, lambda: [torch.tensor([1.0], dtype=torch.float16)]),
    (_dead_index_fill, lambda: [torch.ones(2, dtype=torch.float16)]),
    (_clamp_bf16, lambda: [torch.ones(2, dtype=torch.bfloat16)]),
    (_fill_fp32, lambda: [torch.ones(2)]),
], ids=["masked_fill_-empty", "index_fill-dead", "clamp-bf16", "fill_-fp32"])
def test_scalar_overflowing_the_dtype_raises(fn, make_inputs, backend):
    """Eager checks that the scalar fits the tensor's dtype whatever the elements (none
    here, or the result unused); the graph had lost the check (``masked_fill`` becomes
    ``where`` of a saturating ``scalar_tensor``), so such a program now runs eagerly."""
    r = check(fn, make_inputs, backend)
    assert r.outcome == "both_raise" and "without overflow" in r.detail, f"{r.outcome}: {r.detail}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalar_beyond_the_dtype_where_eager_accepts_it(backend):
    """``where`` and arithmetic take such a scalar in a wider type: no error, inf."""
    _ok(lambda a: (torch.where(a > 1, a, 1e30), a * 1e30, a.masked_fill(a > 1, float("inf"))),
        lambda: [torch.ones(2, dtype=torch.float16)], backend)


def _cumsum_of_erf(a):  # fuzz seed 24 #1153
    return (torch.cumsum(torch.erf(a), dim=-1, dtype=torch.float64),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_erf_is_within_an_ulp_of_eagers(backend):
    """C++'s erf was 7e-7 relative off (Abramowitz & Stegun); float64 sums of values that
    cancel showed it beyond float64's tolerance. Now libm's double erf, rounded."""
    _ok(_cumsum_of_erf, lambda: [torch.tensor([[-1.6699758, -0.0, 1.8578273]])], backend)
    x = torch.linspace(-6, 6, 20001)
    _ok(lambda a: (torch.erf(a).double() - torch.erf(a.double()),), lambda: [x.clone()], backend)


# -- float16/bfloat16 intermediates fused into one kernel ----------------------------

def _compare_with_filled_copy(a):  # fuzz seed 24 #2938
    v1 = torch.sinh(torch.ceil(a))
    return (torch.lt(v1.index_fill(1, torch.tensor([0, 5]), 300), v1),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_low_precision_intermediate_is_rounded(dtype, backend):
    """``v1`` was kept in float32 inside the kernel and compared with its own bf16 copy
    (True where eager, comparing bf16 with bf16, has False); a fused fp16/bf16 value
    is now rounded to its dtype, as eager stores it."""
    _ok(_compare_with_filled_copy, lambda: [torch.ones(1, 6, dtype=dtype)], backend)


def _argmax_of_wrapped_negation(a):  # fuzz seed 50 #1285
    a.unsqueeze(1).neg_()
    return (torch.argmax(a, dim=1), torch.argmax(-a, dim=1), -a)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_signed_overflow_wraps(backend):
    """-INT64_MIN wraps to INT64_MIN as in eager; C++ kernels build with -fwrapv (GCC
    assumed signed overflow never happens and turned argmax(-x) of [0, INT64_MIN] into 1)."""
    _ok(_argmax_of_wrapped_negation,
        lambda: [torch.tensor([[0, -2**63], [5, -2**63 + 1]], dtype=torch.int64)], backend)


def _stats_of_constant_rows(x):  # fuzz seed 51 #656
    return (torch.nn.functional.layer_norm(x, (6,)), *torch.var_mean(x, 1), x.std(1))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_statistics_of_a_constant_row_are_exact(backend):
    """A row of equal large values has mean exactly that value and variance 0, as eager's
    Welford gives: the mean is taken around the row's first element (sum(x)/n was an ulp
    off, and layer_norm scaled that ulp to ±1)."""
    def make():
        x = torch.full((3, 6), 1e30, dtype=torch.float64)
        x[1] = torch.tensor([0.3, -1.2, 2.5, 0.0, -0.7, 1.1], dtype=torch.float64)
        x[2] = -7.1e25
        return [x]
    _ok(_stats_of_constant_rows, make, backend)


def _as_strided_of_mutated_transposed_input(a):
    a.mul_(2)
    return (a.as_strided((2,), (1,), 3) * 1, a[:, -1:].as_strided((2,), (1,), 3) + 1)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_as_strided_reads_an_intermediate_in_eagers_layout(backend):
    """as_strided reads storage: the mutated transposed input's new value (mul keeps the
    transposed strides in eager and in the fake value) was realized contiguous, so the
    read landed on other elements (8, 4 instead of 6, 8; fuzz seed 70 #598's class)."""
    _ok(_as_strided_of_mutated_transposed_input, lambda: [torch.arange(6.).reshape(2, 3).t()], backend)


def _pow_of_bool_by_bool(a, b):  # fuzz seed 70 #2754
    return (a ** True, torch.pow(a, False) & b, a.pow(True) * 1)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_pow_of_bool_by_python_bool_is_bool(backend):
    """``bool_tensor ** True`` is bool in eager (the promoted dtype) and int64 in torch's meta
    kernel, which coil's capture took; the probe of eager's kernel now gives the dtype (a cast
    after the call), on coil's capture and on torch's (``torch.compile(backend="coil")``)."""
    make = lambda: [torch.tensor([True, False, True]), torch.tensor([True, True, False])]  # noqa: E731
    _ok(_pow_of_bool_by_bool, make, backend)
    if backend == "cpp":
        out = torch.compile(_pow_of_bool_by_bool, backend="coil")(*make())
        assert [o.dtype for o in out] == [torch.bool, torch.bool, torch.int64]


# -- index tensors of a dtype eager refuses ------------------------------------------

def _index_put_empty_float(a):  # fuzz seed 70 #2393
    a.index_put_((torch.tensor([]),), torch.tensor(1.0))
    return (a,)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,message", [
    (_index_put_empty_float, "tensors used as indices must be long"),
    (lambda a: a.__setitem__(torch.tensor([1], dtype=torch.int16), 1.0), "tensors used as indices"),
    (lambda a: (torch.index_select(a, 0, torch.tensor([1.0])),), "index_select(): Expected dtype"),
    (lambda a: (a.index_add_(0, torch.tensor([]), torch.ones(0)),), "index_add_(): Expected dtype"),
    (lambda a: (a.index_fill(0, torch.tensor([1], dtype=torch.int32), 2.0),), "index_fill_(): Expected"),
    (lambda a: (a.index_copy(0, torch.tensor([]), torch.ones(0)),), "index_copy_(): Expected"),
], ids=["index_put_-empty-float", "setitem-int16", "index_select-float", "index_add_-empty-float",
        "index_fill-int32", "index_copy-empty-float"])
def test_index_of_a_refused_dtype_raises(fn, message, backend):
    """Eager refuses these index dtypes whatever the elements (none, here too); the meta
    kernels accept them and the graph ran. Such a program now runs eagerly."""
    r = check(fn, lambda: [torch.arange(4.)], backend)
    assert r.outcome == "both_raise" and message in r.detail, f"{r.outcome}: {r.detail}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_dtypes_eager_accepts_still_compile(backend, tmp_path):
    """int32 indices and bool masks run compiled as before (not eagerly)."""
    before = trace.trace_dir()
    trace.set_dir(str(tmp_path))
    try:
        _ok(lambda a: (torch.index_select(a, 0, torch.tensor([1, 0], dtype=torch.int32)),
                       a.index_put((torch.tensor([2], dtype=torch.int32),), torch.tensor(5.0)),
                       a.index_put((a > 1,), torch.tensor(5.0))),
            lambda: [torch.arange(4.)], backend)
    finally:
        trace.set_dir(before)
    log = "".join(f.read_text() for f in tmp_path.iterdir())
    assert "aot_analysis" in log and "aot_overlapping_write_eager" not in log


# -- storage layouts that as_strided and extern kernels see --------------------------

def _as_strided_after_scatter_(a):  # fuzz seed 70 #598 (torch's aot_eager gives the same)
    a.scatter_(0, torch.tensor([[[0, 0], [1, 1]], [[1, 1], [0, 0]]]), torch.full((2, 2, 2), -1.0))
    return (a.as_strided((3,), (1,), 12) * 1,)


def _write_through_as_strided_after_index_add_(a):
    a.index_add_(1, torch.tensor([1]), torch.ones(2, 1, 5))
    a.as_strided((4,), (2,), 3).mul_(10)
    return (a.as_strided((3,), (1,), 12), a * 1)


@pytest.mark.parametrize("backend", BACKENDS)
def _as_strided_after_mul_(a):
    a.mul_(2)
    return (a.as_strided((3,), (1,), 14) * 1,)


_PERMUTED = lambda: [torch.arange(20.).reshape(2, 2, 5).permute(1, 0, 2)]  # noqa: E731
_AT_OFFSET = lambda: [torch.arange(30.)[2:22].reshape(2, 2, 5).permute(1, 0, 2)]  # noqa: E731
_STEPPED = lambda: [torch.arange(40.).reshape(2, 2, 10)[:, :, ::2].permute(1, 0, 2)]  # noqa: E731


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,make_inputs", [
    (_as_strided_after_scatter_, _PERMUTED), (_write_through_as_strided_after_index_add_, _PERMUTED),
    (_as_strided_after_scatter_, _AT_OFFSET), (_as_strided_after_mul_, _AT_OFFSET),
    (_as_strided_after_scatter_, _STEPPED),
], ids=["scatter_", "index_add_-write", "scatter_-offset", "mul_-offset", "scatter_-stepped"])
def test_as_strided_reads_a_mutated_input_in_its_own_layout(fn, make_inputs, backend):
    """``scatter_``/``index_add_`` of a permuted input become an out-of-place op whose
    result is contiguous (``mul``'s starts at offset 0); eager's storage keeps the input's
    strides and offset, so ``as_strided`` (reads, writes through it, an output aliasing
    the input) read other elements. The functional value is laid out in the tensor's
    strides and offset before an ``as_strided``; one that reads between a stepped input's
    elements (not in the graph) runs eagerly."""
    _ok(fn, make_inputs, backend)


def _sdpa_of_expanded_input_after_unsqueeze_(a):  # fuzz seed 51 #11382
    a.unsqueeze_(0)
    kv = a[:, :1].expand(-1, 3, -1, -1).narrow(2, 0, 1)
    return (torch.nn.functional.scaled_dot_product_attention(a, kv, kv),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_extern_kernel_gets_eagers_strides_of_size_one_dims(backend):
    """The view handed to CPU flash attention had stride 1 on its size-1 batch dim (eager:
    0); that kernel steps by it and read past the stride-0 expanded input."""
    _ok(_sdpa_of_expanded_input_after_unsqueeze_,
        lambda: [torch.tensor([[[0.26, 0.82, -2.45, 2.16, -0.43]]]).expand(3, 1, 5)], backend)


def _fill_then_layer_norm(b):  # fuzz seed 90 #1715
    v1 = torch.cumsum(b, dim=3)
    v1.fill_(1e30)
    return (torch.nn.functional.layer_norm(v1, (1,)),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_constant_cast_reads_its_dtypes_value(backend):
    """A float32 constant cast to float64 is float32's value (1e30 -> 1.0000000150e30):
    Triton folded the cast from the unrounded 1e30, so layer_norm's float64 statistics
    read 1e30 and its float32 normalization 1.0000000150e30 (x - mean = 1.5e22, not 0)."""
    _ok(_fill_then_layer_norm, lambda: [torch.ones(1, 1, 1, 1)], backend)
    _ok(lambda a: (torch.full_like(a, 1e30).double() - 1e30, torch.full_like(a, 0.1).double()),
        lambda: [torch.ones(3)], backend)


def _write_through_split_of_expand(a):  # fuzz seed 81 #1779
    v2, v3 = torch.split(a.expand(2), [1, 1], 0)
    v2.view(1, -1).copy_(torch.tensor(0))
    return ()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [False, 1e30, float("inf")])
def test_write_through_a_split_of_an_expanded_input(value, backend):
    """A piece of ``split`` (or ``unbind``) of an expanded input is a non-overlapping view
    of overlapping memory, taken from the input with ``as_strided`` like other views:
    functionalization wrote through the expand as ``base + sum(new - base)`` (an error
    for bool, 0 for 1e30, NaN for inf; torch's ``aot_eager`` has it too)."""
    _ok(_write_through_split_of_expand, lambda: [torch.tensor(value)], backend)
    _ok(lambda a: (a.expand(2, 3).unbind(0)[1].fill_(2.0), a), lambda: [torch.tensor([value] * 3)],
        backend)


def _restride_after_mutation(c):  # fuzz seed 92 #4
    v2 = c[-1]
    v2.masked_fill_(v2 > 0, 7)
    c.as_strided_((1,), (2,), 1)
    c.masked_fill_(v2 > 0, 7)
    return ()


def _restride_after_fill(a):  # fuzz seed 81 #2963
    a.fill_(1e-40)
    a.as_strided_((1,), (2,), 1)
    a.mul_(2)
    return ()


def _as_strided_of_a_written_empty_view(a):  # fuzz seed 81 #3325
    v2 = a[1:]
    v2.fill_(1)
    return (v2.as_strided((1,), (1,), 0),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,make_inputs", [
    (_restride_after_mutation, lambda: [torch.tensor([2, 3, 4])[1:3:2]]),
    (_restride_after_fill, lambda: [torch.tensor([math.inf, 1.99], dtype=torch.bfloat16)[1:2]]),
    (_as_strided_of_a_written_empty_view, lambda: [torch.tensor([True])]),
], ids=["masked_fill_", "fill_", "empty-view"])
def test_as_strided_after_a_write_to_an_input_view(fn, make_inputs, backend):
    """``as_strided_`` of an input at an offset (its own element) after an in-place write:
    functionalization's new value was a one-element buffer read at offset 1; it is laid out
    in the input's strides and offset first, as for ``as_strided``. And the view that
    ``as_strided`` of a view was first taken from (then again from its root) is not
    lowered: of an empty intermediate it became an extern kernel reading nothing."""
    _ok(fn, make_inputs, backend)


def _as_strided_after_masked_write_through_split(a):  # fuzz seed 91 #468
    v0, v1 = torch.split(a, [2, 1], 0)
    v2 = v1.unsqueeze(2)
    v2[v2] = False
    v3 = v1.as_strided((3,), (2,), 1)
    return (torch.cat([v3, v3], 0),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_as_strided_of_a_split_piece_after_a_write(backend):
    """``as_strided`` of a ``split`` piece reads the input's storage: the piece (one of a
    multi-output view) is now known to the view rewrites, so the read is taken from the
    input (it read a value functionalization laid out elsewhere: all six bools wrong)."""
    _ok(_as_strided_after_masked_write_through_split,
        lambda: [torch.tensor([[False, True], [True, False], [False, False]])], backend)


def _atan2_by_layer_norm(d):  # fuzz seed 82 #447
    v1 = torch.cat([d, d], -2)
    return (torch.atan2(torch.nn.functional.layer_norm(v1, (3,)), v1),
            torch.nn.functional.layer_norm(d[:, :1] * 0, (1,)).signbit())


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_of_negative_zero_at_a_zero_mean_is_positive_zero(backend):
    """Eager's normalized zeros are +0 (x * rstd + bias); coil's (x - mean) * rstd was -0
    for x = -0 at a mean of +0, so atan2 by it gave -pi where eager gives pi."""
    _ok(_atan2_by_layer_norm, lambda: [torch.tensor([[-0.0, -2.0, 2.0]])], backend)


def _as_strided_then_write(a):  # fuzz seed 93 #358
    v1 = a.as_strided((3, 2), (0, 1), 2)
    a.mul_(2)
    return (torch.sum(v1), a.as_strided((3, 4), (0, 1), 0).sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_as_strided_view_read_after_a_write_to_its_input(backend):
    """An ``as_strided`` view of an input at storage offset 2, taken before ``mul_`` of the
    input and read after it: functionalization replayed it on the new value (offset 0) at
    offset 2, other elements; the value is laid out at the input's offset before such a
    read (one outside the input's elements runs the program eagerly)."""
    _ok(_as_strided_then_write,
        lambda: [torch.tensor([[0.5, -2.0], [-1.25, 2.5], [2.0, 0.25], [1.5, -2.0]],
                              dtype=torch.float64)[1:4]], backend)


def _view_after_a_write_through_mT(a):  # fuzz seed 83 #1591
    a.mT.masked_fill_(a.mT > 0, -3)
    return a.view(3, -1) * 2, a.view(-1)[1:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_of_an_input_written_through_its_transpose(backend):
    """``view`` of an input after ``masked_fill_`` through ``a.mT``: functionalization's
    value kept the transposed strides and refused the view (torch.compile's aot_eager
    fails the same way); the value is laid out in the input's strides and viewed again."""
    _ok(_view_after_a_write_through_mT,
        lambda: [torch.tensor([[0, 1, 5], [2, 8, 0]], dtype=torch.int64)], backend)


def _view_of_permuted(b):  # fuzz seed 95 #2671
    return (b.view(1, -1),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_eager_refuses_raises_its_error(backend):
    """``view(1, -1)`` of a (6, 1, 3) permute with strides (1, 1, 6): eager raises (no
    strides give it), torch's FakeTensor computed strides (6, 1), and the compiled graph
    returned storage order silently; the program now runs eagerly and raises eager's error."""
    r = check(_view_of_permuted, lambda: [torch.tensor([[[True], [False]] * 3] * 3).permute(1, 2, 0)], backend)
    assert r.outcome == "both_raise", f"{r.outcome} {r.kind}: {r.detail}"


def _bool_mul_(d):  # fuzz seed 97 #202
    d.mul_(2)
    return ()


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_op_whose_result_eager_cannot_cast_raises(backend):
    """``bool_tensor.mul_(2)``: eager refuses to cast the int64 result to bool; the
    decomposition cast it (torch.compile's aot_eager also runs it). The program now
    runs eagerly and raises eager's error."""
    r = check(_bool_mul_, lambda: [torch.tensor(False)], backend)
    assert r.outcome == "both_raise", f"{r.outcome} {r.kind}: {r.detail}"


def _float_minus_true(a):  # fuzz seed 99 #2532
    return (a - True, True - a)


@pytest.mark.parametrize("backend", BACKENDS)
def test_subtraction_with_a_bool_operand_raises(backend):
    """``float_tensor - True``: eager refuses subtraction with a bool; FakeTensor's sub
    accepts it, so the graph returned ``a - 1``. The program now runs eagerly and raises
    eager's error."""
    r = check(_float_minus_true, lambda: [torch.tensor(1.0)], backend)
    assert r.outcome == "both_raise", f"{r.outcome} {r.kind}: {r.detail}"


def _copysign_of_bf16_nan(a, b):  # fuzz seed 99 #656
    return (torch.copysign(a, b * 1),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_nan_keeps_its_sign_through_a_kernel(backend):
    """A bf16 NaN rounded from float32 inside a kernel: the Triton interpreter's patched
    fp32 -> bf16 cast (torch's vectorized conversion) gave 0xFFFF, a NaN with its sign bit
    set, and ``copysign`` returned -1 where eager returns 1."""
    r = check(_copysign_of_bf16_nan, lambda: [torch.tensor(1.0), torch.tensor(
        [float("nan"), 1.0, 2.0] * 3, dtype=torch.bfloat16)], backend)
    assert r.outcome == "ok", f"{r.outcome} {r.kind}: {r.detail}"


def _bf16_log_softmax_cat_float(a, b, c):  # fuzz seed 101 #1894
    return (torch.cat([a, torch.log_softmax(b - c, 0)], 0),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_result_rounded_on_either_side_of_a_midpoint_is_not_a_mismatch(backend):
    """A bf16 ``log_softmax`` concatenated with float32: the exact value -0.806683 lies
    just past the bf16 midpoint -0.806640625; coil rounds it to -0.80859375, eager's
    float32 error gave -0.8046875. The float32 output holds bf16 values one bf16 ulp
    apart: the comparator accepts that (``_one_narrow_ulp``), not a wider difference."""
    r = check(_bf16_log_softmax_cat_float, lambda: [
        torch.tensor([1.0]), torch.tensor(1.0), torch.tensor([1.0, 1.0, 0.0, -0.338], dtype=torch.bfloat16)],
        backend)
    assert r.outcome == "ok", f"{r.outcome} {r.kind}: {r.detail}"


def _contiguous_after_scatter_add_(a):  # fuzz seed 100 #5317
    a.scatter_add_(0, torch.zeros(1, 2, 3, 6, dtype=torch.int64), torch.zeros(1, 2, 3, 6, dtype=torch.int64))
    v0 = a.view(a.shape)
    return (v0, v0.contiguous())


@pytest.mark.parametrize("backend", BACKENDS)
def test_contiguous_of_a_permuted_input_after_scatter_add_is_a_copy(backend):
    r = check(_contiguous_after_scatter_add_, lambda: [torch.arange(72).reshape(2, 1, 6, 6).permute(1, 0, 3, 2)],
              backend)
    assert r.outcome == "ok", f"{r.outcome} {r.kind}: {r.detail}"


def _copysign_by_layer_norm(a):  # fuzz seed 102 #3793
    return (torch.copysign(torch.ones_like(a), torch.nn.functional.layer_norm(a, (9,))),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sign_of_a_nan_a_sum_made_is_not_compared(backend):
    """A row of -inf, inf and NaN normalized: eager's float32 sum met the NaNs in an order
    that gave +NaN, coil's kernels (C++ lanes, the interpreter's NumPy sum) -NaN, which
    ``copysign`` reads. IEEE 754 leaves that sign open (a GPU gives +NaN): the comparator
    accepts either sign by a computed NaN (tests/testing/test_fuzz.py)."""
    _ok(_copysign_by_layer_norm, lambda: [torch.tensor([[-math.inf, math.inf, math.nan] + [0.0] * 6])],
        backend)


def _fp16_index_add_past_the_max(a):  # fuzz seed 102 #2906
    a.index_add_(0, torch.tensor([0, 0, 1]), torch.full((3,), 40000.0, dtype=torch.float16))
    return (a,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp16_accumulation_past_the_max_is_inf(backend):
    """An fp16 ``index_add_`` whose sum passes 65504 (Triton: ``tl.atomic_add``): inf as
    eager and the GPU give; the interpreter raised OverflowError('overflow to signed inf')."""
    _ok(_fp16_index_add_past_the_max, lambda: [torch.tensor([1.0, 2.0], dtype=torch.float16)], backend)


_SCALAR_OPS = ["a + 70000.0", "70000.0 - a", "(a - 70000.0) + 70000.0", "torch.remainder(a, 70000.0)",
               "1e30 // a", "a > 70000.0", "a * 1e7", "a / 1e-7", "torch.div(a, 1e-7, rounding_mode='floor')"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("expr", _SCALAR_OPS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scalar_operands_of_reduced_float_ops_round_as_eager(backend, expr, dtype):
    """fuzz s201 #5477: ``1e30 // a`` on fp16 gave inf where eager gives NaN. Eager's CPU
    kernels convert a Python scalar to fp16 / bf16 first (1e30 -> inf), but the second
    operand of mul and the divisions, which stay float; coil kept every scalar in float."""
    big = 70000.0 if dtype == torch.float16 else 1e39
    fn = eval(f"lambda a: ({expr.replace('70000.0', repr(big))},)", {"torch": torch})
    _ok(fn, lambda: [torch.tensor([-10000.0, 2.0, 1e-3, math.inf], dtype=dtype)], backend)


def _stack_of_a_mean_twice(a):  # fuzz seed 202 #16952
    v = torch.mean(a, dtype=torch.float64)
    return (torch.stack([v, v]),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stack_of_one_value_twice_after_its_reduction(backend):
    """The C++ kernel computes ``acc / 2`` in two masked blocks (one per stacked copy);
    GCC 12's loop if-conversion with AVX-512 merged them into one division under the
    first block's mask, and the second copy read 0.0 (cpp_build.py, -fno-tree-loop-if-convert)."""
    _ok(_stack_of_a_mean_twice, lambda: [torch.tensor([-3, 4])], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_reduced_float_result_read_later_in_its_kernel_is_rounded(backend, dtype):
    """An fp16 ``nansum`` read by a later loop of the same kernel (the max and sum of a
    ``log_softmax`` of its ``remainder``) was the unrounded fp32 accumulator there while
    the stored, rounded value fed the final kernel: 8 fp16 ulps off (s207 #10039)."""
    import coil

    def fn(b):
        v0 = torch.nansum(b, dim=-2, keepdim=True)
        return torch.log_softmax(torch.remainder(v0, b), 1)
    b = torch.tensor([[[3.445, 1.0], [2.014, 1.0]]], dtype=dtype)
    coil.reset()
    got = coil.compile(fn, options={"cpu_backend": backend})(b)
    torch.testing.assert_close(got, fn(b), atol=5e-4 if dtype == torch.float16 else 4e-3, rtol=0)
    _ok(fn, lambda: [b.clone()], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["xor", "and", "eq16", "lt16"])
def test_comparisons_and_logical_ops_cast_to_the_common_dtype_first(backend, case):
    """Eager casts the operands of a comparison or logical op to their common dtype
    first: a float64 0-dim 6e-308 beside float32 is 0, so ``logical_xor`` of it and 1.0
    is True (s208 #593: coil tested the float64 value, False); a float32 0-dim 0.1 beside
    fp16 is fp16's 0.0999755859375, so it equals that fp16 element."""
    import coil

    x16 = torch.tensor([1.0, 2.0, 0.0999755859375, 0.1], dtype=torch.float16)
    tiny, x32 = torch.tensor(6.166478895540007e-308, dtype=torch.float64), torch.tensor([1.0, 0.0])
    fn, args = {"xor": (lambda a, b: torch.logical_xor(b, a), (x32, tiny)),
                "and": (lambda a, b: torch.logical_and(b, a), (x32, tiny)),
                "eq16": (lambda a, b: torch.eq(a, b), (x16, torch.tensor(0.1))),
                "lt16": (lambda a, b: a < b, (x16, torch.tensor(0.1)))}[case]
    coil.reset()
    assert torch.equal(coil.compile(fn, options={"cpu_backend": backend})(*args), fn(*args))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["fmod", "pow", "add", "rdiv", "atan2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_zero_dim_float_tensor_beside_fp16_is_a_scalar_rounded_as_eager(backend, op, dtype):
    """On the CPU eager reads a 0-dim tensor operand of fp16/bf16 ops as it reads a Python
    scalar: converted to fp16/bf16 (``fmod(x, torch.tensor(0.1))`` divides by
    0.0999755859375), except mul's and the divisions' second operand. coil kept the
    float32 value: fmod up to 0.1 off, pow and ``tensor(0.1) / x`` ulps off."""
    import coil

    fn = {"fmod": lambda a, b: torch.fmod(a, b), "pow": lambda a, b: a ** b, "add": lambda a, b: a + b,
          "rdiv": lambda a, b: b / a, "atan2": lambda a, b: torch.atan2(a, b)}[op]
    x, s = torch.linspace(-10, 10, 2001).to(dtype), torch.tensor(0.1)
    coil.reset()
    torch.testing.assert_close(coil.compile(fn, options={"cpu_backend": backend})(x, s), fn(x, s),
                               atol=0, rtol=0, equal_nan=True)


def _shifted_add(x):
    x[1:].add_(x[:-1])
    return x


def _add_transpose(x):
    x.add_(x.t())
    return x


def _masked_fill_by_itself(c):  # s210 #3393
    c.expand(1).masked_fill_(c, 7)
    return ()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, make", [(_shifted_add, lambda: [torch.arange(5.0)]),
                                      (_add_transpose, lambda: [torch.ones(3, 3)]),
                                      (_masked_fill_by_itself, lambda: [torch.tensor(False)])])
def test_an_in_place_op_whose_operand_partially_overlaps_it_raises_eagers_error(backend, fn, make):
    """Eager refuses an in-place op whose other operand shares part of the written tensor's
    memory (``x[1:].add_(x[:-1])``, ``x.add_(x.t())``); functionalization computed a value.
    Such a program now runs eagerly and raises eager's error; ``x.add_(x)`` still compiles."""
    r = check(fn, make, backend)
    assert r.outcome == "both_raise", (r.outcome, r.detail)
    _ok(lambda x: (x.add_(x),), lambda: [torch.arange(5.0)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_partial_overlap_of_symbolic_slices_raises_eagers_error(backend, capfd):
    """``x[1:] += x[:-1]`` under dynamic shapes computed a value where eager raises: the
    overlap check read static layouts only. Symbolic ranges are compared through the ShapeEnv
    (guards), so a size where the slices do not overlap (2) compiles and runs as eager."""
    def f(x):
        x[1:] += x[:-1]
        return x
    g = coil.compile(f, dynamic=True, options={"cpu_backend": backend})
    with pytest.raises(RuntimeError, match="single memory location"):
        g(torch.arange(6.0))
    assert "FX-traced" not in capfd.readouterr().err  # (the graph runs eagerly, quietly)
    torch.testing.assert_close(g(torch.arange(2.0)), f(torch.arange(2.0)))


def _write_through_as_strided_of_offset_input(a):
    v0 = a.as_strided((1, 1), (3, 2), 14)   # absolute offset 14: a starts at 9
    v0.copy_(torch.full((1, 1), 7.0))
    return (torch.max(v0),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_through_as_strided_of_an_input_at_a_storage_offset(backend):
    """s213 #1811: functionalization wrote the as_strided view back at its absolute offset into a
    value starting at 0, so the max read element 23 of the storage (-1.49), not the 7 written at 14.
    The program now runs eagerly (logged)."""
    _ok(_write_through_as_strided_of_offset_input,
        lambda: [torch.arange(27, dtype=torch.float32).reshape(3, 3, 3)[1:3:2]], backend)


def _min_dim_of_signed_zeros(a, b):
    v, _ = torch.min(a, dim=1)
    return (b / v,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_dim_value_is_the_first_of_tied_signed_zeros(backend):
    """s213 #7447: min(dim)'s value was tl.min's, either zero of a -0.0/0.0 tie; eager's is the element
    at the first index (-0.0), so b / v gave -inf, not inf. The value is now read at the index."""
    _ok(_min_dim_of_signed_zeros, lambda: [torch.tensor([[-0.0, 2.0, 0.0]]), torch.tensor(-4)], backend)
    _ok(lambda a: (*torch.max(a, 1, keepdim=True), *torch.min(a, 0)),
        lambda: [torch.tensor([[0.0, -0.0, 1.0], [math.nan, 2.0, math.nan], [-0.0, 0.0, -1.0]])], backend)


def _as_strided_write_after_index_put_of_transposed_input(a):
    a.index_put_((torch.tensor([2]),), torch.tensor(2.0, dtype=torch.float64))
    v = a.as_strided((1,), (2,), 6)
    v.mul_(1)
    return (a,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_as_strided_scatter_gets_eager_layout_of_computed_value(backend):
    """s214 #5389: index_put_ of a transposed input, then a write through an as_strided view. The
    extern as_strided_scatter got the index_put's value laid out contiguous (eager's keeps the input's
    transposed strides), so it wrote storage element 6 over a[2, 0] (2.0 became 0.0). Ops that read
    their first argument's storage now get it at eager's strides."""
    _ok(_as_strided_write_after_index_put_of_transposed_input,
        lambda: [torch.tensor([[1.0, 2, 3], [4, 5, 6], [0, 8, 9]], dtype=torch.float64).t()], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["gather", "index_select", "embedding", "cross_entropy"])
def test_negative_index_raises_where_eager_rejects_it(backend, op):
    """gather/index_select/embedding/nll_loss reject a negative index in eager. The Triton kernel
    wrapped it before its bounds check (a wrong label gave a loss) and embedding wrapped on both
    backends (fresh-user trial). The check now reads the index as given."""
    import torch.nn.functional as F
    f = {"gather": lambda x, i: x.gather(0, i), "index_select": lambda x, i: x.index_select(0, i),
         "embedding": lambda x, i: F.embedding(i, x[:, None]),
         "cross_entropy": lambda x, i: F.cross_entropy(x[:6].reshape(2, 3), i)}[op]
    x, i = torch.arange(7.0), torch.tensor([-1, 2])
    with pytest.raises((IndexError, RuntimeError)):
        f(x, i)
    with pytest.raises(IndexError):
        coil.compile(f, options={"cpu_backend": backend})(x, i)
    j = torch.tensor([1, 2])
    torch.testing.assert_close(coil.compile(f, options={"cpu_backend": backend})(x, j), f(x, j))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_alpha_of_reduced_float_add_rounds_as_eager(backend, dtype):
    """Eager's CPU ``add`` / ``sub`` convert ``alpha`` to fp16 / bf16 before the product
    (0.3 is 0.2998046875 in fp16); coil kept it in float and differed by an ulp on 16% of
    random fp16 elements. Eager's vectorized loop does that; its scalar tail (a tensor shorter
    than a vector) computes in fp16 arithmetic, so the values sit in 256 elements. Compared
    bit-exact on elements where a fused multiply-add does not matter."""
    a, b = torch.zeros(256, dtype=dtype), torch.zeros(256, dtype=dtype)
    a[:4] = torch.tensor([0.11981201171875, 0.79345703125, -0.34130859375, -0.58544921875])
    b[:4] = torch.tensor([-0.59619140625, -1.861328125, -1.009765625, 2.240234375])

    def fn(a, b):
        return torch.add(a, b, alpha=0.3), torch.sub(a, b, alpha=0.7)
    got = coil.compile(fn, options={"cpu_backend": backend})(a, b)
    for g, r in zip(got, fn(a, b)):
        assert torch.equal(g[:4], r[:4]), (g[:4], r[:4])


def _clamp_an_empty_slice_of_an_overlapping_restride(a):  # s216 #15681
    a.as_strided_((1, 4, 1), (0, 0, 2), 0)
    v5 = a[1:]
    v5.clamp_(min=2)
    return ()


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_through_a_view_of_an_overlapping_restride(backend):
    """The functional form of a write through an ``as_strided`` view whose elements share memory
    (stride 0) is an ``as_strided_scatter`` that ATen refuses ("more than one element of the
    written-to tensor refers to a single memory location"); eager wrote nothing (an empty slice)
    and ran. The scatter now writes one element per location."""
    _ok(_clamp_an_empty_slice_of_an_overlapping_restride, lambda: [torch.tensor(2)], backend)


def _restride_an_offset_input_then_write(a):  # s217 #392
    v0 = a.to(torch.float64)  # (a itself)
    v0.as_strided_((1,), (3,), 3)
    a.abs_()
    return (torch.sinh(a),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_restride_of_an_input_at_a_storage_offset_then_a_write(backend):
    """s217 #392: ``a[1:]`` restrided in place to absolute offset 3, then written: the graph took
    ``as_strided(..., 3)`` of the written value, which starts at 0 and has 3 elements, and read
    past it (a value of 1e-310). Such a program now runs eagerly (logged)."""
    _ok(_restride_an_offset_input_then_write,
        lambda: [torch.tensor([-2.28, 4.43, -0.89, 0.91], dtype=torch.float64)[1:4]], backend)


def _restride_a_strided_input(b):  # s302 #376
    v2 = b.to(torch.bfloat16)  # (b itself)
    v2.as_strided_((4, 1, 3), (0, 2, 0), 7)
    return ()


@pytest.mark.parametrize("backend", ["cpp_dynamic", "triton_dynamic"])
def test_restride_of_an_input_at_a_symbolic_storage_offset(backend):
    """s302 #376: under ``dynamic=True`` the input's storage offset is symbolic, so the
    offset check above did not see it and functionalization's ``setStorage`` failed; such a
    program runs eagerly too."""
    _ok(_restride_a_strided_input, lambda: [torch.tensor(
        [[2.0, 0.0, -2.0, 0.0, 0.0, 1.0, -3.0, -3.0]], dtype=torch.bfloat16)[:, 2:8:2]], backend)


def _restride_past_a_strided_view(a):  # s308 #1147
    a.as_strided_((3,), (0,), 5)
    return ()


@pytest.mark.parametrize("backend", ["cpp_dynamic", "triton_dynamic"])
def test_restride_past_a_strided_view_under_dynamic_shapes(backend):
    """s308 #1147: ``a[:, 0:6:2]`` (of 6 elements) restrided to offset 5: under ``dynamic=True``
    functionalization sizes the storage from the view's symbolic extent (5 elements) and
    ``setStorage`` failed; whether a restride ends past the storage is undecidable with
    symbolic sizes, so such a program runs eagerly. (With some hash seeds the guard on the view's base raised
    ``sources must not be empty for symbol`` in shape_guards: tests/capture/test_dynamic_view_input_base.py.)"""
    _ok(_restride_past_a_strided_view,
        lambda: [torch.tensor([[3, 0, 5, -4, -1, -1]], dtype=torch.int64)[:, 0:6:2]], backend)


def _add_through_an_expand_that_adds_a_dim(a):  # s302 #1981
    v3 = a.expand(1, -1, -1)
    v3.add_(-3)
    return (v3,)


@pytest.mark.parametrize("backend", ["cpp_dynamic", "triton_dynamic"])
def test_write_through_an_expand_adding_a_dim_under_dynamic_shapes(backend):
    """s302 #1981: ``a.expand(1, -1, -1).add_(-3)`` with an inf in ``a``: under ``dynamic=True``
    the expand was not re-expressed as a view (its sizes are symbolic), so functionalization
    wrote it back as ``base + (new - base)``: inf - inf, NaN in the output and the input."""
    _ok(_add_through_an_expand_that_adds_a_dim,
        lambda: [torch.tensor([[0.0, 1.0], [1.0, math.inf]])], backend)


def _read_below_a_written_slice(b, c):  # s312 #106
    b.copy_(c)
    return (b.as_strided((2,), (1,), 1) * 1,)


@pytest.mark.parametrize("backend", ["cpp_dynamic", "triton_dynamic"])
def test_as_strided_read_below_a_written_slice_under_dynamic_shapes(backend):
    """s312 #106: ``b`` is elements 2-3 of a 4-element storage, written, then read by ``as_strided`` at the absolute
    offset 1 (an old element and a new one). Under ``dynamic=True`` the check whether the read stays inside ``b``'s
    elements was skipped (symbolic layout), and the view was taken of functionalization's value of ``b``, which starts
    at 0: the new element and memory past the buffer. It is decided with guards now (the program runs eagerly)."""
    _ok(_read_below_a_written_slice, lambda: [torch.tensor([3.5, -1.5, 0.75, 0.5], dtype=torch.float64)[2:4],
                                              torch.tensor(1.0)], backend)


def _read_of_a_written_input_at_an_offset(a):  # s315 #543
    a.scatter_(0, torch.tensor([[[0, 0, 0]]]), torch.full((1, 1, 3), 1.0))
    return (a.as_strided((2, 4), (1, 2), 9) * 1,)


@pytest.mark.parametrize("backend", ["cpp_dynamic", "triton_dynamic", "aot_eager"])
def test_as_strided_read_of_a_written_input_at_a_symbolic_storage_offset(backend):
    """s315 #543: ``a`` starts at element 6 of its storage and is written; the ``as_strided`` read at offset 9 takes
    its value laid out at ``a``'s offset, which under ``dynamic=True`` is a symbol the wrapper could not bind (code
    generation fell back to the FX interpreter). There, and under coil's ``aot_eager``, the first ``as_strided`` node,
    of functionalization's value that starts at 0, was left in the graph dead and failed (``setStorage ... out of
    bounds``)."""
    _ok(_read_of_a_written_input_at_an_offset, lambda: [torch.arange(21.0).reshape(7, 1, 3)[2:7]], backend)
    _ok(lambda a: (_read_of_a_written_input_at_an_offset(a), ())[1],
        lambda: [torch.arange(21.0).reshape(7, 1, 3)[2:7]], backend)


def _read_of_a_scattered_transposed_input(x, idx, src):
    x.scatter_(0, idx, src)
    return (x.as_strided((2, 2), (1, 3), 1) * 1,)


@pytest.mark.parametrize("backend", ["cpp_dynamic", "triton_dynamic"])
def test_as_strided_read_of_a_scattered_transposed_input_under_dynamic_shapes(backend):
    """Functionalization's value of the written transposed ``x`` is contiguous (an out-of-place ``scatter``); the
    ``as_strided`` read took it in eager's strides only for static layouts, so under ``dynamic=True`` it read the
    elements of another layout (-1 for 1)."""
    _ok(_read_of_a_scattered_transposed_input, lambda: [torch.arange(12.0).reshape(4, 3).t(),
                                                        torch.tensor([[0, 1, 2, 0], [2, 0, 1, 1]]),
                                                        torch.full((2, 4), -1.0)], backend)


@pytest.mark.parametrize("dynamic", [False, True])
def test_as_strided_read_of_a_written_input_at_another_offset(dynamic):
    """Compiled for ``x[0:3]`` (the read at offset 1 holds new elements only), called with ``x[2:5]`` of the same
    size, where it reads an old element: the graph read the new value at 1 (storage offsets are not guarded). A call
    whose written input starts elsewhere runs eagerly."""
    f = coil.compile(_read_below_a_written_slice, dynamic=dynamic)
    for lo in (0, 2):
        x, y = torch.arange(8.0), torch.arange(8.0)
        assert torch.equal(f(x[lo:lo + 3], torch.tensor(9.0))[0], _read_below_a_written_slice(y[lo:lo + 3],
                                                                                              torch.tensor(9.0))[0])
        assert torch.equal(x, y)


def _read_past_a_view(a):  # s1027 #616
    return (a[:2].as_strided((1,), (1,), 2),)


def _read_of_an_expanded_input(b):  # s1027 #12
    return (b.as_strided((3, 4, 1), (3, 0, 3), 3).abs(),)


@pytest.mark.parametrize("backend", ["cpp", "cpp_dynamic", "triton_dynamic"])
def test_grad_of_an_as_strided_read_past_the_view_it_is_taken_of(backend):
    """s1027 #616/#836: ``a[:2].as_strided((1,), (1,), 2)`` reads ``a[2]``, not an element of ``a[:2]``: eager's
    gradient (as_strided's backward w.r.t. ``a[:2]``) does not reach it. The output, a view of ``a``, was rebuilt as
    ``as_strided`` of ``a`` itself, whose gradient does (0.3125 for 0). Such programs run eagerly."""
    _ok(_read_past_a_view, lambda: [torch.tensor([1.0, 2.0, 3.0])], backend + "+grad")


def test_grad_of_as_strided_of_an_expanded_input_under_dynamic_shapes():
    """s1027 #12: the backward of ``as_strided`` writes a zero-filled buffer of symbolic size and reads it with
    ``as_strided``: its layout check, decided under symbolic sizes, finds the read inside the buffer (running written
    tensors' symbolic as_strided reads eagerly failed there, an uncaught RunEagerly)."""
    _ok(_read_of_an_expanded_input, lambda: [torch.linspace(-2, 2, 12).reshape(6, 2, 1).expand(6, 2, 3)],
        "cpp_dynamic+grad")


# -- products summed: rounded first, as eager (no fused multiply-add) ----------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_product_added_is_rounded_first(backend):
    """The backward of ``b / b`` (``t / b + (-t) * ((b / b) / b)``) at ``b = -1.8951287e-38``: eager's two terms
    cancel to 0; g++ contracted the multiply and the add into one fused multiply-add, whose unrounded product left
    -3.2e29 (gradient fuzzer seed 1006 #412). The C++ kernels are built with ``-ffp-contract=off``."""
    def f(t, b):
        return (t / b + (-t) * ((b / b) / b),)

    args = [torch.tensor([0.6875, 0.6875, -0.3125]), torch.tensor([1.0, -1.8951287e-38, 3.3e-38])]
    out = coil.compile(f, options={"cpu_backend": backend})(*args)[0]
    assert torch.equal(out, f(*args)[0]), out


# -- linear interpolation as eager's weighted sum -------------------------------------

def _interpolate_a_padded_row(b):  # s228 #2211
    v0 = torch.nn.functional.pad(b, (1, 2), mode='constant')
    return (torch.nn.functional.interpolate(v0.reshape(1, 1, -1), scale_factor=3, mode='linear', align_corners=True),)


@pytest.mark.parametrize("backend", BACKENDS + ["cpp_dynamic"])
def test_linear_interpolation_is_a_weighted_sum(backend):
    """s228 #2211: torch's decomposition interpolated as ``a + (b - a) * t``, inf where ``b - a`` overflows
    (-1.5e38 to 2.8e38) and eager's ``a * (1 - t) + b * t`` gives -6.25e37. Under dynamic shapes bilinear too."""
    _ok(_interpolate_a_padded_row, lambda: [torch.tensor([[1.0, 1.0], [-1.5253234e+38, 2.8253388e+38]])], backend)
    if backend == "cpp_dynamic":  # the middle column: -1e38 + 1e38 (torch's: -2e38 + inf)
        x = torch.tensor([[-2e38, 2e38], [3e38, -3e38]]).reshape(1, 1, 2, 2)
        _ok(lambda x: (torch.nn.functional.interpolate(x, size=(2, 3), mode='bilinear', align_corners=True),),
            lambda: [x.clone()], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_interpolation_to_the_same_size_copies(backend):
    """``scale_factor=1.1`` of 5 elements keeps the size: eager takes ``x[i] * 1 + x[i] * 0``, torch's decomposition
    interpolated at the scale (0.8636 for 1.0)."""
    _ok(lambda x: (torch.nn.functional.interpolate(x, scale_factor=1.1, mode='linear'),),
        lambda: [torch.tensor([[[0.0, 1.0, 4.0, float("inf"), 16.0]]])], backend)


def _interpolate_by_three(a):  # s315 #432
    return (torch.nn.functional.interpolate(a.reshape(1, 1, -1), scale_factor=3, mode='linear', align_corners=False),)


@pytest.mark.parametrize("backend", BACKENDS + ["cpp_dynamic"])
def test_linear_interpolation_source_position_is_rounded_once(backend):
    """s315 #432: eager's float position of output 1 at ``scale_factor=3`` is ``fma(1/3, 1.5, -0.5)`` = 1.49e-8 (its
    kernels are built with FMA contraction), so 3.34e38 beside it weighs 4.98e30; coil took 0 (two roundings) and gave
    1.0. Double positions too, and eager's ``floorf`` rounds a double position to float before taking its row
    (0.9999999999999999 is row 1 at weight 0); each output is eager's bit for bit (one-hot rows give the weights)."""
    _ok(_interpolate_by_three, lambda: [torch.tensor([1.0, 3.3415702e+38])], backend)
    if backend == "cpp":
        import torch.nn.functional as F
        for dtype in (torch.float32, torch.float64):
            for n in (2, 3, 5):
                x = torch.eye(n, dtype=dtype).reshape(1, n, n)
                sizes = [dict(size=m) for m in (4, 6, 7, 9, 14, 21)]
                for kw in sizes + [dict(scale_factor=s) for s in (1.7, 3.0, 7.0)]:
                    for corners in (False, True):
                        f = coil.compile(lambda x: F.interpolate(x, mode="linear", align_corners=corners, **kw))
                        assert torch.equal(f(x), F.interpolate(x, mode="linear", align_corners=corners, **kw)), \
                            (dtype, n, kw, corners)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_bilinear_weights_stay_float_under_dynamic_shapes(dtype):
    """Campaign 73 (OpInfo reference inputs): eager's 1-d and 3-d linear kernels round an fp16/bf16 weight to the
    dtype, its 2-d (bilinear) kernel keeps it in float; the decomposition that ``dynamic=True`` uses rounded it for
    bilinear too, and half of the outputs were an ulp or more off (10 fp16 ulps near -0.35). Now all but a few (an
    ulp: eager's FMA contraction) are eager's bits."""
    import torch.nn.functional as F
    x = (torch.randn(1, 3, 17, 23, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    for kw in (dict(size=(9, 40)), dict(scale_factor=0.45), dict(scale_factor=1.7, align_corners=True)):
        f = lambda x: F.interpolate(x, mode="bilinear", **kw)  # noqa: E731
        for t in (x, x.contiguous(memory_format=torch.channels_last)):
            got, want = coil.compile(f, dynamic=True)(t), f(t)
            assert (got != want).double().mean() < 0.01, kw
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["reflect", "replicate", "interpolate", "max_pool1d"])
def test_dtypes_eager_refuses_for_padding_and_pooling(backend, op):
    """s228 #1978: ``F.pad(bool, mode='reflect')``, which eager refuses ("reflection_pad1d" not implemented for
    'Bool'), was computed; so were linear interpolation and ``max_pool1d`` of integers."""
    import torch.nn.functional as F
    f = {"reflect": lambda x: F.pad(x, (1, 2), mode="reflect"), "replicate": lambda x: F.pad(x, (1, 2), mode="replicate"),
         "interpolate": lambda x: F.interpolate(x.int(), scale_factor=2, mode="linear"),
         "max_pool1d": lambda x: F.max_pool1d(x.long(), 2)}[op]
    x = torch.tensor([[[True, False, True, True]]])
    with pytest.raises(NotImplementedError, match="not implemented for"):
        f(x)
    with pytest.raises(NotImplementedError, match="not implemented for"):
        coil.compile(f, options={"cpu_backend": backend})(x)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("mode,shape,kw", [
    ("linear", (1, 1, 1), dict(scale_factor=0.5, align_corners=True)),  # s232 #73
    ("linear", (1, 1, 3), dict(size=0)),
    ("bilinear", (1, 1, 3, 1), dict(scale_factor=0.5)),
    ("nearest", (1, 1, 3, 1), dict(scale_factor=0.5)),
    ("trilinear", (1, 1, 2, 2, 1), dict(scale_factor=0.5)),
    ("bicubic", (1, 1, 2, 2), dict(scale_factor=0.4)),
])
def test_interpolation_to_an_empty_size_raises_eagers_error(mode, shape, kw, dynamic):
    """s232 #73: ``interpolate(x.reshape(1, 1, -1), scale_factor=0.5, mode='linear')`` of one element: eager refuses an
    output size of 0, coil's decomposition (and under dynamic shapes those of bilinear, trilinear, nearest and bicubic)
    returned an empty tensor. Adaptive pooling (``area``) accepts it."""
    import torch.nn.functional as F
    f = lambda x: F.interpolate(x, mode=mode, **kw) * 1  # noqa: E731
    x = torch.ones(shape)
    with pytest.raises(RuntimeError, match="Input and output sizes should be greater than 0") as e:
        f(x)
    with pytest.raises(RuntimeError, match="Input and output sizes should be greater than 0") as c:
        coil.compile(f, dynamic=dynamic)(x)
    assert str(c.value).endswith(str(e.value))
    area = lambda x: F.interpolate(x, scale_factor=0.5, mode="area")  # noqa: E731
    assert coil.compile(area, dynamic=dynamic)(torch.ones(1, 1, 3, 1)).shape == area(torch.ones(1, 1, 3, 1)).shape


@pytest.mark.parametrize("backend", BACKENDS + ["cpp_dynamic"])
def test_nearest_2d_where_a_size_is_kept_or_doubled(backend):
    """Eager's 2-d nearest kernels take the index itself where a size is kept and ``i >> 1`` where it doubles;
    torch's decomposition took ``floor(i / scale)``: ``scale_factor=1.1`` of 5 rows read row 0 twice, ``2.3`` of 3
    read ``0, 0, 0, 1, 1, 2``."""
    _ok(lambda x: (torch.nn.functional.interpolate(x, scale_factor=1.1, mode="nearest"),
                   torch.nn.functional.interpolate(x[:, :, :3, :3], scale_factor=2.3, mode="nearest")),
        lambda: [torch.arange(25.0).reshape(1, 1, 5, 5)], backend)


# -- result layouts where torch's meta kernel is a Python reference (s232 #369) ----

_EAGER_LAYOUT = {"floor_divide": torch.floor_divide, "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
                 "copysign": torch.copysign, "xlogy": torch.xlogy, "xlog1py": torch.special.xlog1py,
                 "heaviside": torch.heaviside, "logaddexp": torch.logaddexp, "logical_and": torch.logical_and}


@pytest.mark.parametrize("backend", BACKENDS + ["cpp_dynamic"])
def test_view_of_floor_divide_of_a_permuted_input(backend):
    """Eager lays ``floor_divide(a, b)`` out as its arguments (TensorIterator): strides (4, 2, 1); torch's meta kernel,
    a decomposition, gave (2, 4, 1) and the ``view`` raised at capture (fuzz s232 #369)."""
    _ok(lambda a, b: (torch.floor_divide(a, b).view(2, -1),),
        lambda: [torch.ones(2, 2, 1), torch.ones(2, 2, 2).permute(1, 0, 2)], backend)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("op", sorted(_EAGER_LAYOUT))
def test_results_have_eagers_strides(op, dynamic):
    """Those ops' results (and ``heaviside`` of a (4, 1) and a transposed (4, 3): eager's column-major) have the
    strides eager gives them, under symbolic shapes too."""
    f = _EAGER_LAYOUT[op]
    for a, b in [(torch.ones(2, 2, 1), torch.ones(2, 2, 2).permute(1, 0, 2)), (torch.ones(4, 1), torch.ones(3, 4).t())]:
        coil.reset()
        assert coil.compile(lambda a, b: f(a, b) + 0, dynamic=dynamic)(a, b).stride() == f(a, b).stride()


def test_floor_division_by_a_symbolic_float_compiles_once():
    """The same ops with a symbolic float (``dynamic=True``): a layout kernel that fake tensors ran through the C++
    dispatcher failed there (its ``expand`` refuses symbolic sizes), and the AOT trace baked ``b`` in: a compile per
    value."""
    from coil.capture.frame import stats
    fn = lambda a, b: torch.div(a, b, rounding_mode="floor")  # noqa: E731
    coil.reset()
    c, x = coil.compile(fn, dynamic=True), torch.randn(3, 4).t()
    for b in (2.5, 3.5, 0.7):
        assert torch.equal(c(x, b), fn(x, b))
    assert stats["recompiles"] == 0


@pytest.mark.parametrize("backend", ["cpp", "cpp_dynamic"])
def test_write_through_a_dtype_view_after_a_graph_break(backend):
    """fuzz s251 #414: ``v0 = a.view(torch.int32); v0[v0 > 0] = 2`` breaks the graph (a 0-d boolean mask), and the next
    graph gets ``a`` and ``v0``, one storage in two dtypes, and writes one: no synthetic base can hold both, and the
    compile was refused (CoilError) where eager runs. That graph now runs eagerly, as such calls of a compiled one do."""
    def fn(a):
        v0 = a.view(torch.int32)
        v0[v0 > 0] = 2
        v0.view(torch.float32).div_(2.0)
        return ()
    _ok(fn, lambda: [torch.tensor(-1.0)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_into_a_zero_dim_tensor(backend):
    """``scatter``/``scatter_add`` of a 0-d tensor (``min(b, dim=-1)``'s backward on a 0-d ``b``): the lowering indexed
    the size of dim -1 of no dims (IndexError) and the graph ran in the FX interpreter, warned. It runs the ATen op."""
    def f(x, i, s):
        return x.scatter(-1, i, s), x.scatter_add(0, i, s), x.scatter(0, i, 2.5)
    _ok(f, lambda: [torch.tensor(1.5), torch.tensor(0), torch.tensor(-2.0)], backend)


@pytest.mark.parametrize("backend", ["cpp_dynamic", "triton_dynamic", "cpp_dynamic+grad"])
def test_dropout_that_draws_nothing_is_its_input_under_dynamic_shapes(backend):
    """Probe beside fuzz seed 1055: eager's ``F.dropout`` in eval mode (or of p = 0) returns its input itself; under
    ``dynamic=True`` torch's Python-dispatcher kernel traced a clone, so ``v.add_(1)`` never reached ``a`` and the
    returned ``F.dropout(a, 0.0)`` was no view of ``a``."""
    def fn(a):
        v = torch.nn.functional.dropout(a, 0.3, training=False)
        v.add_(1)
        return a, torch.nn.functional.dropout(a, 0.0)
    _ok(fn, lambda: [torch.tensor([[-5.0, 5.0, 2.5], [1.0, 7.0, -2.0]])], backend)
