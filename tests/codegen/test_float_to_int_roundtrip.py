"""Float -> integer -> float conversions keep eager's values for out-of-range, NaN, inf
and negative inputs (the C++ build once used -fno-trapping-math, which let GCC fold the
round trip into trunc: x.long().float() of 1e30 gave 1e30, eager gives -9.22e18)."""
import pytest
import torch

import coil

_X = torch.tensor([300.7, -1.5, -0.5, 3e9, -3e9, float("nan"), float("inf"), -float("inf"),
                   1e30, -0.0, 2.5] * 3)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_float_int_float_round_trip_matches_eager(dtype):
    def f(x):
        return x.to(dtype).float(), (x * 2).to(dtype).double()

    coil.reset()
    got = coil.compile(f)(_X)
    want = f(_X)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert torch.equal(g, w), (dtype, g.tolist(), w.tolist())
        # -0.0 vs 0.0 matters: eager's round trip gives +0.0 for -0.5 and -0.0
        assert torch.equal(torch.signbit(g), torch.signbit(w))


def test_reciprocal_of_int_cast_of_negative_zero_is_plus_inf():
    """Found by the fuzzer: 1 / b.to(int64) with b = -0.0 gave -inf (the cast was elided)."""
    coil.reset()
    b = torch.tensor([-0.0, 2.0])
    f = lambda b: 1.0 / b.to(torch.int64)  # noqa: E731
    torch.testing.assert_close(coil.compile(f)(b), f(b))


def test_int_argument_symbol_in_kernel_numel_is_a_kernel_argument():
    """An int argument made symbolic (dynamic=True) that sizes a generated kernel
    (``torch.ones(n, 3)``) is passed to the C++ kernel: it was left out of the kernel's
    signature (not a positive size), the C++ compile failed and the graph fell back."""
    coil.reset()
    f = lambda x, n: torch.ones(n, 3) * x  # noqa: E731
    cf = coil.compile(f, dynamic=True, options={"strict_codegen": True})
    for n in (2, 5, 7):
        x = torch.randn(3)
        torch.testing.assert_close(cf(x, n), f(x, n))
