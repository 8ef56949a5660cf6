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


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("fn", [
    lambda x, w: x * x.mean().item(),
    lambda x, w: torch.lerp(x, x * 2, w.sum().item()),
    lambda x, w: torch.nn.functional.leaky_relu(x, (w.mean() * x.mean()).item()),
    lambda x, w: torch.add(x, x.exp(), alpha=w.sum().item()) + (x.abs() + 1).pow(w.max().item()),
])
def test_item_read_carries_no_gradient(fn, dynamic):
    """FINDINGS_75 0: with a dynamic size, a training graph's ``.item()`` read was tensorized into the tensor itself,
    so the joint graph differentiated through it: ``x * x.mean().item()`` gave twice eager's gradient, and a
    parameter read only through ``.item()`` got a gradient where eager leaves ``.grad`` None."""
    cf = coil.compile(fn, dynamic=dynamic, options={"capture_scalar_outputs": True})
    for n in (6, 6, 4, 9):
        x, w = torch.randn(n), torch.rand(3)
        xs = [x.clone().requires_grad_() for _ in range(2)]
        ws = [w.clone().requires_grad_() for _ in range(2)]
        got, want = cf(xs[0], ws[0]), fn(xs[1], ws[1])
        torch.testing.assert_close(got, want)
        got.sum().backward(), want.sum().backward()
        torch.testing.assert_close(xs[0].grad, xs[1].grad)
        assert ws[0].grad is None and ws[1].grad is None
