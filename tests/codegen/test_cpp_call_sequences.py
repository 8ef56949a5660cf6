"""Regressions found by the call-sequence fuzzer (tools/fuzz_calls.py, docs/fuzzing.md)."""
import pytest
import torch

import coil
from coil.exc import KernelIndexError


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_into_an_empty_dim_raises_instead_of_faulting(accumulate):
    # fuzz_calls s100 #33: a program with a literal index, called again with that dim resized to 0 (a static entry for
    # size 0): eager raises IndexError; the C++ kernel's failed check returned index 0 and then read (and wrote) the
    # empty tensor there: a segmentation fault
    def get(a):
        return a[torch.tensor([0])] + 1

    def put(a):
        return a.index_put((torch.tensor([0]),), torch.tensor(1.0), accumulate=accumulate)

    for fn in (get, put):
        compiled = coil.compile(fn)
        assert torch.equal(compiled(torch.ones(3, 2)), fn(torch.ones(3, 2)))
        with pytest.raises(IndexError):
            fn(torch.ones(0, 2))
        with pytest.raises(KernelIndexError, match="out of bounds for dimension with size 0"):
            compiled(torch.ones(0, 2))


def test_as_strided_past_a_dtype_view_of_a_written_slice():
    # fuzz_calls s200 #158 (a straight-line program: its first call); coil's aot_eager and torch's are right
    def fn(a):
        v1 = torch.split(a, [2, 4], 0)[0].view(torch.int32)
        v1.mul_(-3)
        return v1.as_strided((1, 1), (1, 2), 5) + 0

    a = torch.arange(6.0).reshape(6, 1)
    assert torch.equal(coil.compile(fn)(a.clone()), fn(a.clone()))
