"""The bookkeeping of CUDA graph trees (coil/runtime/cudagraph_trees.py) on CPU, with
the fake recorder (a "replay" recomputes into the recorded output memory): warm-up,
recording, paths, divergence, steps, pending backwards, in-place and copied inputs,
stale outputs, record limits and fallback reasons."""
import json
import os
import types

import pytest
import torch

import coil
from coil import trace
from coil.config import config
from coil.runtime.cudagraph_record import ungraphable_reason
from coil.runtime import cudagraph_trees
from coil.runtime.cudagraph_trees import GraphFunction, Tree
from fake_recorder import FakeRecorder


@pytest.fixture
def log_dir(tmp_path):
    old = trace.trace_dir()
    trace.set_dir(str(tmp_path))
    yield tmp_path
    trace.set_dir(old)


def events(d, name):
    out = []
    for f in os.listdir(d):
        if f.endswith(".jsonl"):
            with open(os.path.join(d, f)) as fh:
                out += [r for r in map(json.loads, fh) if r["event"] == name]
    return out


def make(kind="inference", saved=None, limit=8, body=None, device_type="cpu"):
    tree = Tree(FakeRecorder(device_type))
    body = body or (lambda x, w: (x @ w + 1,))
    return tree, GraphFunction(body, kind, saved, tree=tree, limit=limit)


def test_warm_up_then_record_then_replay_equal_eager():
    tree, f = make()
    w = torch.randn(4, 4)
    for step in range(4):
        x = torch.randn(3, 4)
        (out,) = f(x, w)
        torch.testing.assert_close(out, x @ w + 1)
    rec = tree.recorder
    assert rec.captures == 1 and rec.replays == 3
    assert tree.nodes == 1 and tree.roots[0].copied == [0]
    # w is the same object as on the warm-up call: read in place, guarded by address
    assert tree.roots[0].inplace == [(1, w.data_ptr())]


def test_the_step_after_a_recording_releases_the_cache_once():
    """The warm-up call's outputs, still held when the graph is captured, kept their default-pool segments cached
    after the caller dropped them (GPT-2 at 8 x 64 held 49 MiB more than torch.compile): the first step after a
    recording releases the cache again, and later steps do not."""
    tree, f = make()
    w = torch.randn(4, 4)
    for _ in range(2):   # warm-up, then the recording
        f(torch.randn(2, 4), w)
    assert tree.recorder.releases == 0
    for _ in range(3):   # replays, each call a new step
        f(torch.randn(2, 4), w)
    assert tree.recorder.releases == 1


def test_outputs_live_in_recorded_memory_and_stale_ones_are_poisoned():
    tree, f = make()
    w = torch.randn(4, 4)
    f(torch.randn(2, 4), w)                      # warm-up
    (a,) = f(torch.randn(2, 4), w)               # recorded
    x = torch.randn(2, 4)
    (b,) = f(x, w)                                # a new step: the root replays over a
    assert a.data_ptr() == b.data_ptr()
    assert tree.recorder.is_stale(a) and not tree.recorder.is_stale(b)
    torch.testing.assert_close(b, x @ w + 1)
    del a
    (c,) = f(torch.randn(2, 4), w)
    assert tree.recorder.is_stale(b) and not tree.recorder.is_stale(c)


def test_dropped_outputs_are_not_poisoned():
    tree, f = make()
    w = torch.randn(4, 4)
    for _ in range(3):
        f(torch.randn(2, 4), w)
    assert tree.recorder.stale == {}


def test_divergence_records_a_new_path_and_steps_restart_at_the_root():
    tree = Tree(FakeRecorder())
    f = GraphFunction(lambda x: (x * 2,), "inference", tree=tree)
    g = GraphFunction(lambda x: (x + 1,), "inference", tree=tree)
    h = GraphFunction(lambda x: (x - 1,), "inference", tree=tree)
    x = torch.randn(5)
    for _ in range(3):                           # path f -> g
        (y,) = f(x)
        (z,) = g(y)
        torch.testing.assert_close(z, x * 2 + 1)
    for _ in range(3):                           # diverges after f: f -> h
        (y,) = f(x)
        (z,) = h(y)
        torch.testing.assert_close(z, x * 2 - 1)
    assert len(tree.roots) == 1
    root = tree.roots[0]
    assert [c.fn for c in root.children] == [g, h]
    assert tree.nodes == 3 and tree.recorder.captures == 3
    # g and h read f's output in place (it lives in the pool at its recorded address)
    assert all(c.copied == [] and c.inplace[0][0] == 0 for c in root.children)


