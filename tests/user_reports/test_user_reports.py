"""Minimal repros from user testing (a fresh ML engineer trying coil); see FINDINGS.md.

Each test is the smallest program that showed a defect. Fixed ones are plain
regression tests; open ones are ``xfail(strict=True)`` with the diagnosis.
"""
import warnings

import pytest
import torch

import coil
from coil.testing import assert_same_as_eager


def _no_fallback(fn, *args):
    """Compile with the default backend, failing if codegen fell back to the interpreter."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        return assert_same_as_eager(fn, args)


def test_setitem_scalar_into_slice():
    # aten.copy(select, 0-d constant): the lowering loaded src without broadcasting
    # (AssertionError ([i0], []) in ir/nodes.py, codegen fell back). Fixed.
    def f(x):
        y = x.clone()
        y[:, 0] = 0
        return y

    _no_fallback(f, torch.randn(4, 4))


def test_setitem_scalar_into_input_slice():
    def f(x):
        x[:, 1] = 2.5
        return x.sum()

    _no_fallback(f, torch.randn(3, 5))
