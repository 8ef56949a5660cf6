"""Regressions from new-user trial 59 (FINDINGS_59.md): training loops with optimizers other than AdamW, torch.func
inside compiled functions, nn.MultiheadAttention / Transformer / RNN modules, in-place ops on views of inputs,
scatter / index_put with duplicates, integer and bool dtype corners, dynamic shapes, reduce-overhead on CPU, graph
breaks in training, and numpy code in traced frames.

The xfail(strict=True) tests are open bugs: each fails today and starts passing (so must lose its mark) once fixed.
"""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed): numpy's Python-level functions in _NUMPY_PURE (np.eye, np.linspace, np.ones, np.tril, ...) were
# inlined, not folded, and ``ndarray.flat`` of a folded (read-only) array was a constant flatiter over it: np.eye's
# ``m[:M - k].flat[i::M + 1] = 1`` broke the graph with that flatiter on the stack, and the resumed frame wrote into
# the read-only snapshot (ValueError where eager runs; had it been writable the write would have missed the copy
# the resume got). Now those functions fold on constants, and ``.flat`` is a graph break.
# ---------------------------------------------------------------------------------------------------------------

def test_np_eye_in_a_compiled_function(coil_reset):
    def f(x):
        a = np.zeros((2, 2)) + np.eye(2) * 3
        return x @ torch.from_numpy(a).float()

    x = torch.randn(2, 2)
    torch.testing.assert_close(coil.compile(f)(x), f(x))
    assert coil.capture.stats["fallbacks"] == 0


def test_write_through_flat_of_a_numpy_array_made_in_the_frame(coil_reset):
    def f(x):
        a = np.zeros(4)
        fl = a.flat
        fl[1] = 5
        return x * float(a.sum())

    x = torch.randn(3)
    torch.testing.assert_close(coil.compile(f)(x), f(x))