def test_same_graph_twice_in_a_step_while_a_backward_is_pending_gets_a_child():
    tree, f = make(kind="forward", saved=(1, 2), body=lambda x: (x.sin(), x.cos()))
    x1, x2 = torch.randn(3), torch.randn(3)
    f(x1)                                        # warm-up
    a, sa = f(x1)                                # root; sa is "saved for backward"
    b, sb = f(x2)                                # sa still held: a child, a stays valid
    assert tree.path[-1].depth == 1
    torch.testing.assert_close(a, x1.sin())
    torch.testing.assert_close(b, x2.sin())
    assert tree.recorder.stale == {}
    del sa, sb                                   # "backward ran": a new step from the root
    c, sc = f(x1)
    assert tree.path == [tree.roots[0]] and tree.steps == 1
    torch.testing.assert_close(c, x1.sin())


def test_mark_step_begin_restarts_even_with_pending_backward():
    tree, f = make(kind="forward", saved=(1, 2), body=lambda x: (x.sin(), x.cos()))
    x = torch.randn(3)
    f(x)
    keep = f(x)
    coil.cudagraph_mark_step_begin()
    f(x)
    assert tree.nodes == 1 and tree.steps == 1
    assert tree.recorder.is_stale(keep[0])


def test_backward_is_never_a_new_step():
    tree = Tree(FakeRecorder())
    fw = GraphFunction(lambda x: (x * 3, x), "forward", (1, 2), tree=tree)
    bw = GraphFunction(lambda s, g: (g * 3,), "backward", tree=tree)
    x = torch.randn(4)
    for _ in range(4):
        out, saved = fw(x)
        (gx,) = bw(saved, torch.ones(4))
        torch.testing.assert_close(gx, torch.full((4,), 3.0))
        del out, saved, gx
    assert tree.nodes == 2 and tree.roots[0].children[0].fn is bw


def test_output_fed_back_is_copied_then_poisoned():
    """A decoding loop ``x = f(x)``: the previous output is copied into the placeholder
    before the replay overwrites it."""
    tree, f = make(body=lambda x: (x * 0.5 + 1,))
    x = torch.randn(6)
    ref = x.clone()
    for _ in range(5):
        (x,) = f(x)
        ref = ref * 0.5 + 1
    torch.testing.assert_close(x, ref)


def test_moved_static_input_rerecords_with_a_copy(log_dir):
    tree, f = make()
    w = torch.randn(4, 4)
    x = torch.randn(2, 4)
    f(x, w)
    f(x, w)
    w2 = torch.randn(4, 4)                       # another tensor at that argument
    (out,) = f(x, w2)
    torch.testing.assert_close(out, x @ w2 + 1)
    assert tree.nodes == 2 and 1 in tree.roots[1].copied
    (out,) = f(x, torch.randn(4, 4) + 0)         # copied from now on: no new recording
    assert tree.nodes == 2
    assert events(log_dir, "cudagraph_rerecord")[0]["reason"].startswith("arguments [1]")


def test_record_limit_bounds_recordings_per_graph(log_dir):
    tree, f = make(limit=2, body=lambda x: (x + 1,))
    for n in (1, 2, 3, 4):
        for _ in range(2):
            x = torch.randn(n)
            (out,) = f(x)
            torch.testing.assert_close(out, x + 1)
    assert tree.nodes == 2
    skips = events(log_dir, "cudagraph_skip")
    assert len(skips) == 1 and "record limit" in skips[0]["reason"]


def test_outputs_aliasing_inputs_are_views_of_this_calls_argument():
    tree, f = make(body=lambda x: (x, x.t(), x[1:] * 2))
    for _ in range(3):
        x = torch.randn(3, 4)
        a, b, c = f(x)
        assert a is x and b.data_ptr() == x.data_ptr()
        assert b.shape == (4, 3)
        torch.testing.assert_close(c, x[1:] * 2)


def test_rebuilt_outputs_keep_their_kinds_and_order_on_every_replay():
    """The rebuild's template (OutputPlan.build, made at record time): constants, arguments handed back as the
    caller's objects, views of an argument and new memory, interleaved, as a tuple or a list, on each replay."""
    for wrap in (tuple, list):
        tree, f = make(body=lambda x, w: wrap((3, w, x * 2, None, x[1:], w + x, 2.5)))
        w = torch.nn.Parameter(torch.randn(3, 4))
        for _ in range(4):
            x = torch.randn(3, 4)
            out = f(x, w)
            assert type(out) is wrap and len(out) == 7
            assert out[0] == 3 and out[1] is w and out[3] is None and out[6] == 2.5
            torch.testing.assert_close(out[2], x * 2)
            torch.testing.assert_close(out[4], x[1:])
            torch.testing.assert_close(out[5], w + x)
        assert tree.recorder.captures == 1 and tree.replays >= 2


