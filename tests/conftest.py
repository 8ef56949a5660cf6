"""Project-wide pytest set-up (markers are declared in pyproject.toml).

- ``@pytest.mark.gpu`` tests are skipped when no CUDA device is present, so the CPU CI
  run (``pytest -m "not slow" -n 2``) and the GPU machine run the same command.
- ``@pytest.mark.slow`` tests run only when asked for (``pytest -m slow``); CI
  deselects them with ``-m "not slow"``.
- ``COIL_STRICT_CAPTURE=1`` (unless set otherwise): an internal error in capture fails the test.
"""
import json
import os

import pytest

# a frame that runs eagerly because capture raised an internal error (not a deliberate Unsupported) fails its test
# instead of passing on eager's values (coil.config.strict_capture); a test that means to see that fallback unsets it
os.environ.setdefault("COIL_STRICT_CAPTURE", "1")


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


@pytest.fixture
def trace_events(tmp_path):
    """The compile log written to ``tmp_path`` for the test (caches reset around it): ``trace_events(name)`` is the
    list of its records of event ``name``."""
    import coil
    from coil import trace
    old = trace.trace_dir()
    trace.set_dir(str(tmp_path))
    coil.reset()

    def events(name):
        records = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
        return [r for r in records if r["event"] == name]
    yield events
    coil.reset()
    trace.set_dir(old)
