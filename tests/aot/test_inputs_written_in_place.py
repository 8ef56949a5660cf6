"""An inference graph's scatter of an input (index_copy_ / index_put_ / index_add_ / scatter_add_ of a KV cache or
a buffer) writes into the input itself instead of a copy the epilogue copies back (ir/graph.py,
``_write_inputs_in_place``); results, mutated inputs and version counters as in eager."""
import json
import os
import tempfile

import pytest
import torch

import coil
from coil import trace


def _records(run) -> list:
    d = tempfile.mkdtemp()
    trace.set_dir(d)
    try:
        run()
    finally:
        trace.set_dir(None)
    return [json.loads(ln) for f in os.listdir(d) if f.endswith(".jsonl") for ln in open(os.path.join(d, f))]


def _kv(cache, k, pos):
    cache.index_copy_(1, pos, k)
    return (cache * 2).sum(1)


def _acc(cache, k, pos):      # not idempotent: a second write of one call would show
    cache.index_add_(1, pos, k)
    return cache.sum()


def _put(cache, k, pos):
    cache[:, pos] = k
    return cache.mean()


def _scatter_view(cache, k, pos):   # returns a view of the written input
    cache.scatter_add_(1, pos.view(1, 1, 1).expand(3, 1, 4), k)
    return cache[:, :2]


def _old_value_read(cache, k, pos):  # the old value is read: no write in place
    s = cache.sum(1)
    cache.index_copy_(1, pos, k)
    return s + cache.sum(1)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("f,in_place", [(_kv, True), (_acc, True), (_put, True), (_scatter_view, True),
                                        (_old_value_read, False)])
def test_scatter_of_an_input_matches_eager(f, in_place, backend):
    torch.manual_seed(0)
    ref, k = torch.randn(3, 5, 4), torch.randn(3, 1, 4)
    cache = ref.clone()
    cf = coil.compile(f, options={"cpu_backend": backend})

    def run():
        for step in range(3):
            pos = torch.tensor([step])
            v0 = cache._version
            torch.testing.assert_close(cf(cache, k, pos), f(ref, k, pos))
            torch.testing.assert_close(cache, ref)
            assert cache._version > v0  # eager's in-place op bumps it; the graph's write does too
    written = [r for r in _records(run) if r["event"] == "inputs_written_in_place"]
    assert bool(written) == in_place


def test_decode_step_writes_its_kv_cache_in_place():
    """The wrapper scatters into the cache (``bufN = primals_k``) and copies no cache."""
    cf = coil.compile(_kv)
    cache, ref, k = torch.zeros(2, 6, 3), torch.zeros(2, 6, 3), torch.randn(2, 1, 3)

    def run():
        for step in range(2):
            torch.testing.assert_close(cf(cache, k, torch.tensor([step])), _kv(ref, k, torch.tensor([step])))
    recs = _records(run)
    assert any(r["event"] == "inputs_written_in_place" for r in recs)
    src = next(r["text"] for r in recs if r["event"] == "artifact" and r["name"].startswith("wrapper"))
    assert "= primals_1  # scatter into its target" in src or "= arg0_1  # scatter into its target" in src, src
    torch.testing.assert_close(cache, ref)


def test_option_off_copies_back(monkeypatch):
    from coil.config import config

    monkeypatch.setattr(config, "inplace_input_writes", False)
    cache, ref, k = torch.zeros(2, 6, 3), torch.zeros(2, 6, 3), torch.randn(2, 1, 3)
    cf = coil.compile(_acc)
    for step in range(2):
        torch.testing.assert_close(cf(cache, k, torch.tensor([step])), _acc(ref, k, torch.tensor([step])))
    torch.testing.assert_close(cache, ref)