def test_rebuilt_outputs_keep_each_outputs_dtype_and_are_new_tensors_each_replay():
    """Outputs are started from an empty tensor of their own dtype (OutputPlan.build): a view of an argument as
    another dtype and new memory of other dtypes come back with eager's dtypes, values and layouts, as new objects."""
    tree, f = make(body=lambda x: (x.view(torch.int32), x > 0, x.sum(1, dtype=torch.float64), x.t()[1:]))
    seen = []
    for _ in range(4):
        x = torch.randn(3, 4)
        out = f(x)
        ref = (x.view(torch.int32), x > 0, x.sum(1, dtype=torch.float64), x.t()[1:])
        for o, r in zip(out, ref):
            assert (o.dtype, o.shape, o.stride()) == (r.dtype, r.shape, r.stride()) and not o.requires_grad
            torch.testing.assert_close(o, r)
        assert out[0].data_ptr() == x.data_ptr() and not any(o is p for o in out for p in seen)
        seen = list(out)
    assert tree.recorder.captures == 1 and tree.replays >= 2


def test_cpu_tensors_fall_back_with_a_reason(log_dir):
    tree, f = make(device_type="cuda")
    x, w = torch.randn(2, 4), torch.randn(4, 4)
    for _ in range(3):
        torch.testing.assert_close(f(x, w)[0], x @ w + 1)
    assert tree.nodes == 0 and f.skip.startswith("CPU tensors")
    assert [e["reason"] for e in events(log_dir, "cudagraph_skip")] == [f.skip]


def _graph(op, **kwargs):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(op, (x,), kwargs),))
    return types.SimpleNamespace(graph=g)  # a GraphModule cannot print a Generator


def test_ungraphable_reasons():
    from torch.fx.experimental.proxy_tensor import make_fx

    aten = torch.ops.aten
    assert "_local_scalar_dense" in ungraphable_reason(_graph(aten._local_scalar_dense.default))
    assert "nonzero" in ungraphable_reason(_graph(aten.nonzero.default))
    assert "RNG" in ungraphable_reason(_graph(aten.bernoulli.default, generator=torch.Generator()))
    # a graph of CPU tensors only says so (not "CPU tensor computed at <its first op>")
    assert "runs on the CPU only" in ungraphable_reason(make_fx(lambda x: x.sin() + 1)(torch.randn(3)))
    assert ungraphable_reason(make_fx(lambda x: x.sin() + 1)(torch.randn(3, device="meta"))) is None


def test_compile_reduce_overhead_on_cpu_runs_compiled_and_logs_why(log_dir):
    """Graphs of CPU tensors are not recorded; they still run compiled."""
    def f(x):
        return torch.relu(x) * 2

    cf = coil.compile(f, mode="reduce-overhead")
    x = torch.randn(8)
    torch.testing.assert_close(cf(x), f(x))
    reasons = [e["reason"] for e in events(log_dir, "cudagraph_skip")]
    assert reasons and all("CUDA" in r or "CPU" in r for r in reasons)


def test_reduce_overhead_on_cpu_warns_that_the_graph_is_cpu_only():
    """A CPU model under mode="reduce-overhead": the warning names the cause (no CUDA, or
    the graph runs on the CPU), not the first CPU op of the graph (a permute for a Linear)."""
    coil.reset()
    cudagraph_trees._WARNED.clear()
    f = coil.compile(torch.nn.Linear(8, 8), mode="reduce-overhead")
    cause = "CUDA is not available" if not torch.cuda.is_available() else "runs on the CPU only"
    with pytest.warns(UserWarning, match=cause) as w:
        f(torch.randn(2, 8))
    assert not any("permute" in str(x.message) for x in w)


def test_a_saved_tensor_that_is_also_a_user_output_does_not_hold_the_step():
    """The caller may keep an output the backward also saved: the forward is not
    pending because of it, so the next call still starts a new step."""
    tree, f = make(kind="forward", saved=(1, 2), body=lambda x: (x * 2,) * 2)
    x = torch.randn(3)
    kept = [f(x)[0] for _ in range(4)]
    assert tree.nodes == 1 and tree.steps == 2
    assert tree.recorder.is_stale(kept[1]) and not tree.recorder.is_stale(kept[3])


