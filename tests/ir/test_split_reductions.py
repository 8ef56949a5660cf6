"""Two-stage (split) reductions whose chunk count does not divide the reduction: the
last chunk is ragged and masked with the reduction's identity. Reference interpreter,
Triton (interpreter) and C++ against eager."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "codegen"))
from codegen_helpers import check  # noqa: E402
from test_reference_lowerings import lower_and_run  # noqa: E402

from coil.ir.lowering import _split_factor  # noqa: E402

g = torch.Generator().manual_seed(0)
TALL = torch.randn(4097, 1024, generator=g)          # odd row count, 1024 outputs: leading
FLAT = torch.randn(12297, generator=g)               # odd count, one output
FEW = torch.randn(3, 6001, generator=g)              # a few odd-length rows
MID = torch.randn(4, 4097, 256, generator=g)         # middle dim: 1024 outputs, contiguous

CASES = {
    "sum0_odd_rows": (lambda a: a.sum(0), TALL),
    "amax0_odd_rows": (lambda a: a.amax(0), TALL),
    "full_sum_odd": (lambda a: a.sum(), FLAT),
    "full_max_odd": (lambda a: a.amax(), FLAT - 100),  # all negative: identity must be -inf
    "full_min_odd": (lambda a: a.amin(), FLAT + 100),   # all positive: identity +inf
    "full_prod_odd": (lambda a: (a * 0.01 + 1).prod(), FLAT),
    "any_odd": (lambda a: (a > 3.5).any(), FLAT),
    "int_sum_odd": (lambda a: (a * 10).to(torch.int32).sum(), FLAT),
    "int_max_odd": (lambda a: (a * 10 - 1000).to(torch.int32).amax(), FLAT),
    "rows_sum_odd": (lambda a: a.sum(1), FEW),
    "mid_sum_odd": (lambda a: a.sum(1), MID),
}


def test_ragged_split_factors():
    assert _split_factor([1024], 4097, "sum", leading=True) > 1
    assert _split_factor([4, 256], 4097, "sum", leading=True) > 1
    assert _split_factor([], 12297, "sum") > 1
    # several outputs keep the exact-division rule (odd lengths are not split)
    assert _split_factor([3], 6001, "sum") == 1
    assert _split_factor([512], 32001, "sum") == 1
    assert _split_factor([512], 32000, "sum") == 16


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference(name):
    fn, x = CASES[name]
    g_, (out,) = lower_and_run(fn, x)
    ref = fn(x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-4)
    n_red = sum(1 for b in g_.buffers if type(b).__name__ == "ComputedBuffer")
    assert n_red >= 2 or name == "rows_sum_odd", n_red  # split in two stages


@pytest.mark.parametrize("backend", ["triton", "cpp"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_pipeline(name, backend):
    fn, x = CASES[name]
    check(fn, x, backend=backend, atol=1e-3, rtol=1e-4)
