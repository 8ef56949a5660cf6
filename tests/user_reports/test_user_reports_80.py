"""Regression tests for trial 80 (tests/user_reports/FINDINGS_80.md)."""
import pytest
import torch
import torch.nn.functional as F

import coil


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_f2_autocast_sdpa_with_symbolic_sizes(coil_reset, dtype):
    """#2: with symbolic sizes capture records attention as the custom op ``coil::sdpa``, which autocast does not cast
    (custom ops fall through it): float32 attention where eager's autocast casts q, k, v to ``dtype``. The substitute
    now applies autocast's cast to its arguments itself."""
    def f(q, k, v):
        with torch.autocast("cpu", dtype=dtype):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 2, 2) for _ in range(3))
    torch.testing.assert_close(coil.compile(f, dynamic=True)(q, k, v), f(q, k, v))


@pytest.mark.parametrize("dynamic", [False, True])
def test_f3_autocast_lstm_is_low_precision(coil_reset, dynamic):
    """#3: eager's CPU LSTM under autocast is oneDNN's ``mkldnn_rnn_layer``, a lower-precision autocast op (bfloat16
    output, h_n, c_n). coil's joint trace turns oneDNN off, and the cell ops it took instead mixed autocast's bfloat16
    products with float32 h0 / c0: float32 values never rounded to bfloat16. The ``torch.lstm`` substitute now casts
    as autocast casts oneDNN's arguments. (Tolerance: one bfloat16 step, oneDNN's fused kernel rounds its own way.)"""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(1, 1)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lstm(x)
    x = torch.randn(2, 1, 1)
    torch.testing.assert_close(coil.compile(f, dynamic=dynamic)(x), f(x), atol=4e-3, rtol=8e-3)
    with torch.no_grad():   # (traced with oneDNN: eager's kernel, exact)
        coil.reset()
        torch.testing.assert_close(coil.compile(f, dynamic=dynamic)(x), f(x), atol=0, rtol=0)
