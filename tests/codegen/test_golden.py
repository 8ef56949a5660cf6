"""Golden kernel sources: the same graph must give the same kernels and wrapper, so a
refactor shows up as a diff. Regenerate with ``COIL_UPDATE_GOLDEN=1 pytest tests/codegen/test_golden.py``
and review the diff."""
import os

import pytest
import torch
import torch.nn.functional as F

from codegen_helpers import compile_fn

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _cases():
    r = lambda *s: torch.randn(*s)
    return {
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (64,), w, b), (r(8, 64), r(64), r(64)), 1),
        "softmax": (lambda x: torch.softmax(x, -1), (r(8, 100),), 1),
        "gelu_addmm": (lambda x, w, b: F.gelu(x @ w + b), (r(8, 32), r(32, 16), r(16)), 1),
        "residual_tail": (lambda x, y, w, b: F.layer_norm(x + y, (32,), w, b), (r(4, 32), r(4, 32), r(32), r(32)), 1),
        "sum_dim0_split": (lambda x: x.sum(0), (r(8192, 3),), 2),
        "softmax_looped": (lambda x: torch.softmax(x, -1), (r(3, 5003),), 1),
        "pointwise_chain": (lambda x, y: torch.sigmoid(x * y) + y.half().float(), (r(3, 50), r(50)), 1),
    }


def _strip(src: str) -> str:
    """Kernel text without the shared prelude of helper functions."""
    return src[src.index("@triton.jit\ndef triton_"):] if "@triton.jit\ndef triton_" in src else src


@pytest.fixture(autouse=True)
def _gelu_of_inf_as_on_avx512(monkeypatch):
    """The exact GELU's lowering asks eager whether ``gelu(+inf)`` is NaN (AVX-512) or inf (AVX2) and whether its
    zeros are +0.0 (AVX2); the goldens hold the AVX-512 form on every machine."""
    from coil.ir import lowering_activations

    monkeypatch.setattr(lowering_activations, "_eager_cpu_gelu_of_inf_is_nan",
                        lambda dtype: dtype in (torch.float32, torch.bfloat16))
    monkeypatch.setattr(lowering_activations, "_eager_cpu_gelu_zero_is_positive", lambda dtype: False)


@pytest.mark.parametrize("name", sorted(_cases()))
def test_golden(name):
    fn, args, nkernels = _cases()[name]
    c = compile_fn(fn, *args)
    text = c.source + "\n" + "\n".join(_strip(k.source) for k in c.kernels)
    again = compile_fn(fn, *args)
    assert text == again.source + "\n" + "\n".join(_strip(k.source) for k in again.kernels), "not deterministic"
    assert c.kernel_count == nkernels, text
    path = os.path.join(GOLDEN, f"{name}.txt")
    if os.environ.get("COIL_UPDATE_GOLDEN") == "1" or not os.path.exists(path):
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert f.read() == text, f"kernel source for {name} changed; see {path}"
    out, ref = c(*args), fn(*args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for o, e in zip(out, ref):
        torch.testing.assert_close(o, e, atol=1e-4, rtol=1e-4)
