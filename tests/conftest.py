"""Project-wide pytest set-up (markers are declared in pyproject.toml).

- ``@pytest.mark.gpu`` tests are skipped when no CUDA device is present, so the CPU CI
  run (``pytest -m "not slow" -n 2``) and the GPU machine run the same command.
- ``@pytest.mark.slow`` tests run only when asked for (``pytest -m slow``); CI
  deselects them with ``-m "not slow"``.
"""
import pytest


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
