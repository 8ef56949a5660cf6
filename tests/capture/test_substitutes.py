"""Checked substitutes capture records in place of torch functions
(coil/capture/substitutes.py): F.one_hot keeps eager's values, raises for a class out
of range (eager raises; the traced decomposition returned a zero row: user report 16)
and still fuses into one kernel."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import coil
from coil.capture.substitutes import one_hot

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "codegen"))
from codegen_helpers import check  # noqa: E402


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_one_hot_values(backend):
    i = torch.randint(0, 5, (3, 4), generator=torch.Generator().manual_seed(0))
    f = lambda v: F.one_hot(v, 5).float() * 2  # noqa: E731
    out = coil.compile(f, options={"cpu_backend": backend})(i)
    torch.testing.assert_close(out, f(i))
    assert coil.compile(lambda v: F.one_hot(v, 5))(i).dtype == torch.int64


@pytest.mark.parametrize("bad", [[1, 5, 2], [1, -1, 2]])
def test_one_hot_out_of_range_raises(bad):
    with pytest.raises(RuntimeError):
        F.one_hot(torch.tensor(bad), 4)
    with pytest.raises(IndexError, match="out of bounds"):
        coil.compile(lambda v: F.one_hot(v, 4).float() * 2)(torch.tensor(bad))


def test_one_hot_empty_and_data_dependent_classes():
    e = torch.empty(0, 2, dtype=torch.long)
    assert coil.compile(lambda v: F.one_hot(v, 3))(e).shape == (0, 2, 3)
    x = torch.tensor([0, 2, 1])
    torch.testing.assert_close(coil.compile(lambda v: F.one_hot(v))(x), F.one_hot(x))


def test_one_hot_substitute_is_one_kernel():
    i = torch.randint(0, 6, (7,), generator=torch.Generator().manual_seed(1))
    check(lambda v: one_hot(v, 6).float() * 2, i, kernels=1)


def test_one_hot_zero_classes_and_torch_compile():
    """num_classes=0 with a non-empty index raises (every class is out of range; the
    gather is empty, so no kernel check runs); under torch.compile(backend="coil") the
    substitute applies too, and the kernel error is also a RuntimeError (user report 17)."""
    with pytest.raises(RuntimeError):
        F.one_hot(torch.tensor([0]), 0)
    with pytest.raises(RuntimeError, match="smaller than num_classes"):
        coil.compile(lambda v: F.one_hot(v, 0))(torch.tensor([0]))
    assert coil.compile(lambda v: F.one_hot(v, 0))(torch.empty(0, dtype=torch.long)).shape == (0, 0)
    torch._dynamo.reset()
    try:
        with pytest.raises(RuntimeError, match="out of bounds"):
            torch.compile(lambda v: F.one_hot(v, 3), backend="coil")(torch.tensor([0, 4]))
    finally:
        torch._dynamo.reset()
    with pytest.raises(RuntimeError):   # coil.exc.KernelIndexError: IndexError and RuntimeError
        coil.compile(lambda v: F.one_hot(v, 3))(torch.tensor([0, 4]))
