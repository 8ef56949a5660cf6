"""Kernel-count and kernel-source checks for the memory-bound microbenchmark rows that
were slow on the H200 (benchmarks/microbench.py): rms_norm, cross-entropy forward,
``x.sum(0)``; and correctness of the rewrites they needed (Triton interpreter)."""
import pytest
import torch
import torch.nn.functional as F

from codegen_helpers import check


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def test_rms_norm_one_kernel_no_libdevice_pow():
    """rms_norm is one persistent kernel (x read once), and ``x.pow(2)`` is ``x * x``
    (libdevice.pow made it 62% of copy bandwidth on the H200)."""
    x, w = torch.randn(64, 512), torch.randn(512)
    c = check(_rms, x, w, kernels=1, atol=1e-5, rtol=1e-5)
    src = c.kernels[0].source
    assert "libdevice.pow" not in src, src
    assert src.count("tl.load(in_ptr0") == 1, src


@pytest.mark.parametrize("k", [1, 2, 3, 4, -1, -2, 2.0, 3.0, -3.0, 0.5, 5])
def test_pow_small_integer_exponent(k):
    x = torch.randn(7, 33)
    x[0, 0], x[0, 1], x[0, 2] = float("nan"), float("inf"), -0.0
    c = check(lambda t: torch.pow(t, k), x, kernels=1, atol=1e-5, rtol=1e-5)
    uses_pow = "libdevice.pow" in c.kernels[0].source
    assert uses_pow == (k in (0.5, 5)), c.kernels[0].source


@pytest.mark.parametrize("k", [2, 3])
def test_pow_integer_tensor(k):
    x = torch.randint(-20, 20, (5, 9))
    c = check(lambda t: t ** k, x, kernels=1)
    assert "libdevice.pow" not in c.kernels[0].source