@pytest.fixture
def fake_cuda(monkeypatch):
    """The AOT runtime's graphs go to a tree with the fake recorder on CPU."""
    from coil.runtime import cudagraph_trees

    tree = Tree(FakeRecorder())
    monkeypatch.setattr(cudagraph_trees, "cuda_available", lambda: True)
    monkeypatch.setattr(cudagraph_trees, "ungraphable_reason", lambda gm: None)
    monkeypatch.setattr(cudagraph_trees, "pick_tree", lambda args: tree)
    coil.reset()
    yield tree
    coil.reset()


def test_aot_inference_through_the_tree(fake_cuda):
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    cm = coil.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(3, 8)
            torch.testing.assert_close(cm(x), m(x))
    root = fake_cuda.roots[0]
    assert fake_cuda.nodes == 1 and len(root.copied) == 1 and len(root.inplace) == 4
    assert fake_cuda.replays == 3


@pytest.fixture
def reuse_saved(monkeypatch):
    """config.cudagraph_reuse_saved on (the default; tests that need it say so)."""
    monkeypatch.setattr(config, "cudagraph_reuse_saved", True)


def test_aot_training_through_the_tree(fake_cuda, lockstep, reuse_saved):
    import copy

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    m2 = copy.deepcopy(m)
    lockstep([(m, m), (coil.compile(m2, mode="reduce-overhead"), m2)],
             lambda ps: torch.optim.AdamW(ps, lr=1e-2), [torch.randn(4, 8) for _ in range(5)],
             lambda out: out.square().mean())
    for p, p2 in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(p2, p, atol=1e-5, rtol=1e-4)
    fw = fake_cuda.roots[0]
    assert fw.fn.kind == "forward" and [c.fn.kind for c in fw.children] == ["backward"]
    bw = fw.children[0]
    # the backward reads the forward's saved activations and the parameters in place
    assert fake_cuda.nodes == 2 and fake_cuda.replays == 8  # 4 steps after the warm-up
    assert len(bw.copied) <= 2, bw.copied
    # its recording was lent the forward's own tensors of its saved-only outputs (the
    # forward node stops owning them) and ran call_boxed, which releases each after its
    # last use: on CUDA that memory serves the backward's later allocations
    assert fw.saved_slots and bw.consumes == {fw: fw.saved_slots}
    lent = {fw.plan.slots[k][0] for k in fw.saved_slots}
    assert not any(o.untyped_storage().data_ptr() in lent for o in fw.plan.owned)
    src = bw.fn.fn.source
    assert "def call_boxed(args):" in src and "args.clear()" in src
    assert src.count("del tanh") == 1  # the saved tanh output, released in call_boxed only


def test_backward_output_in_lent_saved_memory_is_its_own_slot(reuse_saved, monkeypatch):
    """A backward's recording is lent the forward's saved-only outputs and releases them; the
    CUDA allocator then hands that memory to the backward's own outputs. Such an output was
    taken for a view of the lent argument and rebuilt over the argument's (smaller) storage
    at each replay: "Trying to resize storage that is not resizable" on the H200. It is a
    slot of the backward node. The fake capture reuses the memory as the allocator does."""
    import coil.runtime.cudagraph_trees as ct

    monkeypatch.setattr(ct, "_keep_graph", lambda: False)  # as inside loss.backward()
    tree = Tree(FakeRecorder())
    fw = GraphFunction(lambda x: (x * 2, (x * 3).exp()), "forward", saved=(1, 2), tree=tree)

    class Backward:
        def __call__(self, s, g):
            return (g * s,)

        def call_boxed(self, args):
            s, g = args
            args.clear()
            out = torch.empty(0).set_(s.untyped_storage(), s.storage_offset(), g.shape, g.stride())
            return (torch.mul(g, s, out=out),)  # s's last use: its memory is the output's

    bw = GraphFunction(Backward(), "backward", tree=tree)
    for _ in range(4):
        x, g = torch.randn(5), torch.randn(5)
        out, saved = fw(x)
        (grad,) = bw(saved, g)
        del saved
        torch.testing.assert_close(out, x * 2)
        torch.testing.assert_close(grad, g * (x * 3).exp())
    node = next(n for n in tree.all_nodes if n.fn is bw)
    assert node.consumes and [it[0] for it in node.plan.items] == ["slot"]


def test_aot_mutated_input_through_the_tree(fake_cuda):
    def f(x, buf):
        buf.add_(x)
        return buf * 2

    cf = coil.compile(f, mode="reduce-overhead")
    buf, ref = torch.zeros(5), torch.zeros(5)
    for _ in range(4):
        x = torch.randn(5)
        torch.testing.assert_close(cf(x, buf), f(x, ref))
        torch.testing.assert_close(buf, ref)
    assert fake_cuda.nodes == 1


