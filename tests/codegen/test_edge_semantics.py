"""Edge semantics of generated kernels against eager, both CPU backends. NaN through
reductions: torch's max/min/amax/softmax/logsumexp return NaN for a row holding one;
Triton's looped reductions combined with ``tl.maximum`` without NaN propagation silently
dropped it (Triton's default returns the other operand). Rounding ops on integers."""
import pytest
import torch

from codegen_helpers import check

CASES = {
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(-1),
    "max_values": lambda x: x.max(-1).values,
    "softmax": lambda x: torch.softmax(x, -1),
    "logsumexp": lambda x: x.logsumexp(-1),
    "amax_dim0": lambda x: x.amax(0),
    "clamp_max": lambda x: torch.maximum(x, x.flip(-1)),
}


@pytest.mark.parametrize("shape", [(512, 4500), (8, 20000), (64, 300)])
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_nan_propagates(name, shape, backend):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    x[3, 100] = x[5, shape[1] - 1] = float("nan")
    check(CASES[name], x, atol=1e-4, rtol=1e-4, backend=backend)


@pytest.mark.parametrize("name", ["amax", "softmax", "logsumexp"])
def test_nan_propagates_in_looped_rows(name):
    """Enough rows not to be split, rows long enough to loop (the failing case)."""
    torch.manual_seed(0)
    x = torch.randn(4096, 4100)
    x[3, 100] = x[7, 4099] = float("nan")
    c = check(CASES[name], x, atol=1e-4, rtol=1e-4, backend="triton")
    assert any("for roffset in range" in k.source for k in c.kernels)


@pytest.mark.parametrize("op", [torch.floor, torch.ceil, torch.round, torch.trunc])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_rounding_of_integers_is_identity(op, dtype, backend):
    """Triton raised 'Expected dtype fp32/fp64' for floor/ceil of an integer tensor."""
    x = torch.randint(0, 100, (64,)).to(dtype)
    check(lambda x: op(x) * 2 + 1, x, backend=backend)


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_full_min_of_empty_raises_like_eager(backend):
    """x.min() of an empty tensor returned NaN; eager raises (no identity for min)."""
    import coil
    coil.reset()
    f = coil.compile(lambda x: x.min() + 1, options={"cpu_backend": backend})
    with pytest.raises(RuntimeError, match="numel\\(\\) == 0"):
        f(torch.randn(0, 3))


SCALAR_STORES = {
    "masked_fill": lambda u, m: u.masked_fill(m, 300),
    "full": lambda u, m: torch.full((2,), 300, dtype=torch.uint8) + u,
    "where": lambda u, m: torch.where(m, u, 300),
    "fill_": lambda u, m: u.clone().fill_(300),
    "clamp": lambda u, m: u.clamp(max=300),
}


@pytest.mark.parametrize("name", sorted(SCALAR_STORES))
@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_scalar_out_of_dtype_range_raises_like_eager(name, backend):
    """Ops that store a scalar as it is raise in eager when it does not fit the dtype;
    the kernels wrapped it (uint8 fill of 300 gave 44). Arithmetic still wraps."""
    import coil
    coil.reset()
    u, m = torch.tensor([1, 200], dtype=torch.uint8), torch.tensor([True, False])
    with pytest.raises(RuntimeError, match="overflow"):
        SCALAR_STORES[name](u, m)
    f = coil.compile(SCALAR_STORES[name], options={"cpu_backend": backend})
    with pytest.raises(RuntimeError, match="overflow"):
        f(u, m)
    check(lambda u, m: u.masked_fill(m, 7) + 300, u, m, backend=backend)
