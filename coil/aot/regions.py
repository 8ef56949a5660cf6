"""Regional compilation: a ``torch.compiler.nested_compile_region`` compiled once, called many times.

Capture turns each region call into ``invoke_region(region_k, "region_k", *operands, *lifted)``, calls of one traced
graph and input metadata sharing one ``region_k``. :func:`compile_regional` cuts such a graph at the calls into steps
run in order: each distinct region compiled once by ``aot_compile`` with the caller's compilers, the ops between calls
as *segments* (equal ones once), gradients flowing between steps through autograd. Graphs it cannot cut, and pieces that
fail, compile whole with the regions inlined (event ``region_inlined``). docs/hops.md, "Regional compilation"."""
from __future__ import annotations

import operator
import time
from typing import Callable, Optional

import torch
import torch.fx
from torch._prims_common import compute_required_storage_length
from torch._subclasses.fake_tensor import FakeTensorMode

from coil import trace
from coil.aot.functional import fake_mode_of, is_symbolic


def invoke_region(subgraph: torch.fx.GraphModule, identifier: str, *operands):
    """The captured graph's call of region ``identifier``: ``subgraph(*operands)`` (a
    tuple of tensors), what the ``eager`` backend runs."""
    return subgraph(*operands)


# torch's own capture emits invoke_subgraph with the same (subgraph, identifier, *operands)
_TARGETS = (invoke_region, torch.ops.higher_order.invoke_subgraph)


def region_calls(gm: torch.fx.GraphModule) -> list:
    """The region call nodes of ``gm`` (empty when it has none)."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _TARGETS]


_MODE_CHANGES = {torch._C._set_grad_enabled, torch.amp.autocast_mode._enter_autocast,
                 torch.amp.autocast_mode._exit_autocast}


def _why_not_split(gm: torch.fx.GraphModule, calls: list):
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _MODE_CHANGES:
            return f"the graph changes grad mode or autocast ({n.name}): one graph keeps it"
    for c in calls:
        if any(u.op != "call_function" or u.target is not operator.getitem for u in c.users):
            return f"{c.name}'s result is used other than by indexing"
    return None


def inline_regions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with each region call replaced by the body of its subgraph (a new GraphModule; ``gm`` is not changed)."""
    g = torch.fx.Graph()
    env: dict = {}
    attrs: dict = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _TARGETS:
            env[n] = _inline(g, getattr(gm, n.args[0].target), [env[a] for a in n.args[2:]], attrs)
        elif n.op == "call_function" and n.target is operator.getitem and isinstance(env.get(n.args[0]), tuple):
            env[n] = env[n.args[0]][n.args[1]]
        else:
            env[n] = g.node_copy(n, lambda a: env[a])
            if n.op == "get_attr":
                attrs[n.target] = operator.attrgetter(n.target)(gm)
    for n in reversed(list(g.nodes)):   # the subgraphs of the inlined calls
        if n.op == "get_attr" and not n.users:
            g.erase_node(n)
            attrs.pop(n.target, None)
    return torch.fx.GraphModule(attrs, g)


def _inline(g: torch.fx.Graph, sub: torch.fx.GraphModule, args: list, attrs: dict) -> tuple:
    env: dict = {}
    phs = iter(args)
    for n in sub.graph.nodes:
        if n.op == "placeholder":
            env[n] = next(phs)
        elif n.op == "output":
            return tuple(env[a] for a in n.args[0])
        elif n.op == "get_attr":   # a nested operator's subgraph: an attribute of the parent
            name = f"{type(sub).__name__}_{n.target}"
            attrs[name] = getattr(sub, n.target)
            env[n] = g.get_attr(name)
        else:
            env[n] = g.node_copy(n, lambda a: env[a])
    raise AssertionError("subgraph without output")


