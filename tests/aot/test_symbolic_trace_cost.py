"""What AOT computes for a program with symbolic sizes, beyond the graph: the automatic
dynamic recompile of an 8-layer LLaMA spent most of its AOT time on symbolic arithmetic
that no graph node needed (docs/dynamic_shapes.md, "Compile time").

- ``make_fx`` recorded each tensor's symbolic size, stride and contiguity arithmetic as
  graph nodes as it was computed, then left them dead (coil/aot/functional.py ``_traced``
  records a SymInt's arithmetic only when an op or output uses it);
- ``aliasing._overlaps`` asked ATen's ``has_internal_overlap``, which first decides
  whether the tensor is dense: sympy work per view, 8 ms each on LLaMA's activations.
"""
import random

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from coil.aot.aliasing import _overlaps
from coil.aot.decompositions import get_decompositions
from coil.aot.functional import analyze, trace_inference, trace_joint


def _symbolic(mode, t, dynamic_dims):
    dims = [DimDynamic.DYNAMIC if d in dynamic_dims else DimDynamic.STATIC for d in range(t.dim())]
    return mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims))


def test_overlaps_answers_as_aten_on_static_layouts():
    rng = random.Random(0)
    base = torch.empty(4096)
    for _ in range(3000):
        d = rng.randint(0, 4)
        t = base.as_strided([rng.choice([0, 1, 2, 3]) for _ in range(d)],
                            [rng.choice([0, 1, 2, 3, 6, 12]) for _ in range(d)], rng.randint(0, 3))
        assert _overlaps(t) == (torch._debug_has_internal_overlap(t) == 1), (t.shape, t.stride())


def test_overlaps_on_symbolic_layouts_adds_no_guard():
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    x = _symbolic(mode, torch.empty(4, 6, 8), {1})
    with mode:
        cases = [(x, False), (x.transpose(1, 2), False), (x[:, :1].expand(4, x.shape[1], 8), True),
                 (x[:, :, :1].expand(4, x.shape[1], 3), True), (x[:, :0], False)]
        for t, want in cases:
            assert _overlaps(t) is want and (torch._debug_has_internal_overlap(t) == 1) == want
    assert env.guards == [] or all("Eq" not in str(g.expr) for g in env.guards)


def _program(x, w):
    y = (x.transpose(1, 2).contiguous().transpose(1, 2) @ w).view(x.shape[0], x.shape[1], 2, -1)
    return y.permute(0, 2, 1, 3).reshape(x.shape[0] * 2, -1, y.shape[-1]).softmax(-1)


