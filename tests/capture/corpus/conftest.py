"""Fixtures of the capture corpus: the counting backend and the case runner.

``CountingBackend`` (defined in corpus_harness.py, next to the runner that uses it)
counts graphs and ops and runs ``gm.forward``; ``check(case)`` runs one corpus row.
Set ``CORPUS_ORACLE=torch`` to run the tables under torch.compile (the oracle the
expected counts were taken from).
"""
import pytest

from corpus_harness import CountingBackend, run_case


@pytest.fixture
def counter():
    """A fresh counting backend: ``coil.compile(fn, backend=counter)``."""
    return CountingBackend()


@pytest.fixture
def check():
    """``check(case)``: run a corpus row eagerly and compiled and compare (corpus_harness.run_case)."""
    return run_case