def compile_regional(gm: torch.fx.GraphModule, example_inputs: list, compile_piece: Callable) -> Callable:
    """Compile ``gm`` (a captured graph holding region calls, :func:`region_calls`) piece by piece (module
    docstring). ``compile_piece(piece_gm, example_inputs) -> callable`` compiles one piece (``aot_compile``
    with the caller's compilers). Returns a callable with ``gm``'s calling convention."""
    calls = region_calls(gm)
    if (reason := _why_not_split(gm, calls)) is None:
        try:
            return _compile_split(gm, example_inputs, compile_piece)
        except Exception as e:  # noqa: BLE001 - the whole graph still compiles
            reason = f"{type(e).__name__}: {e}"
    trace.log("region_inlined", stage="aot", regions=sorted({c.args[1] for c in calls}), reason=reason[:2000])
    return compile_piece(inline_regions(gm), example_inputs)


def _fake(mode: FakeTensorMode, v, requires_grad: Optional[bool] = None):
    """A fake of ``v`` (real, or fake of another mode) in ``mode``: same sizes and strides (``requires_grad`` if given),
    a non-leaf when ``v`` requires grad and is not a leaf: then a view of a clone of a leaf over its storage
    (``from_tensor`` makes a view too; ``clone()`` alone would make a sliced or expanded one contiguous)."""
    if not isinstance(v, torch.Tensor):
        return v
    requires_grad = v.requires_grad if requires_grad is None else requires_grad
    size, stride = tuple(v.shape), tuple(v.stride())
    with mode:
        if not requires_grad or v.is_leaf:
            return torch.empty_strided(size, stride, dtype=v.dtype, device=v.device).requires_grad_(requires_grad)
        base = torch.empty(compute_required_storage_length(size, stride, 0), dtype=v.dtype, device=v.device)
        with torch.enable_grad():
            return base.requires_grad_(True).clone().as_strided(size, stride)


def _meta_key(v) -> tuple:
    if isinstance(v, torch.Tensor):
        return (str(tuple(v.shape)), str(v.stride()), v.dtype, str(v.device))
    return (type(v).__name__, repr(v))


def _grad_union(calls: list, val: Callable) -> dict:
    """Per distinct region (subgraph, input metadata): which inputs require grad in some call. The region is compiled
    once with these; a call whose input does not require grad gets no gradient for it (autograd drops it)."""
    need: dict = {}
    for n in calls:
        fakes = [val(a) for a in n.args[2:]]
        key = ("region", n.args[0].target, tuple(_meta_key(f) for f in fakes))
        rg = [isinstance(f, torch.Tensor) and f.requires_grad for f in fakes]
        need[key] = [a or b for a, b in zip(need.get(key, rg), rg)]
    return need


def graph_piece(gm: torch.fx.GraphModule, nodes: list, ins: list, outs: list) -> torch.fx.GraphModule:
    """A GraphModule of ``nodes`` (a run of ``gm``'s nodes) reading ``ins`` as placeholders (with their meta),
    returning ``outs``."""
    g = torch.fx.Graph()
    env: dict = {}
    for a in ins:
        env[a] = g.placeholder(a.name)
        env[a].meta = dict(a.meta)
    for n in nodes:
        env[n] = g.node_copy(n, env.__getitem__)
    g.output(tuple(env[n] for n in outs))
    return torch.fx.GraphModule(gm, g)


def _segment(gm: torch.fx.GraphModule, nodes: list):
    """:func:`graph_piece` of ``nodes`` reading outside values, returning those used later; and both node lists."""
    inside = set(nodes)
    ins = list(dict.fromkeys(a for n in nodes for a in n.all_input_nodes if a not in inside))
    outs = [n for n in nodes if any(u not in inside for u in n.users)]
    return graph_piece(gm, nodes, ins, outs), ins, outs


