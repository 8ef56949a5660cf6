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
