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
