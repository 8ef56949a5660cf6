"""Regional compilation (``torch.compiler.nested_compile_region``): each distinct region
is captured as one subgraph, AOT-compiled and code-generated once, and called per use;
values and gradients equal eager's (docs/hops.md, "Regional compilation")."""
import copy
import dataclasses

import pytest
import torch

import coil
from coil.aot.compile import aot_compile
from coil.aot.backend import run_graph
from coil.testing import CompileCounter, assert_same_as_eager


class Block(torch.nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        q, k = [z.transpose(-1, -2) for z in (x, x * 2)]   # a list built in the body
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
        return x + h + (q - k).transpose(-1, -2).sin()


class Stack(torch.nn.Module):
    def __init__(self, n=4, d=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
        self.head = torch.nn.Linear(d, 3)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).relu()


@pytest.mark.parametrize("backend", ["aot_eager", "coil", "coil-triton"])
def test_stack_values_and_grads(backend, monkeypatch):
    options = None
    if backend == "coil-triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        backend, options = "coil", {"cpu_backend": "triton"}
    torch.manual_seed(0)
    m = Stack()
    x = torch.randn(2, 5, 8)
    if options:   # assert_same_as_eager compiles with default options: compared here
        ref_m = copy.deepcopy(m)
        out, ref = coil.compile(m, options=options)(x), ref_m(x)
        torch.testing.assert_close(out, ref)
        g = torch.randn_like(out)
        out.backward(g)
        ref.backward(g)
        for p, q in zip(m.parameters(), ref_m.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        return
    assert_same_as_eager(m, (torch.randn(2, 5, 8, requires_grad=True),), backend=backend,
                         check_grads=True)


def _counting(gm, example_inputs, compiled):
    def fw(g, ex):
        compiled.append(g.meta.get("coil_aot_graph"))
        return run_graph(g, ex)
    return aot_compile(gm, example_inputs, fw_compiler=fw, bw_compiler=fw)


def test_n_calls_compile_once(trace_events):
    compiled: list = []
    m = Stack(n=6)
    x = torch.randn(2, 5, 8, requires_grad=True)
    out = coil.compile(m, backend=lambda gm, ex: _counting(gm, ex, compiled))(x)
    out.sum().backward()
    # one region (6 calls; the first input's requires_grad joins the others') and one
    # segment (the head): a forward and a backward graph each
    assert sorted(compiled) == ["backward", "backward", "forward", "forward"]
    (comp,) = trace_events("region_compiled")
    assert comp["calls"] == 6
    (split,) = trace_events("region_split")
    assert split["regions"] == {comp["region"]: 6} and split["segments_compiled"] == 1
    hops = [e for e in trace_events("hop") if e["op"] == "nested_compile_region"]
    assert [e["call"] for e in hops] == [1, 2, 3, 4, 5, 6]


def test_input_without_grad_reuses_the_region():
    """The first block's input does not require grad, the others' do: one region."""
    compiled: list = []
    m = Stack(n=3)
    x = torch.randn(2, 5, 8)
    out = coil.compile(m, backend=lambda gm, ex: _counting(gm, ex, compiled))(x)
    ref_m = copy.deepcopy(m)
    ref = ref_m(x)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert compiled.count("forward") == 2


def test_different_input_metadata_compiles_again(trace_events):
    @torch.compiler.nested_compile_region
    def blk(x, w):
        return torch.tanh(x @ w) * 2

    def fn(a, b, w):
        return blk(a, w).sum() + blk(b, w).sum() + blk(a * 3, w).sum() + blk(b.t(), w.t()).sum()

    args = (torch.randn(3, 4), torch.randn(4, 4), torch.randn(4, 4, requires_grad=True))
    assert_same_as_eager(fn, args, check_grads=True)
    coil.reset()
    coil.compile(fn, backend="aot_eager")(*args)
    calls = {e["region"]: e["calls"] for e in trace_events("region_compiled")}
    # a (3, 4) input twice; a (4, 4) one once; a transposed (4, 4) one (other strides) once
    assert sorted(calls.values()) == [1, 1, 2]


@dataclasses.dataclass
class _Cfg:
    scale: float


_CFG = _Cfg(1.0)


@torch.compiler.nested_compile_region
def _scaled(x):
    return x * _CFG.scale


def test_global_rebound_to_new_dataclass_in_loop(trace_events):
    """The body reads a module global that the frame rebinds to a new dataclass instance
    between calls: each value makes another region (the constant is in its graph),
    never a stale reuse."""
    def f(x):
        global _CFG
        out = x
        for i in range(3):
            _CFG = _Cfg(float(i + 2))
            out = _scaled(out)
        return out

    x = torch.randn(4, requires_grad=True)
    out = coil.compile(f, backend="aot_eager")(x)
    torch.testing.assert_close(out, x * 24)
    assert _CFG.scale == 4.0
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 24.0))
    assert len(trace_events("region_compiled")) == 3


