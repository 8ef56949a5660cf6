"""C++ backend edge values of integer division and of float32 tanh (FINDINGS_7 items 1, 5).

- Integer ``//``, ``%``, ``fmod`` and trunc division with a tensor divisor: x86 ``idiv``
  traps (SIGFPE, the process dies) on ``INT_MIN / -1`` and on a divisor of 0. The prelude
  helpers (``coil_floordiv`` ...) give eager's wrapped results for ``-1`` (``INT_MIN // -1
  == INT_MIN``, remainder 0) and 0 for a divisor of 0 inside a kernel; a compiled program
  checks its divisors for 0 first and raises eager's ``RuntimeError: ZeroDivisionError``
  (tests/aot/test_runtime_checks.py), but the kernel may run before that check.
- ``coil_tanh`` returns exactly +-1 where eager does (|x| >= 9.01084 in float32) and stays
  within 1 ulp of eager elsewhere.
"""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.codegen import compile_aten_graph
from coil.config import patch

SIGNED = [torch.int8, torch.int16, torch.int32, torch.int64]


def _compile(fn):
    return coil.compile(fn, options={"cpu_backend": "cpp"})


def _kernels(fn, *args):
    """``fn`` compiled by the code generator alone (no AOT: no divisor check before the kernel)."""
    gm = make_fx(fn, tracing_mode="fake")(*args)
    with patch(cpu_backend="cpp"):
        return compile_aten_graph(gm, list(args), "cpu")(*args)


def _div_ops(a, b):
    return (torch.div(a, b, rounding_mode="floor"), a % b, torch.fmod(a, b),
            torch.div(a, b, rounding_mode="trunc"))


