import pytest
import torch

import coil


@pytest.fixture(autouse=True)
def _fresh_capture():
    coil.reset()
    torch.manual_seed(0)
    yield
    coil.reset()
