"""Runtime checks in compiled graphs: eager's errors raised where eager raises them.

- Integer division, remainder and fmod by a CPU tensor holding a 0 raise eager's
  ``RuntimeError: ZeroDivisionError`` (the kernels divide unchecked: they returned numbers).
- A runtime check (``_assert_async``, a data-dependent ``torch._check``) stays in the forward
  graph of a training program, though no output depends on it (the partitioner dropped it).
"""
import pytest
import torch

import coil

BACKENDS = ["cpp", "triton"]
DIVISIONS = {
    "floordiv": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": torch.fmod,
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
}


def _compile(fn, backend, **kw):
    return coil.compile(fn, options={"cpu_backend": backend}, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(DIVISIONS))
def test_integer_division_by_a_zero_tensor_element_raises(name, backend):
    fn = DIVISIONS[name]
    a, b = torch.tensor([5, -3, 0]), torch.tensor([0, 2, 1])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, b)
    f = _compile(fn, backend)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, b)
    b = torch.tensor([3, 2, -1])
    torch.testing.assert_close(f(a, b), fn(a, b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_and_scalar_divisors_are_not_checked(backend):
    """Float division by 0 is inf/nan in eager; an int scalar divisor of 0 raises while tracing, as eager."""
    a, b = torch.tensor([5.0, -3.0, 0.0]), torch.tensor([0.0, 2.0, 0.0])
    fn = lambda a, b: (a // b, a % b, torch.fmod(a, b))  # noqa: E731
    torch.testing.assert_close(_compile(fn, backend)(a, b), fn(a, b), equal_nan=True)
    g = lambda a: a // 2  # noqa: E731
    torch.testing.assert_close(_compile(g, backend)(torch.tensor([5, -3])), g(torch.tensor([5, -3])))


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_division_check_in_a_training_graph(backend):
    def fn(x, a, b):
        return x * (a // b).float()

    x = torch.randn(3, requires_grad=True)
    f = _compile(fn, backend)
    a = torch.tensor([5, -3, 0])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(x, a, torch.tensor([0, 2, 1]))
    b = torch.tensor([3, 2, 1])
    out = f(x, a, b)
    out.sum().backward()
    torch.testing.assert_close(out, fn(x, a, b))
    torch.testing.assert_close(x.grad, (a // b).float())


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_division_check_with_dynamic_sizes_and_in_place(backend):
    f = _compile(lambda a, b: a.remainder(b) + 1, backend, dynamic=True)
    for n in (3, 5, 7):
        a, b = torch.randint(-9, 9, (n,)), torch.randint(1, 5, (n,))
        torch.testing.assert_close(f(a, b), a.remainder(b) + 1)
        b[1] = 0
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            f(a, b)

    def g(a, b):
        a.floor_divide_(b)
        return a

    a = torch.tensor([5, -3, 0])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        _compile(g, backend)(a, torch.tensor([1, 0, 1]))


def test_data_dependent_check_holds_in_a_training_graph():
    """``torch._check(n < 10)`` on ``n = x.sum().item()`` times a parameter: eager raises for n = 30;
    the forward graph had lost its ``_assert_scalar`` and returned ``w * 30``."""
    def fn(x, w):
        n = x.sum().item()
        torch._check(n < 10)
        return w * n

    w = torch.randn(3, requires_grad=True)
    f = coil.compile(fn, dynamic=True, options={"capture_scalar_outputs": True,
                                                "capture_dynamic_output_shape_ops": True})
    torch.testing.assert_close(f(torch.tensor([1, 2]), w), fn(torch.tensor([1, 2]), w))
    with pytest.raises(RuntimeError):
        fn(torch.tensor([10, 20]), w)
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        f(torch.tensor([10, 20]), w)
