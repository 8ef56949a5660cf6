"""A comparison of a number read from a tensor (``x * (v > 0.5)``, ``v = t.item()``) is read as a 0-d bool
tensor (coil/aot/scalars.py), as arithmetic on such numbers is: the lowering got the SymBool itself and
failed ("float() argument must be ... not 'StrictGreaterThan'"), and the graph ran in the FX interpreter."""
import pytest
import torch

import coil

OPTS = {"capture_scalar_outputs": True, "strict_codegen": True}


@pytest.mark.parametrize("fn", [
    lambda x: x * (x.max().item() > 0.5),
    lambda x: x + (0.5 < x.max().item()),
    lambda x: x + (x[0].item() > 0.1),              # Python compares the fp32 value as a double
    lambda x: x * (x.long().sum().item() > 2.5),    # an int beside a float: doubles too
    lambda x: x * (x.long().sum().item() >= 3),     # two ints: exactly
    lambda x: x * (x.max().item() > x.min().item() + 1),
])
def test_comparison_of_item_reads(fn):
    cf = coil.compile(fn, options=OPTS)
    for x in (torch.tensor([0.1, 3.0]), torch.tensor([0.2, 0.3]), torch.tensor([1.0, 1.0]),
              torch.tensor([2.5, 0.0])):
        want, got = fn(x), cf(x)
        assert got.dtype == want.dtype and torch.equal(got, want), (x, want, got)
