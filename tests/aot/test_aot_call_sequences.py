"""Regressions found by the call-sequence fuzzer (tools/fuzz_calls.py, docs/fuzzing.md): one compiled function called
on several inputs in turn, each call compared with eager."""
import torch

import coil


def test_float_argument_beside_a_metadata_mutation_under_dynamic_true():
    # fuzz_calls s1 #4: under dynamic=True a float argument is a 0-d tensor read with .item(); the fake run that takes
    # eager's layouts (an input restrided in place) detached the inputs and lost the float's symbol:
    # DataDependentOutputException at compile time
    def fn(c, p):
        c.transpose_(0, 1)
        return c * p

    compiled = coil.compile(fn, dynamic=True)
    for shape, p in (((3, 2), 0.25), ((4, 5), -1.5)):
        x = torch.randn(shape)
        y = x.clone()
        out = compiled(y, p)
        assert torch.equal(out, fn(x, p)) and y.shape == x.shape and y.stride() == x.stride()


def test_index_add_into_an_empty_tensor_ignores_its_indices():
    # fuzz_calls s103 #102 (a dim resized to 0): eager's index_add of a tensor with 2 or more dims and no elements
    # returns before it checks the indices; coil's scatter_add raised KernelIndexError
    def fn(b):
        v = b.narrow(0, 2, 2)
        v.index_add_(1, torch.tensor([0, 1, 1]), torch.full((2, 3), 7.0))
        return v * 2

    compiled = coil.compile(fn)
    for shape in ((5, 2), (5, 0)):
        x, y = torch.zeros(shape), torch.zeros(shape)
        assert torch.equal(compiled(x), fn(y)) and torch.equal(x, y)
