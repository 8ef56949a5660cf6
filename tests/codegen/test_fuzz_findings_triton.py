"""Smallest inputs of fuzzer findings (docs/fuzzing.md) in accumulating scatters, the
Triton backend's loads and comparisons, and the order of multi-dim reductions, each
checked against eager through ``coil.bench.fuzz.check`` on both CPU kernel backends."""
import pytest
import torch

from coil.bench.fuzz import check

BACKENDS = ["cpp", "triton"]
_SMALL = [torch.bool, torch.int8, torch.uint8, torch.int16, torch.bfloat16]


def _ok(fn, make_inputs, backend):
    r = check(fn, make_inputs, backend)
    assert r.outcome == "ok", f"{r.outcome} {r.kind}: {r.detail}"


# -- accumulating scatters with duplicate indices ----------------------------------

def _index_add_constant_index(a, c):
    # the destination index folds to the constant 0 (a dim of size 1): three adds still
    v1 = a.view(1, -1)
    v1.index_add_(0, torch.tensor([0, 0, 0]), c.expand((3, 1)).to(torch.int64))
    return (a.reshape(1, -1),)


def _index_put_constant_index(a, v):
    return (a.index_put((torch.tensor([0, 0, 0]),), v, accumulate=True),)


def _index_put_dups(a, v):
    return (a.index_put((torch.tensor([0, 2, 0, 0, 1]),), v, accumulate=True),)