def test_graphs_after_a_graph_break_are_children_of_the_first(fake_cuda):
    def f(x):
        y = x.sin() * 2
        print("a graph break")
        return y.cos() + 1

    cf = coil.compile(f, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(5)
        torch.testing.assert_close(cf(x), f(x))
    (root,) = fake_cuda.roots
    assert len(root.children) == 1 and root.children[0].fn is not root.fn
    # the resume function's graph reads the first graph's output in place
    assert len(root.children[0].inplace) == 1 and fake_cuda.nodes == 2 and fake_cuda.replays == 6


def test_dynamic_shapes_record_one_node_per_size(fake_cuda):
    g = coil.compile(lambda x: (x * 3).sum(0), mode="reduce-overhead", dynamic=True)
    for n in (3, 4, 5) * 3:
        x = torch.randn(n, 2)
        torch.testing.assert_close(g(x), (x * 3).sum(0))
    sizes = sorted(r.sig[0][0][0] for r in fake_cuda.roots)
    assert sizes == [3, 4, 5] and len({r.fn for r in fake_cuda.roots}) == 1


def test_gradient_accumulation_keeps_the_first_backwards_gradients(fake_cuda):
    """``.grad`` holds the first backward's output while later micro-batches run: no
    replay overwrites it (neither the backward's own nor an earlier node's, whose
    intermediates may share its memory)."""
    import copy

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    m2 = copy.deepcopy(m)
    cm = coil.compile(m2, mode="reduce-overhead")
    opts = [torch.optim.SGD(p.parameters(), lr=0.1) for p in (m, m2)]
    for _ in range(4):
        xs = [torch.randn(4, 8) for _ in range(3)]
        for model, opt in zip((m, cm), opts):
            opt.zero_grad()
            for x in xs:
                model(x).square().mean().backward()
            opt.step()
    for p, p2 in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(p2, p, atol=1e-5, rtol=1e-4)
    assert fake_cuda.recorder.stale == {}
    # the second and third micro-batches run their forward un-graphed (the first
    # backward's gradients are alive) and their backward from a root recording
    assert fake_cuda.nodes <= 6


def test_an_input_no_placeholder_can_hold_falls_back(log_dir):
    """An expanded (stride 0) argument cannot be copied into a placeholder of its
    layout: the graph runs un-graphed, with the reason logged."""
    tree, f = make(body=lambda x: (x * 2,))
    for _ in range(3):
        x = torch.randn(1, 8).expand(4, 8)
        torch.testing.assert_close(f(x)[0], x * 2)
    assert tree.nodes == 0 and f.skip.startswith("cannot record")
    assert [e["reason"] for e in events(log_dir, "cudagraph_skip")] == [f.skip]


@pytest.mark.parametrize("kind", ["right", "raises", "wrong"])
def test_fast_tensor_constructor_is_checked_before_use(monkeypatch, kind):
    """Outputs are built with torch's C constructor where it exists (CUDA builds) only
    after it is seen to build the requested tensor; otherwise with ``set_``."""
    from coil.runtime import cudagraph_record as rec

    def fake(meta, storage):
        if kind == "raises":
            raise TypeError("another signature")
        t = torch.empty((0,), dtype=meta["dtype"]).set_(storage, meta["storage_offset"],
                                                         meta["size"], meta["stride"])
        return t if kind == "right" else t.t()

    monkeypatch.setattr(rec, "_from_metadata", fake)
    monkeypatch.setattr(rec, "_from_metadata_checked", False)
    base = torch.arange(12.0)
    st = base.untyped_storage()
    meta = {"size": (3, 2), "stride": (2, 1), "dtype": torch.float32, "storage_offset": 4}
    for _ in range(2):
        t = rec._tensor_over(st, torch.float32, (3, 2), (2, 1), 4, meta)
        torch.testing.assert_close(t, base[4:10].view(3, 2))
    assert (rec._from_metadata is fake) == (kind == "right")


def test_fallback_reasons_show_in_the_report(log_dir, tmp_path):
    from coil.trace.report import write_report

    tree, f = make(device_type="cuda")
    f(torch.randn(2, 4), torch.randn(4, 4))
    index = write_report(str(log_dir), str(tmp_path / "report"))
    pages = "".join(open(os.path.join(os.path.dirname(index), p)).read()
                    for p in os.listdir(os.path.dirname(index)) if p.endswith(".html"))
    assert "cudagraph_skip" in pages and "CPU tensors: input 0 is on cpu" in pages


def _dropout_a(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) * 3


def _dropout_b(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) * 3


def test_random_ops_draw_what_an_ungraphed_run_draws(fake_cuda):
    """After ``torch.manual_seed``, warm-up, recording and replay calls give the numbers
    the compiled graph gives without CUDA graphs: a capture draws nothing."""
    graphed, plain = coil.compile(_dropout_a, mode="reduce-overhead"), coil.compile(_dropout_b)
    x = torch.ones(256)
    for seed in range(4):
        torch.manual_seed(seed)
        a = graphed(x).clone()
        torch.manual_seed(seed)
        torch.testing.assert_close(a, plain(x), rtol=0, atol=0)
    assert fake_cuda.nodes == 1 and fake_cuda.replays == 3


def test_dropout_backward_uses_the_forwards_mask(fake_cuda):
    """Forward and backward replays agree on the mask: the gradient is zero exactly where
    the output was dropped."""
    f = coil.compile(lambda x: torch.nn.functional.dropout(x, 0.5, training=True) * 3,
                     mode="reduce-overhead")
    for _ in range(4):
        x = torch.ones(512, requires_grad=True)
        out = f(x)
        out.sum().backward()
        torch.testing.assert_close(x.grad, (out != 0).float() * 6, rtol=0, atol=0)
    assert fake_cuda.replays >= 4


def test_release_cache_before_capture_is_logged_and_optional(log_dir, monkeypatch):
    """``CudaRecorder.release_cache`` (run before each capture) empties the caching
    allocator's default pool and logs what it freed; ``cudagraph_release_cache=False``
    leaves it alone. (The GPU test checks the memory itself.)"""
    from coil.config import config
    from coil.runtime.cudagraph_record import CudaRecorder

    reserved = iter([300 * 2**20, 100 * 2**20])
    emptied = []
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: next(reserved))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    rec = object.__new__(CudaRecorder)
    rec.device = torch.device("cuda", 0)
    monkeypatch.setattr(config, "cudagraph_release_cache", False)
    rec.release_cache()
    assert not emptied
    monkeypatch.setattr(config, "cudagraph_release_cache", True)
    rec.release_cache()
    assert emptied == [1]
    (e,) = events(log_dir, "cudagraph_release_cache")
    assert e["freed_mb"] == 200.0


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.GELU(), torch.nn.Linear(16, 1))


