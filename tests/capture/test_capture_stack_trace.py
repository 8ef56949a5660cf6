"""Captured FX nodes carry the user's source location as ``meta["stack_trace"]`` (FINDINGS_16
defect 9): the traceback-style text torch.fx's ``print_readable``, ``make_fx`` (which copies
it into the ATen graphs) and torch's backends read. ``meta["stack"]`` (coil's short form)
stays as it was. The AOT forward and backward ATen graphs get it too: the forward through
make_fx, the backward from the forward op each autograd node differentiates."""
import glob
import inspect
import json
import operator

import torch
import torch.nn.functional as F

import coil
from coil.aot import aot_compile
from coil.testing import CompileCounter

HERE = __file__


def _line_of(fn, text: str) -> int:
    src, first = inspect.getsourcelines(fn)
    return first + next(k for k, line in enumerate(src) if text in line)


def _calls(gm):
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def _capture(fn, *args):
    cnt = CompileCounter()
    coil.compile(fn, backend=cnt)(*args)
    assert len(cnt.graphs) == 1
    return cnt.graphs[0]


def test_stack_trace_is_traceback_text_of_the_user_line():
    def f(x):
        y = x.relu()
        return y + 1

    gm = _capture(f, torch.randn(3))
    relu, add = _calls(gm)
    n = _line_of(f, "y = x.relu()")
    assert relu.meta["stack_trace"] == f'  File "{HERE}", line {n}, in f\n    y = x.relu()\n'
    assert add.meta["stack_trace"] == f'  File "{HERE}", line {n + 1}, in f\n    return y + 1\n'
    assert relu.meta["stack"] == f'File "{HERE}", line {n}, in f'  # coil's short form, unchanged
    text = gm.print_readable(print_output=False)
    assert "No stacktrace found" not in text
    assert f"{HERE}:{n} in f, code: y = x.relu()" in text


def _inner(x):
    return x.sin()


def test_inlined_call_gives_the_whole_user_stack_outermost_first():
    def outer(x):
        return _inner(x) * 2

    gm = _capture(outer, torch.randn(3))
    sin = _calls(gm)[0]
    trace = sin.meta["stack_trace"]
    assert trace.index("in outer\n    return _inner(x) * 2") < trace.index("in _inner\n    return x.sin()")
    assert sin.meta["stack"].startswith(f'File "{HERE}", line {_line_of(_inner, "x.sin()")}, in _inner <- ')


def test_multi_output_items_and_global_state_nodes_carry_it():
    def f(x):
        v, i = x.max(-1)
        with torch.no_grad():
            w = x * 2
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = x @ x.t()
        return v, i, w, z

    gm = _capture(f, torch.randn(3, 4, requires_grad=True))
    calls = _calls(gm)
    kinds = {getattr(n.target, "__name__", str(n.target)) for n in calls}
    assert {"getitem", "_set_grad_enabled", "_enter_autocast", "_exit_autocast"} <= kinds, kinds
    for n in calls:
        assert n.meta.get("stack_trace", "").startswith(f'  File "{HERE}", line '), n.format_node()
    items = [n for n in calls if n.target is operator.getitem]
    assert all("v, i = x.max(-1)" in n.meta["stack_trace"] for n in items)


def test_aot_forward_and_backward_graphs_carry_the_user_lines():
    graphs = {}

    def compiler(kind):
        def compile_graph(gm, fakes):
            graphs[kind] = gm
            return gm
        return compile_graph

    def backend(gm, example_inputs):
        return aot_compile(gm, example_inputs, compiler("fw"), compiler("bw"))

    lin = torch.nn.Linear(8, 4)

    def f(x, t):
        h = lin(x).relu()
        return F.cross_entropy(h, t)

    coil.compile(f, backend=backend)(torch.randn(3, 8), torch.tensor([1, 2, 3])).backward()
    h_line = f'File "{HERE}", line {_line_of(f, "h = lin(x).relu()")}, in f'
    ce_line = f'File "{HERE}", line {_line_of(f, "F.cross_entropy(h, t)")}, in f'
    for kind in ("fw", "bw"):
        calls = _calls(graphs[kind])
        assert calls and all(n.meta.get("stack_trace") for n in calls), \
            [n.format_node() for n in calls if not n.meta.get("stack_trace")]
        assert "No stacktrace found" not in graphs[kind].print_readable(print_output=False)
    fw, bw = _calls(graphs["fw"]), _calls(graphs["bw"])
    assert h_line in next(n for n in fw if n.target is torch.ops.aten.addmm.default).meta["stack_trace"]
    # the weight gradient's mm comes from the Linear call's line, log_softmax's backward
    # from cross_entropy's
    assert any(h_line in n.meta["stack_trace"] for n in bw if n.target is torch.ops.aten.mm.default)
    assert any(ce_line in n.meta["stack_trace"] for n in bw if n.target is torch.ops.aten.exp.default)


def test_compile_log_graphs_have_stack_traces(tmp_path):
    def f(x, w):
        y = F.gelu(x @ w)
        return y.softmax(-1)

    coil.trace.set_dir(str(tmp_path))
    try:
        w = torch.randn(8, 8, requires_grad=True)
        coil.compile(f)(torch.randn(4, 8), w).sum().backward()
    finally:
        coil.trace.set_dir(None)
    recs = [json.loads(line) for p in glob.glob(str(tmp_path / "*.jsonl")) for line in open(p)]
    graphs = {r["name"]: r["text"] for r in recs if r.get("event") == "artifact"
              and r["name"] in ("captured_graph", "aot_joint_graph", "aot_forward_graph",
                                "aot_backward_graph")}
    assert len(graphs) == 4, sorted(graphs)
    for name, text in graphs.items():
        assert "No stacktrace found" not in text, (name, text)
        assert "code: y = F.gelu(x @ w)" in text and "code: return y.softmax(-1)" in text, (name, text)
