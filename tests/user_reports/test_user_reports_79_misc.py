"""Regression tests for trial 79 (tests/user_reports/FINDINGS_79.md): capture."""
import warnings

import torch

import coil

G = 2.0


def _times_global(x):
    return x * G


def test_f12_a_float_global_turned_tensor_warns_nothing():
    """A float global that became a graph input (automatic dynamic), later rebound to a tensor: reading the old
    entry's input sizes called ``torch.tensor`` on the tensor, and torch's copy-construct warning reached the user
    from ``<string>:1``."""
    global G
    cf, x = coil.compile(_times_global), torch.randn(3)
    try:
        cf(x)
        G = 3.0
        cf(x)
        G = torch.tensor(5.0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.testing.assert_close(cf(x), x * G)
        assert not seen, [str(w.message) for w in seen]
    finally:
        G = 2.0