def test_backward_keeps_the_saved_memory_when_reuse_is_off(fake_cuda, monkeypatch):
    from coil.config import config

    monkeypatch.setattr(config, "cudagraph_reuse_saved", False)
    cm = coil.compile(_mlp(), mode="reduce-overhead")
    for _ in range(3):
        cm(torch.randn(4, 8)).square().mean().backward()
    fw, bw = fake_cuda.all_nodes
    assert bw.consumes == {} and len(fw.plan.owned) == len(fw.plan.slots) + 3  # + parameters


def test_retain_graph_runs_the_reusing_backward_ungraphed(fake_cuda, log_dir, reuse_saved):
    """A backward whose recording reused the saved memory would overwrite values that a
    second backward reads again: a backward with ``retain_graph=True`` runs un-graphed,
    the last one replays."""
    import copy

    m = _mlp()
    m2 = copy.deepcopy(m)
    cm = coil.compile(m2, mode="reduce-overhead")
    for _ in range(3):
        cm(torch.randn(4, 8)).square().mean().backward()
    for p, p2 in zip(m.parameters(), m2.parameters()):
        p.grad, p2.grad = None, None
    x = torch.randn(4, 8)
    replays = fake_cuda.replays
    for model in (m, cm):
        loss = model(x).square().mean()
        loss.backward(retain_graph=True)
        loss.backward()
    for p, p2 in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(p2.grad, p.grad, atol=1e-5, rtol=1e-4)
    # the forward and the last backward replay; the first backward (retain_graph) does not
    assert fake_cuda.replays == replays + 2
    assert any("retain_graph" in e["reason"] for e in events(log_dir, "cudagraph_skip"))


