"""Regressions from new-user trial 67 (FINDINGS_67.md): dynamic shapes on CPU (``dynamic=True``, the marks, automatic
dynamic) over size sequences that cross 0 / 1 / equal-dims / divisibility specializations, compared with eager.
"""

import pytest
import torch
import torch.nn.functional as F

import coil
from coil.capture import frame


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; wrong strides): ``torch.triu_indices`` / ``tril_indices`` of a symbolic size returned a slice of
# a ``(2, N + 1)`` buffer: strides ``(N + 1, 1)`` where eager's result is contiguous ``(N, 1)``.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("upper", [True, False])
def test_triangle_indices_of_a_symbolic_size_are_contiguous(coil_reset, upper):
    op = torch.triu_indices if upper else torch.tril_indices
    f = lambda x: op(x.shape[0], x.shape[1], 1)  # noqa: E731
    cf = coil.compile(f, dynamic=True)
    for n in (3, 4, 6):
        x = torch.randn(n, n + 1)
        out, ref = cf(x), f(x)
        assert torch.equal(out, ref)
        assert out.stride() == ref.stride() == (ref.shape[1], 1)


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; a value where eager raises): ``F.max_pool1d(x, 2, stride=0)`` raises in eager ("stride must be
# greater than zero"); coil's max_pool1d substitute read the 0 as "no stride" (``stride or None``) and pooled with
# stride 2, static and symbolic.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dynamic", [False, True])
def test_max_pool1d_stride_zero_raises(coil_reset, dynamic):
    f = lambda x: F.max_pool1d(x, 2, stride=0)  # noqa: E731
    x = torch.randn(1, 2, 6)
    with pytest.raises(RuntimeError):
        f(x)
    with pytest.raises(RuntimeError):
        coil.compile(f, dynamic=dynamic)(x)
    g = lambda x: F.max_pool1d(x, 2, stride=[])  # noqa: E731  (an empty stride is the kernel size, as in eager)
    torch.testing.assert_close(coil.compile(g, dynamic=dynamic)(x), g(x))


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed; a recompile at every size under ``dynamic=True``): ``F.one_hot(idx, x.shape[0])`` with a
# symbolic class count went to ``F.one_hot`` itself, whose trace pinned the count (``Eq(s0, 4)``).
# ---------------------------------------------------------------------------------------------------------------

