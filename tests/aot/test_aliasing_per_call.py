"""The per-call aliasing check of graphs that mutate an input (coil/aot/compile.py ``_check_aliasing_per_call``) sends
every aliased call to eager, also right after unaliased calls that ran compiled. (A faster test of each mutated input's
storage use count alone was tried: the fake-tensor conversion of compile time keeps one more reference to every input's
storage, so it never held; these cases would catch a looser test.)"""
import pytest
import torch

from coil.aot import aot_compile
from coil.aot.backend import run_graph


def f(x, y):
    x.mul_(2)
    return y + 1


def _aliased(case):
    if case == "same tensor twice":
        a = torch.ones(4)
        return a, a
    b = torch.arange(6.0)
    if case == "overlapping views":
        return b[:4], b[2:]
    if case == "mutated input is a view of the other":
        return b[2:], b[:4]
    return b[:4], b.view(6)[:4]  # the same memory through two views


@pytest.mark.parametrize("case", ["same tensor twice", "overlapping views", "mutated input is a view of the other",
                                  "two views of one base"])
def test_aliased_call_after_unaliased_calls_runs_eagerly(case):
    c = aot_compile(f, [torch.ones(4), torch.ones(4)], run_graph)
    for _ in range(2):  # compiled
        x, y = torch.ones(4), torch.ones(4)
        torch.testing.assert_close(c(x, y), torch.full((4,), 2.0))
        torch.testing.assert_close(x, torch.full((4,), 2.0))
    x, y = _aliased(case)
    rx, ry = _aliased(case)  # the same aliasing over fresh memory: eager's values
    ref = f(rx, ry)
    torch.testing.assert_close(c(x, y), ref)
    torch.testing.assert_close(x, rx)


def test_mutated_input_with_a_view_held_elsewhere():
    # its storage is used twice, but not by another input: distinct storages, compiled
    c = aot_compile(f, [torch.ones(4), torch.ones(4)], run_graph)
    x, y = torch.ones(4), torch.ones(4)
    view = x[:2]
    torch.testing.assert_close(c(x, y), torch.full((4,), 2.0))
    torch.testing.assert_close(view, torch.full((2,), 2.0))
    x, y = torch.ones(4), torch.ones(4)
    torch.testing.assert_close(c(x, y), torch.full((4,), 2.0))
    torch.testing.assert_close(x, torch.full((4,), 2.0))


def test_check_keys_storages_by_their_python_object():
    # the cases above then test the storage-object key (one object per storage, views included), not the id fallback
    from coil.aot.compile import _storage_key
    assert _storage_key is torch.Tensor.untyped_storage
    b = torch.arange(6.0)
    assert len({_storage_key(b[:4]), _storage_key(b.view(6)[2:]), _storage_key(torch.ones(2))}) == 2


def test_aliased_subclass_whose_storage_cannot_be_read_runs_eagerly():
    # the full check read untyped_storage() of every input and raised where a wrapper subclass has none (a TwoTensor
    # beside aliased inputs); such a call now runs eagerly like any call the check cannot clear
    class NoStorage(torch.Tensor):
        def untyped_storage(self):
            raise RuntimeError("invalid python storage")

    c = aot_compile(f, [torch.ones(4), torch.ones(4)], run_graph)
    c(torch.ones(4), torch.ones(4))
    a = torch.ones(4)
    out = c(a, a.as_subclass(NoStorage))
    torch.testing.assert_close(a, torch.full((4,), 2.0))
    torch.testing.assert_close(out.as_subclass(torch.Tensor), torch.full((4,), 3.0))