def _scatter_add_dups(a, v):
    return (torch.scatter_add(a, 1, torch.tensor([[0, 0, 0], [1, 1, 3], [2, 2, 2]]), v),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_add_constant_index(backend):
    _ok(_index_add_constant_index, lambda: [torch.tensor(0), torch.tensor(1.0)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int64] + _SMALL,
                         ids=str)
def test_accumulate_duplicate_indices(dtype, backend):
    _ok(_index_put_constant_index,
        lambda: [torch.tensor([1], dtype=dtype), torch.tensor(1, dtype=dtype)], backend)
    _ok(_index_put_dups,
        lambda: [torch.zeros(3, 4, dtype=dtype), torch.arange(20).reshape(5, 4).to(dtype)], backend)
    _ok(_scatter_add_dups,
        lambda: [torch.zeros(3, 4, dtype=dtype), torch.ones(3, 3, dtype=dtype)], backend)


def _index_add_wraps(a, i, v):
    return (a.index_add(0, i, v),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", _SMALL, ids=str)
def test_accumulate_small_dtypes_wrap(dtype, backend):
    # Triton adds bool / 8- and 16-bit ints atomically in int32 (bf16 in fp32): the sum
    # converted back wraps (int8 100 + 100 + 100 is 44) also where a reader is fused
    _ok(_index_add_wraps, lambda: [torch.tensor([100, 0, 1]).to(dtype), torch.tensor([0, 0, 2, 0]),
                                   torch.tensor([100, 1, 0, 100]).to(dtype)], backend)

    def fused_reader(a, i, v):
        return (a.index_add(0, i, v).to(torch.int64) * 3,)
    _ok(fused_reader, lambda: [torch.tensor([100, 0, 1]).to(dtype), torch.tensor([0, 0, 2, 0]),
                               torch.tensor([100, 1, 0, 100]).to(dtype)], backend)


def _scatter_add_bool_then_mean(a):
    # s6 #496: the widened (int32) scatter result read by a fused mean was not bool
    v0 = torch.ge(a, a)
    v2 = torch.scatter_add(v0, 1, torch.tensor([[2, 1, 0], [2, 2, 1]]), v0[:, :3])
    return (torch.mean(v2, dim=1, dtype=torch.float64),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_add_bool_read_by_reduction(backend):
    _ok(_scatter_add_bool_then_mean, lambda: [torch.ones(2, 6)], backend)


# -- Triton: a scalar address under a block mask; scalar comparisons --------------

def _scatter_add_stacked_slice(c):
    # s6 #16: a constant-address load under a constant [1] mask
    v0 = c[5:7]
    v3 = torch.stack([v0, v0], 1)
    return (torch.scatter_add(v3, 1, torch.tensor([[0]]), v3),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalar_load_under_block_mask(backend):
    _ok(_scatter_add_stacked_slice, lambda: [torch.tensor([2.504], dtype=torch.float16).expand(6)],
        backend)


def _floor_divide_bool(a):
    # s6 #13: (x != 0.0) of a scalar x, and-ed with a [1] block (the interpreter gave
    # scalar comparisons the operands' dtype: splatting one made a float block)
    return (torch.floor_divide(torch.isinf(a), 1.0),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_floor_divide_of_bool(backend):
    _ok(_floor_divide_bool, lambda: [torch.tensor(5)], backend)


# -- the order of a reduction over several dims -----------------------------------

def _sum(a):
    return (torch.sum(a),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sum_in_memory_order_near_max(backend):
    # s6 #209: summed in logical order, -8e307 + -1.7e308 overflowed to -inf first
    _ok(_sum, lambda: [torch.tensor([[1.5018690360226765e+308, 8.716578595142002e-308],
                                     [-8.018796291968938e+307, -1.737489557929144e+308]],
                                    dtype=torch.float64).t()], backend)


def _argmax_dims(a):
    return (torch.argmax(a), a.sum((0, 2)), a.amax((0, 1)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_permuted_reductions(backend):
    # reduced dims iterate in memory order; argmax still counts in logical order
    _ok(_argmax_dims, lambda: [torch.tensor([3, 1, 3, 0, 2, 3] * 4, dtype=torch.float32)
                               .reshape(2, 3, 4).permute(2, 0, 1)], backend)


# -- out-of-range indirect indices ------------------------------------------------

def _index_put_out_of_range(a, i):
    return (a.index_put((i,), torch.tensor(7.0), accumulate=True), a[i])


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_index_raises(backend):
    # the Triton interpreter ran tl.device_assert only in debug mode: the store at index
    # 5 of a 2-element tensor went outside it (heap corruption of the fuzzer, s3 #113's
    # minimization); now the kernel raises before the access, as eager and the C++ do,
    # and the same error: coil.exc.KernelIndexError, not in Triton's InterpreterError
    r = check(_index_put_out_of_range, lambda: [torch.zeros(2), torch.tensor([0, 5])], backend)
    assert (r.outcome, r.kind) == ("both_raise", "KernelIndexError"), f"{r.outcome} {r.kind}: {r.detail}"


# -- operations on constants only; unsigned operands beside negative literals -----

def _int_pow(a):
    # s21 #271: _pow_int compared a uint8 base with -1 ("unsigned tensor and negative
    # scalar", raised by Triton's front end: the GPU compile fails too)
    return (a ** a,)


def _sub_alpha_wraps(a):
    # 2 * alpha folded to the Python expression (2 * 253) in tl.full(..., tl.uint8): 506
    # is out of range; eager wraps (a + 6)
    return (torch.sub(a, 2, alpha=-3),)


def _pow_of_constants(a):
    # s22 #1298: argmin of a 0-d tensor is the constant 0; 0 ** 0 was emitted as
    # tl.full([1], _pow_int(tmp0, tmp0), ...), a splat of a block
    v0 = torch.argmin(a)
    return (v0 ** v0,)


def _gelu_of_constant(a):
    # s22 #2216: gelu of zeros is _ndtr of a constant, in tl.full as well
    return (torch.nn.functional.gelu(torch.zeros_like(a, dtype=torch.float64)),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_int_pow, _sub_alpha_wraps], ids=lambda f: f.__name__)
def test_uint8_arithmetic_wraps(fn, backend):
    _ok(fn, lambda: [torch.tensor([0, 1, 9, 200, 255], dtype=torch.uint8)], backend)


def _std_of_one_element(a):
    # s22 #1101: std of one element (nan), nansum, argmax of the 0-d result
    return (torch.signbit(torch.argmax(torch.nansum(torch.std(a.float())))),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_pow_of_constants, _gelu_of_constant, _std_of_one_element],
                         ids=lambda f: f.__name__)
def test_ops_on_constants(fn, backend):
    _ok(fn, lambda: [torch.tensor(2, dtype=torch.int32)], backend)


def _pow_constant_base_summed(a):
    # s21 #378: libdevice.pow(tl.full([1, 1], -3.0), x) in a reduction; the interpreter's
    # libdevice shim gave the result the first argument's [1, 1] type over x's data (a
    # GPU's libdevice calls broadcast their arguments: interpreter-only)
    return (torch.sum((-3.0) ** a, dim=1), torch.atan2(torch.tensor(1.0), a).sum(1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_libdevice_constant_first_argument(backend):
    _ok(_pow_constant_base_summed, lambda: [torch.tensor([[1.0, 2.0, -0.5], [0.0, 3.0, 2.5]])], backend)


# -- casts of constants; bf16 subnormals ------------------------------------------

def _float_const_through_int(a):
    # s31 #1450: the cast of the constant 2.5 to int64 printed 2 but kept 2.5 as the
    # constant, so the cast back to float64 gave 2.5 (eager 2.0)
    v1 = torch.full((3, 1), 2.5).to(torch.int64)
    return (torch.mean(v1, dtype=torch.float64), v1.to(torch.float32) + a,
            torch.full((2,), 70000.0).half().float() - a, torch.full((2,), 0.1).bfloat16().float() + a,
            torch.full((2,), 300).to(torch.uint8) + a)


@pytest.mark.parametrize("backend", BACKENDS)
def test_casts_of_constants_round_like_eager(backend):
    _ok(_float_const_through_int, lambda: [torch.tensor([0.0, 1.0])], backend)


def _reciprocal(a):
    return (torch.reciprocal(a), a.float())


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_subnormal_loads(backend):
    # s31 #1730: the interpreter converted the bf16 subnormal 4.04e-39 to fp32 as
    # 4.41e-39 (interpreter-only: a GPU shifts the 16 bits up, which coil's patch does)
    _ok(_reciprocal, lambda: [torch.tensor([1.0, 4.04e-39, -1e-40, 9.2e-41], dtype=torch.bfloat16)],
        backend)


# -- bitwise ops of floats raise as in eager ---------------------------------------

def _xor_float(a):
    return (a ^ 2.5,)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [lambda: [torch.empty(0)], lambda: [torch.ones(2)]], ids=["empty", "two"])
def test_bitwise_op_of_floats_raises(make, backend):
    # s32 #2487: the lowering emitted float ^ 2.5 (an empty tensor raised nothing; a
    # Triton kernel of it does not compile for a GPU, s31 #20); eager raises
    r = check(_xor_float, make, backend)
    assert r.outcome == "both_raise", f"{r.outcome} {r.kind}: {r.detail}"


def _cat_of_subnormal_fill(a, b):
    # s33 #395: tl.where(m, 1e-40, 0.0): Triton types a Python float below fp32's normal
    # range as fp64, so the kernel computed in fp64 (and the interpreter's fp64 -> bf16
    # store gave garbage); the constant is now a tl.full(..., tl.float32)
    return (torch.cat([torch.full_like(b, 1e-40), a, b], 1),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_subnormal_fp32_constant(dtype, backend):
    _ok(_cat_of_subnormal_fill, lambda: [torch.ones(4, 1, dtype=torch.int64), torch.ones(4, 1, dtype=dtype)],
        backend)


# -- a where of two constants --------------------------------------------------------

def _where_of_filled_uint8(a):  # fuzz seed 104 #2584
    a.fill_(0)
    return (torch.where(a != -3, a, a) // 1,)


def _where_of_int32_max(a):
    return (torch.where(a > 0, torch.full_like(a, 2147483647), 0) + 1,)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, make_inputs", [
    (_where_of_filled_uint8, lambda: [torch.tensor(3, dtype=torch.uint8)]),
    (_where_of_int32_max, lambda: [torch.tensor([1, -1])])])
def test_where_of_two_constants_keeps_their_dtype(fn, make_inputs, backend):
    """``tl.where(mask, 0, 0)``: Triton types the two Python literals int32, not the
    constants' uint8 (``// 1`` of it refused: different signedness) or int64 (2**31 - 1
    plus 1 wrapped to -2**31). Constants on both sides are now ``tl.full`` of their dtype."""
    _ok(fn, make_inputs, backend)


def test_interpreter_rand_is_below_one():
    """FINDINGS_76 #5: the Triton interpreter's rand shim drew float64 numbers and cast them to float32, rounding
    those in [1 - 2**-25, 1) up to 1.0 (the draws at these offsets for seed 0); eager's rand is in [0, 1)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    from coil.runtime.triton_libdevice import _make_rng_shim
    offsets = np.array([14817372, 47307256], dtype=np.int64)
    off = tl.core.tensor(TensorHandle(offsets, tl.int64), tl.block_type(tl.int64, [2]))
    assert (_make_rng_shim().rand(0, off).handle.data < 1.0).all()