def _compile_split(gm: torch.fx.GraphModule, example_inputs: list, compile_piece: Callable):
    from coil.capture.variables.hops import _region_key  # the same notion of equal graphs
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    metas = [p.meta.get("example_value", p.meta.get("val")) for p in placeholders]
    if is_symbolic(metas):   # symbolic sizes: every piece traced on capture's ShapeEnv
        mode, example_inputs = fake_mode_of(metas), metas
    else:
        mode = FakeTensorMode(allow_non_fake_inputs=False)
    value = {p: _fake(mode, x) for p, x in zip(placeholders, example_inputs)}

    def val(n):
        return value[n] if n in value else _fake(mode, n.meta.get("example_value", n.meta.get("val")))
    need = _grad_union(region_calls(gm), val)
    steps: list = []      # (compiled piece, input nodes, {output index: node})
    compiled: dict = {}   # (kind, key) -> [callable, calls, compile ms, name, fakes]
    run: list = []

    def add_step(key, name, piece, ins, outs, fakes):
        if key not in compiled:
            t0 = time.perf_counter()
            with trace.stage(key[0]):
                fn = compile_piece(piece, fakes)
            compiled[key] = [fn, 0, (time.perf_counter() - t0) * 1e3, name, fakes]
        compiled[key][1] += 1
        steps.append((compiled[key][0], ins, outs))

    def flush():
        body = [n for n in run if n.op != "get_attr" or not all(u.target in _TARGETS for u in n.users)]
        run.clear()
        if body:
            piece, ins, outs = _segment(gm, body)
            fakes = [val(a) for a in ins]
            key = ("segment", _region_key(piece.graph, {}),
                   tuple((_meta_key(f), getattr(f, "requires_grad", False)) for f in fakes))
            add_step(key, "segment", piece, ins, dict(enumerate(outs)), fakes)
    for n in nodes[:-1]:
        if n.op == "call_function" and n.target in _TARGETS:
            flush()
            fakes = [val(a) for a in n.args[2:]]
            key = ("region", n.args[0].target, tuple(_meta_key(f) for f in fakes))
            fakes = [_fake(mode, f, rg) for f, rg in zip(fakes, need[key])]
            sub = getattr(gm, n.args[0].target)
            for p, f in zip([q for q in sub.graph.nodes if q.op == "placeholder"], fakes):
                p.meta["example_value"] = f   # what aot_compile traces a symbolic graph with
            add_step(key, n.args[0].target, sub, list(n.args[2:]), {u.args[1]: u for u in n.users}, fakes)
        elif n.op != "placeholder" and not (n.target is operator.getitem and getattr(
                n.args[0], "target", None) in _TARGETS):
            run.append(n)   # (a region's getitem is bound by its step)
    flush()
    _log_split(steps, compiled)
    return _runner(steps, placeholders, nodes[-1])


def _log_split(steps: list, compiled: dict) -> None:
    for (kind, _, _), (fn, calls, ms, name, fakes) in compiled.items():
        if kind == "region":
            trace.log("region_compiled", stage="aot", region=name, calls=calls,
                      compile_ms=round(ms, 1), inputs=[str(_meta_key(f)) for f in fakes])
    trace.log("region_split", stage="aot", steps=len(steps),
              regions={e[3]: e[1] for k, e in compiled.items() if k[0] == "region"},
              segments=sum(e[1] for k, e in compiled.items() if k[0] == "segment"),
              segments_compiled=sum(1 for k in compiled if k[0] == "segment"))


def _runner(steps: list, placeholders: list, out_node) -> Callable:
    last = {a: i for i, (_, ins, _) in enumerate(steps) for a in ins}
    kept = set(out_node.all_input_nodes)
    free = [[a for a, i in last.items() if i == k and a not in kept] for k in range(len(steps))]

    def run(*args):
        env = dict(zip(placeholders, args))
        for (fn, ins, outs), dead in zip(steps, free):
            vals = fn(*[env[a] for a in ins])
            env.update((n, vals[i]) for i, n in outs.items())
            for a in dead:   # values no later step reads
                del env[a]
        res = torch.fx.node.map_arg(out_node.args[0], env.__getitem__)
        return list(res) if isinstance(res, list) else res
    run._coil_aot_path = "regional"  # type: ignore[attr-defined]
    return run
