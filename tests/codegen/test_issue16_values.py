"""Silent wrong values in lowering and code generation (issue 16), each with its smallest
input, checked against eager through both CPU kernel backends (C++ and Triton's
interpreter).

- reductions over one element (0-d input, a size-1 dim) returned the raw element
  where the reduction converts it (``any`` of -3 is True);
- ``any`` of a uint8 tensor is uint8 in eager (was bool);
- var/std/layer_norm statistics: float64 on CPU, as eager's CPU var/std kernels
  (``std`` of values near 1e35 was inf; float32 ``layer_norm`` of values near 1e30 gave
  zeros: it now matches float64, where eager's CPU kernel gives NaN, docs/ir.md
  "Numerics");
- ``var``/``std`` of a 0-d tensor over ``dim=0`` failed to compile.
"""
import pytest
import torch
import torch.nn.functional as F

import coil
from coil.config import patch
from coil.testing import assert_same_as_eager

BACKENDS = ["cpp", "triton"]


def same(fn, *args, backend, **kw):
    """assert_same_as_eager with the CPU kernel backend ``backend``."""
    coil.reset()
    with patch(cpu_backend=backend):
        return assert_same_as_eager(fn, args, **kw)


def compiled(fn, *args, backend):
    coil.reset()
    return coil.compile(fn, options={"cpu_backend": backend})(*args)


ONE_ELEMENT = {
    "any_size1_dim": (lambda t: torch.any(t, 2).float(), torch.tensor([[[-3]], [[2]]])),
    "any_0d": (lambda t: torch.any(t).double(), torch.tensor(0.5)),
    "any_0d_dim": (lambda t: torch.any(t, 0).int(), torch.tensor(-2)),
    "any_one_elem": (lambda t: t.any().float(), torch.tensor([7])),
    "any_keepdim": (lambda t: t.any(1, keepdim=True).float(), torch.tensor([[0.0], [0.25]])),
    "all_size1": (lambda t: t.all(1).float(), torch.tensor([[-3], [0]])),
    "any_bool_size1": (lambda t: t.any(0), torch.tensor([True, False]).view(1, 2)),
    "sum_bool_size1": (lambda t: (t > 0).sum(1), torch.tensor([[-1.0], [2.0]])),
    "prod_size1": (lambda t: t.prod(1), torch.tensor([[3], [-2]], dtype=torch.int8)),
    "amax_bool_size1": (lambda t: (t > 0).amax(1).float(), torch.tensor([[-1.0], [2.0]])),
    "argmax_size1": (lambda t: t.argmax(1), torch.tensor([[5.0], [-1.0]])),
    "count_nonzero_size1": (lambda t: torch.count_nonzero(t, 1), torch.tensor([[-0.5], [0.0]])),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(ONE_ELEMENT))
def test_reduction_over_one_element(name, backend):
    fn, x = ONE_ELEMENT[name]
    same(fn, x, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["any", "all"])
