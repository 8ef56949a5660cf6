"""Outer sums (``g.sum(0)`` of a row-major ``g``: bias gradients) on the C++ backend run with their lanes along x
(``CppKernel._reduction_x_lanes``): values, dtypes and strides as eager's for the kernel shapes around it (a row value
read before and after the sum, several sums, masks, keepdim, several reduced dims, fp64, bf16 and special values),
accuracy over long columns as the lanes along r had, and the kernel that takes the path."""
import pytest
import torch
import torch.nn.functional as F

from codegen_helpers import compile_fn

CASES = {
    "row_value_before_and_after": (lambda g, b: (g * b).sum(0) + b, lambda: (torch.randn(256, 64), torch.randn(64))),
    "mean_times_row": (lambda g, b: g.mean(0) * b, lambda: (torch.randn(256, 64), torch.randn(64))),
    "bf16": (lambda g, b: (g.float() * b).sum(0).bfloat16(), lambda: (torch.randn(256, 64).bfloat16(), torch.randn(64))),
    "two_dims": (lambda g, b: g.sum((0, 1)) + b, lambda: (torch.randn(4, 32, 64), torch.randn(64))),
    "keepdim_fp64": (lambda g, b: g.sum(0, keepdim=True) - b,
                     lambda: (torch.randn(300, 16, dtype=torch.float64), torch.randn(16, dtype=torch.float64))),
    "three_sums": (lambda g, b: (g.sum(0), (g * g).sum(0), (g - b).sum(0)), lambda: (torch.randn(129, 40), torch.randn(40))),
    "masked": (lambda g, b: torch.where(g > 0, g, 0).sum(0) + F.pad(g, (0, 8))[:, 4:].sum(0)[:64],
               lambda: (torch.randn(100, 64), torch.randn(64))),
    "special": (lambda g, b: g.sum(0) * b, lambda: (torch.tensor([[1.0, float("inf"), float("nan"), -0.0] * 2] * 9),
                                                     torch.ones(8))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_outer_sums_match_eager(case):
    fn, make = CASES[case]
    args = make()
    c = compile_fn(fn, *args, backend="cpp")
    out, ref = c(*args), fn(*args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for o, r in zip(out, ref):
        assert (o.dtype, o.shape, o.stride()) == (r.dtype, r.shape, r.stride())
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert any("_xl[" in k.source for k in c.kernels), c.source   # the x-lanes path ran


@pytest.mark.parametrize("shape", [(100003, 8), (4096, 64), (777, 24)])
def test_outer_sum_accuracy_over_long_columns(shape):
    """Blocks of 32 rows, their partials added with compensation: within 2x of eager's cascade sum's error."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    out = compile_fn(lambda t: t.sum(0), g, backend="cpp")(g)[0]
    truth = g.double().sum(0)
    assert (out.double() - truth).abs().max() <= 2 * (g.sum(0).double() - truth).abs().max() + 1e-6


def test_inner_sums_and_short_runs_keep_lanes_along_r():
    g = torch.randn(64, 256)
    def lanes_along_x(fn, t):
        return any("_xl[" in k.source for k in compile_fn(fn, t, backend="cpp").kernels)

    assert not lanes_along_x(lambda t: t.sum(1), g)
    g3 = torch.randn(512, 3)    # a run of 3 along x: a lane group would straddle rows
    assert not lanes_along_x(lambda t: t.sum(0), g3)


@pytest.mark.parametrize("seed", range(6))
def test_random_outer_sums(seed):
    """Random shapes (x runs of 8..48, 1..300 rows, 2-D and 3-D, a transposed input), dtypes and epilogues."""
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi, (), generator=g))   # noqa: E731
    dt = [torch.float32, torch.float64, torch.bfloat16][seed % 3]
    rows, cols = r(1, 300), 8 * r(1, 7)
    shape = (r(1, 4), rows, cols) if seed % 2 else (rows, cols)
    x = torch.randn(*shape, generator=g).to(dt)
    b = torch.randn(cols, generator=g).to(dt)
    y = torch.randn(cols, rows, generator=g).to(dt).t()      # (rows, cols) read through a transpose
    fns = [lambda x, b, y: (x * b + 1).sum(tuple(range(x.dim() - 1))) * b,
           lambda x, b, y: (x.relu().mean(-2), (x.float() ** 2).sum(-2)),
           lambda x, b, y: y.sum(0) - b]
    for fn in fns:
        c = compile_fn(fn, x, b, y, backend="cpp")
        out, ref = c(x, b, y), fn(x, b, y)
        ref = ref if isinstance(ref, tuple) else (ref,)
        for o, e in zip(out, ref):
            assert (o.dtype, o.shape, o.stride()) == (e.dtype, e.shape, e.stride())
            tol = dict(rtol=2e-2, atol=2e-1) if dt == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(o, e, **tol)
