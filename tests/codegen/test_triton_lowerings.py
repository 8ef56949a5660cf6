"""The lowering table of tests/ir run through Triton kernels (interpreter) vs eager.
A representative subset runs in CI; the whole table is marked slow."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ir"))
from test_reference_lowerings import CASES  # noqa: E402

from codegen_helpers import check  # noqa: E402

FAST = ["add", "int_remainder", "floor_divide", "where", "sum", "argmax", "amax", "prod", "any",
        "var_mean", "softmax", "layer_norm", "cross_entropy", "cat", "pad", "slice_scatter_step",
        "select_scatter", "embedding", "index_2d", "gather", "split", "tanh", "erfinv", "pow",
        "isnan", "to_half", "reshape", "as_strided", "arange_float", "index_put_acc", "scatter",
        "scatter_add", "embedding_backward"]


def _run(name):
    fn, *args = CASES[name]
    check(fn, *args, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FAST)
def test_triton_lowering_fast(name):
    _run(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(CASES) - set(FAST)))
def test_triton_lowering_all(name):
    _run(name)
