"""Capture (Dynamo's role) — seam only; the InstructionTranslator lands here.

Contract used by :mod:`coil.api`:

- ``wrap_callable(fn_or_module, *, backend, fullgraph, dynamic) -> callable``
- ``reset()``, ``disable(fn) -> fn``, ``explain(fn, *args, **kwargs)``.

TEMPORARY (replaced by the capture layer): no bytecode capture yet.
"""
from __future__ import annotations


def wrap_callable(fn, *, backend, fullgraph=False, dynamic=None):
    raise NotImplementedError("coil.capture is not built yet")


def reset() -> None:
    pass


def disable(fn):
    return fn


def explain(fn, *args, **kwargs):
    raise NotImplementedError("coil.capture is not built yet")