def test_no_recording_while_reused_saved_values_wait_for_their_backward(fake_cuda, log_dir,
                                                                     reuse_saved):
    """Once a backward's recording reused a forward's saved memory, a recording made
    after that may overlap it: while the forward's saved values wait for their backward,
    a new recording is not made and a node recorded since does not replay (both run
    un-graphed); once the backward has run they record and replay."""
    cm = coil.compile(_mlp(), mode="reduce-overhead")
    g = coil.compile(lambda y: (y * 3).sin(), mode="reduce-overhead")
    for _ in range(3):
        cm(torch.randn(4, 8)).square().mean().backward()
    assert fake_cuda.nodes == 2
    loss = cm(torch.randn(4, 8)).square().mean()   # the forward replays; its saved wait
    y = torch.randn(5)
    for _ in range(2):
        torch.testing.assert_close(g(y), (y * 3).sin())  # warm-up, then no recording
    assert fake_cuda.nodes == 2
    assert any("wait for their backward" in e["reason"] for e in events(log_dir, "cudagraph_skip"))
    loss.backward()
    torch.testing.assert_close(g(y), (y * 3).sin())
    assert fake_cuda.nodes == 3
    # a node recorded since the release does not replay while the saved values wait
    (_, since), = fake_cuda.released.items()
    loss = cm(torch.randn(4, 8)).square().mean()
    later, earlier = (types.SimpleNamespace(index=i, consumes={}) for i in (since, since - 1))
    assert "wait for their backward" in fake_cuda._overlaps_pending_saved(later)
    assert fake_cuda._overlaps_pending_saved(earlier) is None
    loss.backward()
    assert fake_cuda._overlaps_pending_saved(later) is None


def test_fast_match_serves_steady_calls_and_never_a_call_of_other_metadata(monkeypatch):
    """The last node of a graph is matched by one C++ check (Node.matches) instead of a
    signature tuple; a call with other strides, a moved in-place argument or another
    scalar must still get its own recording, with eager's values."""
    from coil.runtime import cudagraph_trees as ct

    tree = Tree(FakeRecorder())
    f = GraphFunction(lambda x, w, k: (x @ w + k,), "inference", tree=tree)
    w = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)
    for _ in range(3):
        x = torch.randn(3, 4)
        torch.testing.assert_close(f(x, w, 1)[0], x @ w + 1)
    calls = []
    real = ct._signature
    monkeypatch.setattr(ct, "_signature", lambda args: calls.append(1) or real(args))
    for _ in range(3):
        x = torch.randn(3, 4)
        torch.testing.assert_close(f(x, w, 1)[0], x @ w + 1)
    assert calls == [] and tree.nodes == 1          # steady replays took the fast match
    xt = torch.randn(4, 3).t()                       # same shape, other strides
    for _ in range(3):
        torch.testing.assert_close(f(xt, w, 1)[0], xt @ w + 1)
    torch.testing.assert_close(f(x, w, 2)[0], x @ w + 2)  # another scalar
    w2 = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)  # a moved parameter
    for _ in range(2):
        torch.testing.assert_close(f(x, w2, 1)[0], x @ w2 + 1)
    torch.testing.assert_close(f(x, w, 1)[0], x @ w + 1)
    assert calls and tree.nodes >= 3


@pytest.mark.parametrize("kind", ["right", "raises", "always true"])
def test_c_address_check_is_used_only_once_seen_right(monkeypatch, kind):
    """The in-place addresses are checked by torch's C function where it exists (CUDA builds) only after it agreed
    with the Python check and refused a wrong address; a moved parameter is re-recorded whichever is used."""
    from coil.runtime import cudagraph_trees as ct

    used = []

    def fake(tensors, ptrs, idx):
        used.append(1)
        if kind == "raises":
            raise TypeError("another signature")
        return kind == "always true" or all(tensors[i].data_ptr() == ptrs[i] for i in idx)

    monkeypatch.setattr(ct, "_ptrs_at", fake)
    monkeypatch.setattr(ct, "_ptrs_at_checked", False)
    tree = Tree(FakeRecorder())
    f = GraphFunction(lambda x, w: (x @ w,), "inference", tree=tree)
    w = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)
    for _ in range(4):
        x = torch.randn(3, 4)
        torch.testing.assert_close(f(x, w)[0], x @ w)
    assert ct._ptrs_at_checked == (kind == "right") and (ct._ptrs_at is fake) == (kind == "right") and used
    n = len(used)
    w2 = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)  # moved: its own recording
    for _ in range(3):
        torch.testing.assert_close(f(x, w2)[0], x @ w2)
        torch.testing.assert_close(f(x, w)[0], x @ w)
    assert tree.nodes == 2 and (len(used) > n) == (kind == "right")