def test_side_effect_in_region_is_inlined_and_logged(trace_events):
    seen = []

    @torch.compiler.nested_compile_region
    def blk(x):
        seen.append(1)
        return x.sin()

    def fn(x):
        return blk(blk(x))

    cnt = CompileCounter()
    x = torch.randn(3)
    torch.testing.assert_close(coil.compile(fn, backend=cnt)(x), x.sin().sin())
    assert cnt.frame_count == 1 and len(seen) == 2
    inl = trace_events("region_inlined")
    assert len(inl) == 2 and "mutation of ListVariable" in inl[0]["reason"]


def test_region_writing_its_input_is_inlined():
    @torch.compiler.nested_compile_region
    def blk(x):
        return x.mul_(2).cos()

    def fn(x):
        return blk(x + 1)

    assert_same_as_eager(fn, (torch.randn(3),), backend="coil")


def test_grad_mode_change_in_graph_inlines_regions(trace_events):
    @torch.compiler.nested_compile_region
    def blk(x, w):
        return (x @ w).relu()

    def fn(x, w):
        with torch.no_grad():
            y = blk(x, w)
        return blk(x, w) + y

    assert_same_as_eager(fn, (torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)),
                         backend="aot_eager", check_grads=True)
    assert any("grad mode" in e["reason"] for e in trace_events("region_inlined"))


def test_region_returning_tuple_and_nested_cond():
    @torch.compiler.nested_compile_region
    def blk(x, w):
        y = torch.cond(x.sum() > 0, lambda a: a.exp(), lambda a: a.cos(), (x @ w,))
        return y, x * 2

    def fn(x, w):
        a, b = blk(x, w)
        c, d = blk(b, w)
        return a + c + d

    for sign in (1.0, -1.0):
        x = torch.rand(3, 3) * sign
        assert_same_as_eager(fn, (x, torch.randn(3, 3)), backend="coil")


def test_torch_compile_invoke_subgraph_through_coil_backend(trace_events):
    """torch's own capture emits invoke_subgraph nodes: coil's AOT compiles them as
    regions too."""
    from coil.backends.registry import coil_backend_entry

    @torch.compiler.nested_compile_region
    def blk(x, w):
        return torch.relu(x @ w) + x

    def f(x, w1, w2, w3):
        return blk(blk(blk(x, w1), w2), w3).sum()

    torch._dynamo.reset()
    ws = [torch.randn(4, 4, requires_grad=True) for _ in range(3)]
    ref_ws = [w.detach().clone().requires_grad_() for w in ws]
    x = torch.randn(4, 4)
    out = torch.compile(f, backend=coil_backend_entry)(x, *ws)
    ref = f(x, *ref_ws)
    torch.testing.assert_close(out, ref)
    out.backward()
    ref.backward()
    for a, b in zip(ws, ref_ws):
        torch.testing.assert_close(a.grad, b.grad)
    assert trace_events("region_split") and not trace_events("region_inlined")


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_regions_with_input_mutation_between_calls_and_under_no_grad(backend):
    @torch.compiler.nested_compile_region
    def blk(x, w):
        return torch.tanh(x @ w)

    def fn(x, w, buf):
        h = blk(x, w)
        buf.add_(h.sum(0))          # a segment writes an input between two calls
        return blk(h + buf, w), buf * 2

    args = (torch.randn(3, 4), torch.randn(4, 4), torch.zeros(4))
    assert_same_as_eager(fn, args, backend=backend)
    with torch.no_grad():
        assert_same_as_eager(fn, args, backend=backend)


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_regions_with_dynamic_shapes(backend, trace_events):
    """Symbolic sizes: pieces traced on capture's ShapeEnv; the region's inputs require
    grad as their union says (the first call's input does not), so the earlier blocks'
    parameters get their gradients."""
    torch.manual_seed(0)
    m = Stack(n=3)
    ref = copy.deepcopy(m)
    cm = coil.compile(m, backend=backend, dynamic=True)
    for t in (5, 9):
        x = torch.randn(2, t, 8)
        out, r = cm(x), ref(x)
        torch.testing.assert_close(out, r)
        out.sum().backward()
        r.sum().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    assert not trace_events("region_inlined")
    assert all(e["calls"] == 3 for e in trace_events("region_compiled"))
