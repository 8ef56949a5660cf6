"""Fixtures shared by the user-report repro files."""
import pytest


@pytest.fixture
def channels_last(monkeypatch):
    """Run the CUDA-only channels-last convolution path on CPU tensors too."""
    import coil.ir.graph as G
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))


@pytest.fixture
def coil_reset():
    """coil's caches and counters cleared before and after the test."""
    import coil
    coil.reset()
    yield
    coil.reset()


@pytest.fixture
def dynamo_reset():
    """torch.compile's caches cleared before and after the test."""
    import torch
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