def test_one_hot_with_a_symbolic_class_count_is_one_graph(coil_reset):
    f = lambda x: F.one_hot(torch.arange(x.shape[0]) // 2, x.shape[0]) * x[:, None]  # noqa: E731
    cf = coil.compile(f, dynamic=True)
    frame.reset_stats()
    for n in (4, 5, 3, 8):
        x = torch.randn(n)
        torch.testing.assert_close(cf(x), f(x))
    assert frame.stats["graphs"] == 1
    bad = lambda x: F.one_hot(torch.arange(x.shape[0]), x.shape[0] - 1)  # noqa: E731  (class out of range)
    with pytest.raises((RuntimeError, IndexError)):
        coil.compile(bad, dynamic=True)(torch.randn(5))


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed; a recompile at every size under ``dynamic=True``): ``F.adaptive_avg_pool1d(x, L // 2)`` with a
# symbolic output size: ATen's C++ composite passes the size on as an int (guard ``Eq(s0 // 2, 2)``). The capture now
# records the 2-d pool over a height of 1 (``_adaptive_avg_pool2d`` takes symbolic sizes).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rank", [2, 3])
def test_adaptive_avg_pool1d_with_a_symbolic_output_size_is_one_graph(coil_reset, rank):
    f = lambda x: F.adaptive_avg_pool1d(x, x.shape[-1] // 2) * 2  # noqa: E731
    cf = coil.compile(f, dynamic=True)
    frame.reset_stats()
    for n in (4, 7, 9, 15):
        x = torch.randn(*(2, 3, n)[3 - rank:], requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        out, ref = cf(x2), f(x)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)
    assert frame.stats["graphs"] == 1


# ---------------------------------------------------------------------------------------------------------------
# Finding 5 (fixed; silent wrong values, a missing guard): under ``dynamic=True`` a non-contiguous input's storage
# offset is a symbol the ShapeEnv takes to be >= 2, and the shape guards leave that bound out (graphs never read
# offsets). Python code that reads it (``if x.storage_offset() > 0``) was decided by the bound with no guard, so the
# entry built at offset 2 ran the wrong branch at offset 0. Reading a symbolic offset now guards the bound.
# ---------------------------------------------------------------------------------------------------------------

def test_branch_on_a_symbolic_storage_offset_is_guarded(coil_reset):
    f = lambda x: x * 2 if x.storage_offset() > 0 else x * 3  # noqa: E731
    cf = coil.compile(f, dynamic=True)
    for n, off in ((6, 2), (6, 0), (5, 0), (5, 3)):
        x = torch.randn(3 * n + off)[off:].view(3, n).t()   # (n, 3), strides (1, n), offset off
        torch.testing.assert_close(cf(x), f(x))


# ---------------------------------------------------------------------------------------------------------------
# Finding 6 (fixed; an error where eager runs): ``x ** x.shape[0]`` (also ``torch.pow(x, n)``, ``x.pow_(n)``,
# ``n ** x``) of a tensor that needs grad, under ``dynamic=True``: every compile failed (``BackendCompilerFailed:
# ... Scalar.h: NYI SymInt``), as ATen's pow backward formulas read the scalar as a double. With a symbolic float
# (``x ** (n / 2)``) it compiled once per size (the formula pinned the float). A symbolic base or exponent of such a
# pow is now a 0-d tensor (at least fp32; the result keeps the tensor's dtype).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["exp", "method_inplace", "base", "float_exp", "bf16"])
def test_pow_by_a_symbolic_number_with_grad(coil_reset, how):
    f = {"exp": lambda x: x ** (x.shape[0] % 3 + 1),
         "method_inplace": lambda x: (x * 1).pow_(x.shape[0]),
         "base": lambda x: x.shape[0] ** x,
         "float_exp": lambda x: x ** (x.shape[0] / 7),
         "bf16": lambda x: x.bfloat16() ** x.shape[0]}[how]
    cf = coil.compile(f, dynamic=True)
    frame.reset_stats()
    for n in (3, 4, 5):
        x = torch.rand(n, 2, dtype=torch.float64, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        out, ref = cf(x2), f(x)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        tol = {"atol": 2e-2, "rtol": 2e-2} if how == "bf16" else {}   # (eager's backward rounds in bf16)
        torch.testing.assert_close(x2.grad, x.grad, **tol)
    assert frame.stats["graphs"] == 1


# ---------------------------------------------------------------------------------------------------------------
# Finding 7 (fixed; silent wrong values): ``torch.linspace(a, b, n)`` with ``n`` a size marked unbacked (so 1 shares
# the graph): coil's linspace substitute divided by ``n - 1`` and gave ``[nan]`` where eager gives ``[a]``.
# ---------------------------------------------------------------------------------------------------------------

def test_linspace_of_one_unbacked_step(coil_reset):
    f = lambda x: torch.linspace(-2, 3, x.shape[0])  # noqa: E731
    cf = coil.compile(f)
    for n in (5, 1, 3):
        x = torch.randn(n)
        coil.mark_unbacked(x, 0)
        torch.testing.assert_close(cf(x), f(x))


# ---------------------------------------------------------------------------------------------------------------
# Finding 8 (fixed; an error where eager runs): a dim marked unbacked through an op whose traced backward asks about
# its size (``cumsum``, ``cumprod``, ``prod``, ``logcumsumexp``, a layer norm over it, a step slice) with grad:
# ``BackendCompilerFailed: GuardOnDataDependentSymNode``. The graph now runs eagerly (warned, ``aot_fallback``).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["cumsum", "prod"])
def test_unbacked_dim_through_a_backward_that_reads_its_size(coil_reset, op):
    f = (lambda x: x.cumsum(0)) if op == "cumsum" else (lambda x: x.prod(1))
    cf = coil.compile(f)
    for n in (3, 1, 5):
        x = torch.randn(n, 4, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        coil.mark_unbacked(x2, 0)
        if n == 3:   # the one compile (sizes 1 and 5 share the entry)
            with pytest.warns(UserWarning, match="running this graph eagerly"):
                out = cf(x2)
        else:
            out = cf(x2)
        ref = f(x)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)


def test_pow_by_a_symbolic_int_with_grad_through_torch_compile():
    # the same rule applied to torch's captured graph (``substitute_graph``): torch.compile(backend="coil") failed too
    torch._dynamo.reset()
    f = lambda x: x ** x.shape[0] + x.shape[0] ** x  # noqa: E731
    cf = torch.compile(f, backend="coil", dynamic=True)
    for n in (3, 4, 5):
        x = torch.rand(n, 2, dtype=torch.float64, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        out, ref = cf(x2), f(x)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)
    torch._dynamo.reset()


@pytest.mark.parametrize("via", ["coil", "torch.compile"])
def test_pow_of_a_0d_half_tensor_by_a_symbolic_int_keeps_its_dtype(coil_reset, via):
    """The symbolic exponent of a tensor that needs grad becomes a 0-d tensor of at least float32; a 0-d base of
    float16 then promoted with it (eager's result is float16): a 0-d base takes an exponent of its own dtype."""
    def f(x, n):
        return x ** n

    torch._dynamo.reset()
    cf = coil.compile(f, dynamic=True) if via == "coil" else torch.compile(f, backend="coil", dynamic=True)
    for n in (2, 3, 4):
        x = torch.rand((), dtype=torch.float16, requires_grad=True)
        y, ref = cf(x, n), f(x, n)
        assert y.dtype == ref.dtype == torch.float16
        torch.testing.assert_close(y, ref)
        (g,), (gr,) = torch.autograd.grad(y, x), torch.autograd.grad(ref, x)
        torch.testing.assert_close(g, gr)
    torch._dynamo.reset()
