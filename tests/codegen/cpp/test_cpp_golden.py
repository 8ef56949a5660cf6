"""The kernel-count golden tests (tests/codegen/test_golden.py, test_perf_shapes.py) through
the C++ backend: the same graphs must give the same number of kernels as with Triton
(fusion is the scheduler's, not the backend's), the same source twice (determinism),
results equal to eager, and the C++ source must match tests/codegen/cpp/golden/<name>.txt.
Regenerate with ``COIL_UPDATE_GOLDEN=1 pytest tests/codegen/cpp/test_cpp_golden.py`` and
review the diff."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/codegen

golden = pytest.importorskip("test_golden")
from codegen_helpers import check, compile_fn  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
_gelu_of_inf_as_on_avx512 = golden._gelu_of_inf_as_on_avx512  # (autouse: the goldens' gelu form on every CPU)


@pytest.mark.parametrize("name", sorted(golden._cases()))
def test_cpp_golden(name):
    fn, args, nkernels = golden._cases()[name]
    c = compile_fn(fn, *args, backend="cpp")
    text = c.source + "\n" + "\n\n".join(k.source for k in c.kernels)
    again = compile_fn(fn, *args, backend="cpp")
    assert text == again.source + "\n" + "\n\n".join(k.source for k in again.kernels), "not deterministic"
    assert c.kernel_count == nkernels, text
    os.makedirs(GOLDEN, exist_ok=True)
    path = os.path.join(GOLDEN, f"{name}.txt")
    if os.environ.get("COIL_UPDATE_GOLDEN") == "1" or not os.path.exists(path):
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert f.read() == text, f"C++ kernel source for {name} changed; see {path}"
    out, ref = c(*args), fn(*args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for o, e in zip(out, ref):
        torch.testing.assert_close(o, e, atol=1e-4, rtol=1e-4)


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def test_cpp_rms_norm_one_kernel():
    c = check(_rms, torch.randn(64, 512), torch.randn(512), kernels=1, backend="cpp")
    assert "cm::pow" not in c.kernels[0].source


def test_cpp_cross_entropy_kernel_counts():
    x, t = torch.randn(64, 1000), torch.randint(0, 1000, (64,))
    check(lambda a, b: F.cross_entropy(a, b), x, t, kernels=2, atol=1e-5, rtol=1e-5, backend="cpp")
    c = compile_fn(lambda a, b: F.cross_entropy(a, b), torch.randn(4096, 4100),
                   torch.randint(0, 4100, (4096,)), backend="cpp")
    assert c.kernel_count == 3, c.source


def test_cpp_sum_dim0_split_kernel_count():
    c = compile_fn(lambda t: t.sum(0), torch.randn(4096, 4096), backend="cpp")
    assert c.kernel_count == 2, c.source
