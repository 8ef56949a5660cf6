"""Partitioning for CUDA graphs (coil/runtime/cudagraph_split.py) on CPU: graphs with
a few un-graphable ops are split around them and the graphable pieces are recorded
into the tree (the fake recorder), with values equal to eager."""
import copy
import json

import pytest
import torch

import coil
from coil import trace
from coil.runtime import cudagraph_split, cudagraph_trees
from coil.runtime.cudagraph_record import ungraphable_node
from coil.runtime.cudagraph_trees import Tree
from fake_recorder import FakeRecorder

OPTS = {"capture_dynamic_output_shape_ops": True}


@pytest.fixture
def fake_cuda(monkeypatch, tmp_path):
    """The tree takes CPU tensors as if they were CUDA ones: CPU values are not a
    reason to split, the other reasons are."""
    tree = Tree(FakeRecorder())

    def not_cpu(node):
        why = ungraphable_node(node)
        return None if why is not None and "CPU tensor" in why else why

    monkeypatch.setattr(cudagraph_trees, "cuda_available", lambda: True)
    monkeypatch.setattr(cudagraph_trees, "ungraphable_reason", lambda gm: None)
    monkeypatch.setattr(cudagraph_trees, "pick_tree", lambda args: tree)
    monkeypatch.setattr(cudagraph_split, "ungraphable_node", not_cpu)
    old = trace.trace_dir()
    trace.set_dir(str(tmp_path))
    coil.reset()
    yield tree, tmp_path
    coil.reset()
    trace.set_dir(old)


def events(d, name):
    records = [json.loads(line) for f in d.glob("*.jsonl") for line in f.read_text().splitlines()]
    return [r for r in records if r["event"] == name]


def with_nonzero(x, w):
    y = torch.sin(x @ w) * 2
    k = torch.nonzero(y > 0).float().sum(0)    # a data-dependent size (un-graphable)
    return y.cos() + k[0], (y * 3).sum()


def test_split_around_a_data_dependent_op_records_the_rest(fake_cuda):
    tree, log = fake_cuda
    w = torch.randn(4, 4)
    cf = coil.compile(with_nonzero, mode="reduce-overhead", options=OPTS)
    for _ in range(4):
        x = torch.randn(3, 4)
        for got, want in zip(cf(x, w), with_nonzero(x, w)):
            torch.testing.assert_close(got, want)
    (split,) = events(log, "cudagraph_split")
    assert split["pieces"] == 3 and split["graphed"] == 2
    assert any("nonzero" in why for why in split["ungraphable"].values())
    # both graphable pieces recorded: the first at the root, the second after it
    (root,) = tree.roots
    assert tree.nodes == 2 and len(root.children) == 1 and tree.replays == 6
    assert not events(log, "cudagraph_skip")


def test_graphable_work_independent_of_the_sync_joins_the_first_piece():
    """Levels, not program order: ops that do not depend on an un-graphable op all go
    into the first piece, however they interleave with it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        a = x.sin()
        k = torch.nonzero(x).sum(0)          # un-graphable (nonzero, and a read of its size)
        b = a.cos()                          # independent of k
        return b * 2, a + k

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(3, device="meta"))
    levels, reasons = cudagraph_split.split_levels(gm)
    by_name = {n.name: lv for n, lv in levels.items()}
    assert sorted(n.name for n in reasons) == ["nonzero", "sum_1"]
    assert by_name["sin"] == by_name["cos"] == by_name["mul"] == 0
    assert by_name["add"] == 2 and set(levels.values()) == {0, 1, 2}


def test_training_step_split_matches_eager(fake_cuda, lockstep):
    tree, log = fake_cuda

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(6, 8), torch.nn.Linear(8, 1)

        def forward(self, x):
            h = torch.tanh(self.a(x))
            k = torch.nonzero(h > 0).float().sum()
            return self.b(h * (1 + k / 100))

    torch.manual_seed(0)
    m = M()
    m2 = copy.deepcopy(m)
    pairs = [(m, m), (coil.compile(m2, mode="reduce-overhead", options=OPTS), m2)]
    lockstep(pairs, lambda ps: torch.optim.AdamW(ps, lr=1e-2), [torch.randn(5, 6) for _ in range(5)],
             lambda out: out.square().mean())
    for p, p2 in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(p2, p, atol=1e-5, rtol=1e-4)
    assert [e["graph"] for e in events(log, "cudagraph_split")][:1] == ["forward"]
    kinds = {n.fn.kind for n in tree.all_nodes}
    assert "forward" in kinds and tree.replays > 0 and tree.recorder.stale == {}


def test_a_graph_that_is_all_ungraphable_is_not_split(fake_cuda, monkeypatch):
    """Nothing graphable around the un-graphable op (the ops after it read its
    data-dependent size): no split
    (the graph runs un-graphed as a whole, logged)."""
    tree, log = fake_cuda
    monkeypatch.setattr(cudagraph_trees, "ungraphable_reason", lambda gm: "a reason")
    f = coil.compile(lambda x: torch.nonzero(x).t() * 2, mode="reduce-overhead", options=OPTS)
    x = torch.tensor([0.0, 1.0, 2.0])
    for _ in range(3):
        torch.testing.assert_close(f(x), torch.nonzero(x).t() * 2)
    assert not events(log, "cudagraph_split") and tree.nodes == 0
    assert [e["reason"] for e in events(log, "cudagraph_skip")] == ["a reason"]


def test_cpu_round_trip_is_its_own_piece():
    """A copy to the CPU, CPU math and the copy back are un-graphable (a CUDA graph
    would keep the values of capture time); the ops after them are graphable again."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        y = x.sin()
        z = (y.cpu() * 2).to(x.device)
        return z + y

    gm = make_fx(f, tracing_mode="fake")(torch.randn(3, device="meta"))
    levels, reasons = cudagraph_split.split_levels(gm)
    assert [levels[n] for n in gm.graph.nodes if n in levels] == [0, 1, 1, 1, 2]
    assert [why.split(" at ")[0] for why in reasons.values()] == [
        "CPU tensor computed in the graph", "CPU tensor computed in the graph", "CPU tensor read"]
