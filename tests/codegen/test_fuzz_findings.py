"""Smallest inputs of the silent mismatches coil's differential fuzzer found
(docs/fuzzing.md), each checked against eager through ``coil.testing.fuzz.check``
(outputs, dtypes, strides of views, which input an output shares memory with, the
inputs afterwards) on both CPU kernel backends."""
import pytest
import torch

from coil.testing.fuzz import check

BACKENDS = ["cpp", "triton"]


def _ok(fn, make_inputs, backend):
    r = check(fn, make_inputs, backend)
    assert r.outcome == "ok", f"{r.outcome} {r.kind}: {r.detail}"


# -- views of inputs as another dtype (view(dtype)) --------------------------------

def _view_returned(a):
    a.relu_()
    return (a.view(torch.float32),)


def _write_through_view(a):
    v0 = a.view(torch.float64)  # an extern op whose output shares its argument's memory
    v0.fill_(-3.0)
    return (torch.softmax(v0, -1),)


def _sub_through_view(b):
    v1 = b.view(torch.int32)
    v1.sub_(torch.prod(b, dim=1).expand((1, 4)).to(torch.int32))
    return (v1,)


def _views_at_offsets(a):
    return a[1:].view(torch.int16), a[2:].view(torch.int64), a.view(torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,make_inputs", [
    (_view_returned, lambda: [torch.tensor(-3, dtype=torch.int32)]),
    (_write_through_view, lambda: [torch.tensor(-1, dtype=torch.int64)]),
    (_sub_through_view, lambda: [torch.ones(1, 4)]),
    (_views_at_offsets, lambda: [torch.arange(6, dtype=torch.int32)]),
], ids=["returned", "fill_", "sub_", "offsets"])
def test_view_as_dtype_of_input(fn, make_inputs, backend):
    _ok(fn, make_inputs, backend)
