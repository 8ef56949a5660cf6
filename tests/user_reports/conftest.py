"""Fixtures shared by the user-report repro files."""
import pytest


@pytest.fixture
def channels_last(monkeypatch):
    """Run the CUDA-only channels-last convolution path on CPU tensors too."""
    import coil.ir.graph as G
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
