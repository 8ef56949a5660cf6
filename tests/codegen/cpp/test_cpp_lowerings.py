"""Every lowering test of tests/codegen/test_end_to_end.py (issue 5's, written for the
Triton backend) rerun through the C++ backend: same functions, same eager comparison,
same kernel-count golden numbers.

The tests are re-exported from that module; an autouse fixture swaps its ``check``
helper for one that compiles with ``cpu_backend="cpp"``. A test added there runs here
too, with no change to this file.
"""
import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/codegen

e2e = pytest.importorskip("test_end_to_end")
import codegen_helpers  # noqa: E402

for _name in dir(e2e):
    if _name.startswith("test_"):
        globals()[_name + "_cpp"] = getattr(e2e, _name)


@pytest.fixture(autouse=True)
def _cpp_backend(monkeypatch):
    monkeypatch.setattr(e2e, "check", functools.partial(codegen_helpers.check, backend="cpp"))
    if hasattr(e2e, "compile_fn"):
        monkeypatch.setattr(e2e, "compile_fn", functools.partial(codegen_helpers.compile_fn, backend="cpp"))
    yield
