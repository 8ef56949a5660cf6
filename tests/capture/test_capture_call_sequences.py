"""Regressions found by the call-sequence fuzzer (tools/fuzz_calls.py, docs/fuzzing.md): one compiled function called
on several inputs in turn, each call compared with eager."""
import pytest
import torch

import coil


def _rows_summed(a):
    a.t_()
    out = a[0]
    for i in range(1, a.shape[0]):  # pins the (transposed) dim to its size
        out = out + a[i]
    return out


@pytest.mark.parametrize("dynamic", [True, None])
def test_a_size_pinned_after_an_in_place_restride_is_guarded(dynamic):
    # fuzz_calls s100 #163 (`a.unsqueeze_(-3)` then `split(a, [3, 1], 2)`): the capture gives an input restrided in
    # place (`t_`, `unsqueeze_`) its call-time layout back after tracing, and a symbol pinned to a constant came back
    # as that int: the guard `a.size()[1] == 4` was lost, and a later size ran the entry (silently summing 4 rows)
    compiled = coil.compile(_rows_summed, dynamic=dynamic)
    for n in (3, 4, 5, 6, 4):
        x = torch.arange(3.0 * n).reshape(3, n)
        assert torch.equal(compiled(x.clone()), _rows_summed(x.clone())), n


def test_a_split_checked_after_an_in_place_unsqueeze_of_an_expanded_input():
    def fn(a):
        a.unsqueeze_(-3)
        return torch.split(a, [3, 1], 2)[1]

    compiled = coil.compile(fn, dynamic=True)
    assert torch.equal(compiled(torch.ones(1, 1).expand(6, 4)), fn(torch.ones(1, 1).expand(6, 4)))
    with pytest.raises(RuntimeError, match="split_with_sizes expects split_sizes to sum exactly to 3"):
        compiled(torch.ones(1, 1).expand(6, 3))


@pytest.mark.parametrize("dynamic", [False, True])
def test_index_add_refuses_a_source_of_another_shape(dynamic):
    # fuzz_calls s102 #99 (a resized input): eager refuses a source whose other dims differ from self's; the meta kernel
    # broadcast it, and coil added it into every column
    def fn(b, src):
        return b.index_add(0, torch.tensor([0, 0, 0]), src)

    compiled = coil.compile(fn, dynamic=dynamic)
    b, ok = torch.zeros(2, 5, dtype=torch.float64), torch.ones(3, 5, dtype=torch.float64)
    assert torch.equal(compiled(b, ok), fn(b, ok))
    with pytest.raises(RuntimeError, match="source tensor shape must match self tensor shape"):
        compiled(b, torch.ones(3, 1, dtype=torch.float64))