def test_fast_match_checks_a_parameters_kind_not_its_layout(monkeypatch):
    """Node.matches leaves a Parameter's layout to the address guard, as the signature does (a GPT-2 step passes ~150
    parameters), but a plain tensor in a Parameter's place is another signature: the full path, not a replay."""
    from coil.runtime import cudagraph_trees as ct

    tree = Tree(FakeRecorder())
    f = GraphFunction(lambda x, w: (x @ w,), "inference", tree=tree)
    w, x = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False), torch.randn(3, 4)
    for _ in range(3):
        f(x, w)
    node, calls, real = tree.roots[0], [], ct._signature
    assert node.tensor_check is not None and len(node._plain_args((x, w))) == 1
    monkeypatch.setattr(ct, "_signature", lambda args: calls.append(1) or real(args))
    replays = tree.recorder.replays
    torch.testing.assert_close(f(x, w.detach())[0], x @ w)   # same memory, not a Parameter: a warm-up
    assert calls == [1] and tree.recorder.replays == replays


def test_equal_scalars_of_another_type_are_another_recording():
    # 1, 1.0 and True compare equal; an int tensor times 1.0 is float: replaying the
    # graph recorded with 1 returned int64
    body = lambda x, s: (x * s,)  # noqa: E731
    tree, f = make(body=body)
    x = torch.arange(6).view(2, 3)
    for s in (1, 1, 1, 1.0, True, 1.0, 1):
        (out,) = f(x, s)
        torch.testing.assert_close(out, x * s)


def test_reduce_overhead_without_cuda_graphs_warns_once(monkeypatch):
    """mode="reduce-overhead" where CUDA graphs cannot apply (CPU tensors) runs compiled and
    says so with a warning, once per kind of reason (not only in the compile log)."""
    import warnings

    import coil
    from coil.runtime import cudagraph_trees as ct

    monkeypatch.setattr(ct, "_WARNED", set())
    coil.reset()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f = coil.compile(lambda x: (x * 2).sin(), mode="reduce-overhead")
        g = coil.compile(lambda x: (x * 3).cos(), mode="reduce-overhead")
        x = torch.randn(5)
        torch.testing.assert_close(f(x), (x * 2).sin())
        torch.testing.assert_close(g(x), (x * 3).cos())
    msgs = [str(m.message) for m in w if "CUDA graphs" in str(m.message)]
    assert len(msgs) == 1 and "runs compiled, without CUDA graphs" in msgs[0]


def test_scatter_into_a_copied_input_is_written_back(fake_cuda):
    """A graph that writes an input in place (ir/graph.py) and a recording that copies that input into a
    placeholder (another tensor each call): the replay's write goes back to the caller's tensor."""
    def f(cache, k, pos):
        cache.index_add_(0, pos, k)
        return cache.sum(0)

    cf = coil.compile(f, mode="reduce-overhead")
    k, pos = torch.randn(1, 4), torch.tensor([2])
    with torch.no_grad():
        for _ in range(4):
            cache = torch.randn(5, 4)
            ref = cache.clone()
            torch.testing.assert_close(cf(cache, k, pos), f(ref, k, pos))
            torch.testing.assert_close(cache, ref)
    (root,) = fake_cuda.roots
    assert root.copied and root.writeback and fake_cuda.replays == 3


def test_copies_in_and_back_go_per_dtype(fake_cuda, monkeypatch):
    """Arguments copied into placeholders and written back after the replay are copied one ``_foreach_copy_`` per
    dtype: its multi-tensor fast path takes one dtype, and a list of float and int64 tensors ran a copy each."""
    calls = []
    real = torch._foreach_copy_

    def record(dsts, srcs, *a, **k):
        calls.append(sorted({str(t.dtype) for t in list(dsts) + list(srcs)}))
        return real(dsts, srcs, *a, **k)

    monkeypatch.setattr(torch, "_foreach_copy_", record)

    def f(cache, counts, k, ids, w, pos):
        cache.index_add_(0, pos, k)
        counts.index_add_(0, pos, torch.ones_like(pos))
        return cache.sum(0) + w[ids].sum(0) + counts.sum()

    cf = coil.compile(f, mode="reduce-overhead")
    k, w, pos = torch.randn(1, 4), torch.randn(6, 4), torch.tensor([2])
    with torch.no_grad():
        for step in range(4):
            cache, counts = torch.randn(5, 4), torch.arange(5)
            k2, ids = k + step, torch.tensor([step % 6, 1])
            ref_cache, ref_counts = cache.clone(), counts.clone()
            torch.testing.assert_close(cf(cache, counts, k2, ids, w, pos), f(ref_cache, ref_counts, k2, ids, w, pos))
            torch.testing.assert_close(cache, ref_cache)
            torch.testing.assert_close(counts, ref_counts)
    (root,) = fake_cuda.roots
    assert len(root.writeback) == 2 and fake_cuda.replays == 3
    assert calls and all(len(c) == 1 for c in calls), calls