def test_any_all_uint8_keep_uint8(op, backend):
    x = torch.tensor([[0, 3], [0, 0], [1, 2]], dtype=torch.uint8)
    same(lambda t: getattr(t, op)(1), x, backend=backend)
    same(lambda t: getattr(t, op)(), x, backend=backend)
    same(lambda t: getattr(t, op)(1), x[:, :1], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_std_of_values_whose_squares_overflow(backend):
    x = torch.full((3, 4), 80.)
    same(lambda t: torch.std(torch.cosh(t + torch.arange(4.)), 1), x, backend=backend)
    same(lambda t: torch.std_mean(t * 1e20, 1), torch.randn(3, 5), backend=backend)
    # the variance itself is beyond float32's range: inf, as eager
    same(lambda t: torch.var(t * 1e20, 1), torch.randn(3, 5), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_var_std_of_0d_over_dim0(backend):
    x = torch.tensor(1.5)
    same(lambda t: torch.std(t, 0, correction=0), x, backend=backend)
    same(lambda t: torch.var_mean(t, 0, correction=0), x, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_of_huge_float32_matches_float64(backend):
    """Eager's CPU float32 kernel gives NaN here; coil follows float64 (docs/ir.md)."""
    torch.manual_seed(0)
    x = torch.randn(4, 8) * 1e30
    w, b = torch.randn(8), torch.randn(8)
    out = compiled(lambda t: F.layer_norm(t, (8,), w, b), x, backend=backend)
    ref = F.layer_norm(x.double(), (8,), w.double(), b.double())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    # ordinary values still agree with eager, forward and backward
    same(lambda t: F.layer_norm(t, (8,), w, b), torch.randn(4, 8, requires_grad=True),
         backend=backend, check_grads=True)


READ_BEFORE_REALIZED = {
    # the cat's body loaded y's buffer, realized later as a graph output, and ran
    # before it (UnboundLocalError: bufN in the wrapper)
    "cat_and_operand_returned": lambda x: (lambda y: (torch.cat([y, x]), y))(x * 2),
    "stack_and_operand_returned": lambda x: (lambda y: (torch.stack([y, x]), y))(x.sin()),
    "cat_three_returned": lambda x: (lambda y, z: (torch.cat([z, y, x]), y, z))(x * 2, x - 1),
    "cat_then_mm": lambda x: (lambda y: (torch.cat([y, x]) @ x.t(), y))(x * 2),
    "cat_half": lambda x: (lambda y: (torch.cat([y, x.half()]), y))(x.half() * 2),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(READ_BEFORE_REALIZED))
def test_buffer_read_by_a_body_made_before_it_was_realized(name, backend):
    same(READ_BEFORE_REALIZED[name], torch.randn(4, 3), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prod_partial_products_overflow_and_underflow(backend):
    """Eager gives inf here (its own order overflows; x.repeat(4).prod() is NaN in eager);
    coil multiplies float32 in float64 on CPU and gives the product rounded to float32
    (2.0, 4.0), not NaN."""
    e = torch.tensor([100, -100, 100, -100, 100, 100, -100, -100, 90, 90, -90, -90,
                      80, 80, -80, -80, 1], dtype=torch.int32)
    for fn in (lambda t: (2.0 ** t).prod(0), lambda t: (2.0 ** t).repeat(2).prod(),
               lambda t: (2.0 ** t).view(1, -1).expand(3, -1).prod(1, keepdim=True)):
        out = compiled(fn, e, backend=backend)
        truth = fn(e.double()).float()  # 2.0 ** e and its products are exact in float64
        assert out.dtype == torch.float32 and out.shape == truth.shape
        torch.testing.assert_close(out, truth)
    # ordinary products agree with eager (float and int dtypes)
    same(lambda t: t.prod(1), torch.randn(5, 37), backend=backend)
    same(lambda t: t.prod(), torch.randint(-3, 4, (9,), dtype=torch.int32), backend=backend)
    same(lambda t: t.prod(0), torch.randn(6, 3).bfloat16(), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [8, 64])
def test_half_layer_norm_into_cat(rows, backend):
    """Reported as values of magnitude 1.001 (an fp16-rounded intermediate) on 8 rows;
    a layer_norm over 2 elements is within [-1, 1]."""
    torch.manual_seed(0)
    fn = lambda x: (lambda v: torch.cat([v, v]))(F.layer_norm(x.half(), (2,)))
    out = same(fn, torch.randn(rows, 2), backend=backend)
    assert out.abs().max().item() <= 1.0


LOW_PRECISION_CONVERTED = {
    # an fp16/bf16 value computed in a fused body is float32 until stored; an explicit
    # conversion takes the rounded value, as eager
    "half_overflow_then_float": (lambda x: (x.half() * 2).float(), torch.tensor([65504., 1.5])),
    "half_underflow_then_bool": (lambda x: (x.half() * 1e-8).bool(), torch.tensor([1.0, 10.0])),
    "bf16_rounding_then_float": (lambda x: (x.bfloat16() + 1e-3).float() - x, torch.tensor([1.0, 2.0])),
    "bf16_then_double": (lambda x: (x.bfloat16() * 3).double(), torch.tensor([0.1, 7.7])),
    "half_then_int": (lambda x: (x.half() * 3).int(), torch.tensor([0.99975586, 1.6665])),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(LOW_PRECISION_CONVERTED))
def test_conversion_of_a_computed_low_precision_value(name, backend):
    fn, x = LOW_PRECISION_CONVERTED[name]
    same(fn, x, backend=backend, atol=0, rtol=0)


SIGNED_ZERO = {
    "tanh": lambda x: torch.tanh(x),
    "sum_over_one": lambda x: x.view(-1, 1).sum(1),
    "mean_over_one": lambda x: x.view(-1, 1).mean(1),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SIGNED_ZERO))
def test_signed_zero(name, backend):
    """tanh(-0.0) is -0.0; a sum of the single element -0.0 is +0.0 (0 + -0)."""
    x = torch.tensor([-0.0, 0.0, -2.0, float("nan")])
    out, ref = compiled(SIGNED_ZERO[name], x, backend=backend), SIGNED_ZERO[name](x)
    torch.testing.assert_close(out, ref, equal_nan=True)
    assert torch.equal(torch.signbit(out), torch.signbit(ref)), (out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_of_nearly_equal_large_values_matches_float64(backend):
    """Rows of 1e4 + 0.01 * randn: eager's float32 kernel is 0.1 off; coil's float64
    statistics with the mean split into a float32 head and tail are within 1e-6."""
    torch.manual_seed(0)
    x = torch.randn(64, 3) * 0.01 + 1e4
    out = compiled(lambda t: F.layer_norm(t, (3,)), x, backend=backend)
    ref = F.layer_norm(x.double(), (3,))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


REDUCTION_DTYPE_ARG = {
    # dtype= converts the input first: fp16-rounded elements, not float32 ones
    "sum_fp16_rounds_elements": (lambda t: t.sum(dtype=torch.float16), torch.full((1000,), 1.0004)),
    "sum_fp16_overflowing_elements": (lambda t: t.sum(dtype=torch.float16), torch.tensor([7e4, -7e4, 1.0])),
    "sum_fp16_of_int": (lambda t: t.sum(0, dtype=torch.float16), torch.tensor([2049, 2051, 3])),
    "sum_fp16_over_one": (lambda t: t.view(1, 3).sum(0, dtype=torch.float16), torch.tensor([7e4, 1.0004, 1.0])),
    "nansum_fp16": (lambda t: torch.nansum(t, dtype=torch.float16), torch.full((1000,), 1.0004)),
    # mean(dtype=) does not: eager averages in float32 and rounds the mean
    "mean_fp16": (lambda t: t.mean(dtype=torch.float16), torch.tensor([7e4, -7e4, 1.0])),
    "prod_bf16": (lambda t: t.prod(dtype=torch.bfloat16), torch.tensor([1.004, 1.004, 3.0])),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(REDUCTION_DTYPE_ARG))
def test_reduction_dtype_argument_converts_the_input(name, backend):
    fn, x = REDUCTION_DTYPE_ARG[name]
    out, ref = compiled(fn, x, backend=backend), fn(x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_of_a_computed_half_value_into_float(backend):
    """``y[:, 0] = x.half() * 2`` (aten.copy into float32) stores the fp16-rounded value."""
    def fn(x):
        y = torch.zeros(2, 3)
        y[:, 0] = x.half() * 2
        return y
    same(fn, torch.tensor([65504., 1.0001]), backend=backend, atol=0, rtol=0)
