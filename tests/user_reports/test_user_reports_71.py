"""Regressions from new-user trial 71 (FINDINGS_71.md): the C++ backend's fused reductions, casts and special values;
compared with eager.
"""

import pytest
import torch

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; a silent wrong value): an integer tensor or a Python int beside a float16 / bfloat16 tensor was
# converted straight to float32; eager converts it to the half result dtype first (int64 257 + bf16 0.5 is 256, an
# int64 70000 is inf in float16). Python scalars only on the CPU (CUDA's kernels keep them in float).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["add", "sub", "rsub", "div", "mul", "add_", "addcmul", "scalar_add", "scalar_sub"])
def test_an_integer_operand_is_rounded_to_the_half_dtype_first(coil_reset, dtype, op):
    i = torch.tensor([257, 259, 2049, 626, 70000, -4097])
    h = torch.tensor([0.5, 1.0, 0.0, -0.5, 1.0, 3.0], dtype=dtype)
    f = {"add": lambda i, h: i + h, "sub": lambda i, h: i - h, "rsub": lambda i, h: h - i,
         "div": lambda i, h: i / (h + 2), "mul": lambda i, h: i * h, "add_": lambda i, h: h.clone().add_(i),
         "addcmul": lambda i, h: torch.addcmul(h, i, i), "scalar_add": lambda i, h: h + 2049 + i[:1] * 0,
         "scalar_sub": lambda i, h: 70001 - h}[op]
    out, ref = coil.compile(f)(i, h), f(i, h)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, equal_nan=True, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; a silent wrong value): float64 -> uint8 of a value outside the int32 range gave 0; eager converts
# a double through int64 and keeps its low byte (float32 and the half dtypes go through int32, as before).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_float_to_uint8_outside_the_int32_range(coil_reset, dtype):
    x = torch.tensor([-537160111331.0, 4294967303.0, 1e10 + 77, 3e9 + 5, -3e9 - 7, 300.7, -1.5, float("nan"),
                      float("inf"), -float("inf"), 1e30] * 3, dtype=dtype)
    f = lambda x: (x.to(torch.uint8), (x * 5).to(torch.uint8), x.to(torch.int8))  # noqa: E731
    for o, r in zip(coil.compile(f)(x), f(x)):
        assert torch.equal(o, r)