def _expected(a, b):
    """Eager results with b == 0 mapped to 0 (eager raises) and trunc INT_MIN / -1 to
    INT_MIN (eager's own trunc division traps there for int32/int64)."""
    zero = b == 0
    bs = torch.where(zero, torch.ones_like(b), b)
    wrap = (a == torch.iinfo(a.dtype).min) & (b == -1)
    a_t = torch.where(wrap, torch.zeros_like(a), a)  # keep eager's trunc away from the trap
    out = [a // bs, a % bs, torch.fmod(a, bs), torch.div(a_t, bs, rounding_mode="trunc")]
    out[3] = torch.where(wrap, a, out[3])
    return [torch.where(zero, torch.zeros_like(o), o) for o in out]


@pytest.mark.parametrize("dtype", SIGNED)
def test_int_division_edge_divisors(dtype):
    i = torch.iinfo(dtype)
    a = torch.tensor([i.min, i.min, i.min, i.max, i.max, -7, 7, -7, 7, 0, -1, i.min + 1, 5, i.min, 3], dtype=dtype)
    b = torch.tensor([-1, 0, 1, -1, 0, 2, -2, -1, 0, 0, -1, -1, 3, i.min, i.max], dtype=dtype)
    out = _kernels(_div_ops, a, b)
    for k, (o, r) in enumerate(zip(out, _expected(a, b))):
        assert o.dtype == r.dtype and torch.equal(o, r), (k, o.tolist(), r.tolist())
    # the exact values asked for: INT_MIN // -1 wraps to INT_MIN, remainders 0, x / 0 is 0
    assert [o[0].item() for o in out] == [i.min, 0, 0, i.min]
    assert [o[1].item() for o in out] == [0, 0, 0, 0]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        _compile(_div_ops)(a, b)
    nz = b != 0
    out = _compile(_div_ops)(a[nz], b[nz])
    for k, (o, r) in enumerate(zip(out, _expected(a[nz], b[nz]))):
        assert o.dtype == r.dtype and torch.equal(o, r), (k, o.tolist(), r.tolist())


@pytest.mark.parametrize("dtype", SIGNED)
def test_int_division_eager_parity_random_and_scalar(dtype):
    """Many elements (OpenMP, the lane loop) with divisors in [-3, 3] (0 only in the kernels'
    check), and scalar divisors (constant-folded, division by a constant vectorizes)."""
    torch.manual_seed(0)
    i = torch.iinfo(dtype)
    a = torch.randint(i.min, i.max, (70000,), dtype=dtype)
    a[::97] = i.min
    b = torch.randint(-3, 4, (70000,), dtype=dtype)
    for k, (o, r) in enumerate(zip(_kernels(_div_ops, a, b), _expected(a, b))):
        assert torch.equal(o, r), k
    b = torch.where(b == 0, torch.full_like(b, 2), b)
    for k, (o, r) in enumerate(zip(_compile(_div_ops)(a, b), _expected(a, b))):
        assert torch.equal(o, r), k
    for s in (-1, 3, -7):
        f = lambda a: (a // s, a % s, torch.fmod(a, s))  # noqa: E731
        for k, (o, r) in enumerate(zip(_compile(f)(a), f(a))):
            assert torch.equal(o, r), (s, k)


def test_int_floordiv_fused_with_float_math():
    """The repro shape of FINDINGS_7 item 1 inside a larger fused kernel."""
    a = torch.tensor([torch.iinfo(torch.int64).min, 7, -9, 4])
    b = torch.tensor([-1, 2, 0, 0])
    f = lambda a, b: ((torch.div(a, b, rounding_mode="floor")).float() * 0.5, (a % b) + 1)  # noqa: E731
    o = _kernels(f, a, b)
    assert o[0].tolist() == [-2.0 ** 63 * 0.5, 1.5, 0.0, 0.0]
    assert o[1].tolist() == [1, 2, 1, 1]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        _compile(f)(a, b)


def _ulps32(a, b):
    def key(t):
        i = t.view(torch.int32).long()
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)
    u = (key(a) - key(b)).abs()
    return torch.where(torch.isnan(a) & torch.isnan(b), torch.zeros_like(u), u)


def test_tanh_dense_sweep_fp32():
    """Every float32 in [8.5, 9.5] (both signs, ~2.4M values around eager's saturation
    point 9.01084), a dense linspace over [-30, 30], tiny values and the specials: within
    1 ulp of eager, exactly eager (+-1) wherever eager saturates, NaN -> NaN."""
    lo, hi = (torch.tensor(v).view(torch.int32).item() for v in (8.5, 9.5))
    near = torch.arange(lo, hi, dtype=torch.int32).view(torch.float32)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e7, -1e7, 3e38,
                             -3e38, 1e-45, -1e-45, 0.625, -0.625, 9.0, -9.0])
    x = torch.cat([near, -near, torch.linspace(-30, 30, 2_000_001), torch.logspace(-40, 0, 20001),
                   -torch.logspace(-40, 0, 20001), specials])
    o, r = _compile(torch.tanh)(x), torch.tanh(x)
    assert _ulps32(o, r).max().item() <= 1
    sat = r.abs() == 1
    assert sat.sum() > 1_000_000 and torch.equal(o[sat], r[sat])
    assert torch.equal(o[x.abs() >= 9.01084041595459], r[x.abs() >= 9.01084041595459])
    assert torch.isnan(o[torch.isnan(x)]).all()
    g = torch.linspace(-20, 20, 101)
    assert (_compile(lambda x: (x.tanh() == 1).sum())(g) == (g.tanh() == 1).sum()).item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_tanh_saturation_other_dtypes(dtype):
    x = torch.linspace(-40, 40, 400001, dtype=torch.float64).to(dtype)
    o, r = _compile(torch.tanh)(x), torch.tanh(x)
    sat = r.abs() == 1
    assert sat.any() and torch.equal(o[sat], r[sat]) and ((o.abs() == 1) == sat).all()
    torch.testing.assert_close(o, r)


def test_gelu_tanh_of_huge_values():
    x = torch.tensor([-3e38, -1e7, -float("inf"), 20.0, -20.0, float("inf"), 1e7, 3e38])
    f = lambda x: torch.nn.functional.gelu(x, approximate="tanh")  # noqa: E731
    o, r = _compile(f)(x), f(x)
    assert torch.equal(torch.nan_to_num(o, 7.0), torch.nan_to_num(r, 7.0)), (o.tolist(), r.tolist())
    assert torch.equal(o.signbit(), r.signbit())