@pytest.mark.parametrize("dims", [{1}, {0, 1}])
def test_symbolic_trace_records_only_size_arithmetic_it_uses(dims, monkeypatch):
    """The trace makes a node for SymInt arithmetic (``operator.mul``...) only when the
    graph keeps it: before, each view's size arithmetic became nodes that were dropped
    as dead (302 made, 3 kept here with one symbolic dim)."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    args = [_symbolic(mode, torch.randn(3, 5, 8), dims), _symbolic(mode, torch.randn(8, 6), set())]
    info = analyze(_program, args, mode, grad=False)
    made = []
    create = torch.fx.Graph.create_node

    def counting(self, op, target, *a, **k):
        node = create(self, op, target, *a, **k)
        if getattr(target, "__module__", None) in ("_operator", "operator", "torch"):
            made.append(node)
        return node
    monkeypatch.setattr(torch.fx.Graph, "create_node", counting)
    gm = trace_inference(_program, args, info, get_decompositions(), mode)
    monkeypatch.undo()
    kept = [n for n in gm.graph.nodes if n in made]
    assert 0 < len(kept) == len(made), [str(n.target) for n in made]
    x, w = torch.randn(3, 7, 8), torch.randn(8, 6)
    torch.testing.assert_close(gm(x, w)[0], _program(x, w))


def _mutates(x, w):
    x.add_(1)
    return x @ w


def _aliases(x, w):
    y = x @ w
    return y, y.transpose(1, 2)


def _view_of_input(x, w):
    return x.transpose(1, 2), x @ w


@pytest.mark.parametrize("symbolic", [False, True])
@pytest.mark.parametrize("program,static_only", [(_program, False), (_mutates, True), (_aliases, True),
                                                 (_view_of_input, True)])
def test_inference_is_analysed_and_traced_in_one_run(program, static_only, symbolic):
    """Under no_grad a program is analysed while it is traced (one run of its ops, not two); with symbolic sizes one
    that mutates an input or returns an alias takes both runs. The one run gives the graph and description the two
    give."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env if symbolic else None)
    x = torch.randn(3, 5, 8)
    args = [_symbolic(mode, x, {1}) if symbolic else mode.from_tensor(x), torch.randn(8, 6)]
    args[1] = _symbolic(mode, args[1], set()) if symbolic else mode.from_tensor(args[1])
    with torch.no_grad():
        found = trace_joint(program, args, None, get_decompositions(), mode, grad=False)
        assert (found is not None) == (not symbolic or not static_only)
        if found is None:
            return
        gm, joint = found
        info, want = joint.program, analyze(program, args, mode, grad=False)
        assert (info.mutated_inputs, info.graph_outputs, info.fw_out_requires_grad, [o.kind for o in info.outputs]) \
            == (want.mutated_inputs, want.graph_outputs, want.fw_out_requires_grad, [o.kind for o in want.outputs])
        assert gm.code == trace_inference(program, args, want, get_decompositions(), mode).code


def _batch_norm(x, w, rm, rv):
    return torch.nn.functional.batch_norm(x @ w, rm, rv, training=True).relu()


def _writes_an_input_needing_grad(x, w, rm, rv):
    w.mul_(2)
    return x @ w


def _restrides(x, w, rm, rv):
    rm.unsqueeze_(0)
    return x @ w


def _view_of_written(x, w, rm, rv):
    rm.add_(1)
    return x @ w, rm[1:]


@pytest.mark.parametrize("program,one", [(_batch_norm, True), (_writes_an_input_needing_grad, False),
                                         (_restrides, False), (_view_of_written, False)])
def test_training_step_is_analysed_and_traced_in_one_run(program, one):
    """With static shapes a training graph's forward runs once: analysed while the joint graph is traced, the tangents
    made graph inputs once it ran (a BatchNorm's buffers are written: one run); a program that writes an input needing
    grad (cloned first), restrides one or returns a view of one it wrote takes two runs. The one run gives the
    description and the graph the two give."""
    mode = FakeTensorMode()
    x, w = torch.randn(3, 5, 8, requires_grad=True), torch.randn(8, 6, requires_grad=True) * 1
    args = [mode.from_tensor(t) for t in (x, w, torch.zeros(5), torch.ones(5))]
    found = trace_joint(program, args, None, get_decompositions(), mode)
    assert (found is not None) == one
    if not one:
        return
    gm, joint = found
    want = analyze(program, args, mode, grad=True)
    info = joint.program
    assert (info.mutated_inputs, info.graph_outputs, info.fw_out_requires_grad, info.fw_out_meta,
            [o.kind for o in info.outputs]) == (want.mutated_inputs, want.graph_outputs, want.fw_out_requires_grad,
                                                want.fw_out_meta, [o.kind for o in want.outputs])
    gm2, joint2 = trace_joint(program, args, want, get_decompositions(), mode)
    assert gm.code == gm2.code and (joint.grad_inputs, joint.grad_is_none) == (joint2.grad_inputs, joint2.grad_is_none)
    assert [n.meta["val"].shape for n in gm.graph.nodes if n.op == "placeholder"] == \
        [n.meta["val"].shape for n in gm2.graph.nodes if n.op == "placeholder"]
