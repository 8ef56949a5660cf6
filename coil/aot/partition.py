"""Splitting a joint forward+backward graph into a forward and a backward graph.

A :class:`Partition` of the joint graph of :func:`coil.aot.functional.trace_joint` holds ``fw``: ``(*primals) ->
[*forward_outputs, *saved]`` and ``bw``: ``(*saved, *tangents) -> [*grads]``. :func:`default_partition` saves every
forward-region value the backward reads; :func:`min_cut_partition` saves the fewest bytes that let the backward compute
what it needs (a minimum s-t cut, :func:`_sink_side`), recomputing cheap ops. The flow network, what counts as cheap and
the ``aot_partition`` log event: docs/aot.md, "Partitioners"."""
from __future__ import annotations

import copy
import dataclasses
import math
import operator
from typing import Optional

import torch
import torch.fx
from torch.fx._lazy_graph_module import _make_graph_module

from coil import trace
from coil.config import config
from coil.aot.functional import JointInfo, checkpoint_region
from coil.exc import InternalError

aten = torch.ops.aten


@dataclasses.dataclass
class Partition:
    """The result of a partitioner (see module docstring)."""

    fw: torch.fx.GraphModule
    bw: torch.fx.GraphModule
    num_saved: int
    #: bytes of the distinct storages saved (views of one input count it once)
    saved_bytes: int
    #: per saved value: ``{"name", "bytes", "reason"}`` (+ ``"aliases_input"``: the graph input it is a view of, if any)
    saved: list
    #: names of forward-region nodes recomputed in the backward
    recomputed: list


# --------------------------------------------------------------------------- helpers

def node_bytes(node: torch.fx.Node) -> int:
    """Bytes of a node's value (a tensor: numel * itemsize, symbolic sizes by their hint; a SymInt/int/float: 8;
    anything else: 0)."""
    if isinstance(val := node.meta.get("val"), torch.Tensor):
        if isinstance(numel := val.numel(), torch.SymInt):
            numel = numel.node.hint if numel.node.has_hint() else 4096
        return int(numel) * val.element_size()
    return 8 if isinstance(val, (torch.SymInt, torch.SymFloat, int, float, bool)) else 0


def _saveable(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


_VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
             aten.expand.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default,
             aten.slice.Tensor, aten.select.int, aten.t.default, aten.transpose.int, aten.as_strided.default,
             aten.alias.default, aten.detach.default, aten.unbind.int, aten.split.Tensor, aten.split_with_sizes.default}
_CHEAP_OPS = {aten._to_copy.default, aten.clone.default, aten.cat.default, aten.where.self, aten.full.default,
              aten.full_like.default, aten.zeros.default, aten.ones.default, aten.zeros_like.default,
              aten.ones_like.default, aten.empty.memory_format, aten.scalar_tensor.default, aten.arange.start_step,
              aten.arange.default, aten.arange.start, aten.lift_fresh_copy.default, aten.constant_pad_nd.default,
              aten.slice_scatter.default, aten.select_scatter.default,
              aten.scatter.value}    # a one-hot (cross-entropy's backward): one write per element
_REDUCTIONS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default, aten.amax.default,
               aten.amin.default, aten.max.dim, aten.min.dim, aten.max.default, aten.min.default, aten.prod.dim_int,
               aten.prod.default, aten.any.dim, aten.any.default, aten.all.dim, aten.all.default, aten.argmax.default,
               aten.argmin.default}


def recompute_ban_reason(node: torch.fx.Node) -> Optional[str]:
    """Why ``node`` must not be recomputed in the backward (None: it may be).

    Cheap = pointwise ops (``torch.Tag.pointwise``), views, constants, casts, cat, ``getitem`` of a cheap node, and
    reductions over at most ``config.aot_max_recompute_reduction`` input elements."""
    if node.op == "placeholder":
        return "graph input"
    if node.op == "get_attr":
        return None
    if node.op != "call_function":
        return f"{node.op} node"
    if (target := node.target) is operator.getitem:
        return recompute_ban_reason(node.args[0])
    if not isinstance(target, torch._ops.OpOverload):
        return None if target in (operator.add, operator.mul, operator.sub, operator.floordiv) else f"call to {target}"
    if torch.Tag.nondeterministic_seeded in target.tags:
        return "random op (recomputing would draw a different mask)"
    if target in _VIEW_OPS or target in _CHEAP_OPS or torch.Tag.pointwise in target.tags:
        return None
    if target in _REDUCTIONS:
        src = node.args[0]
        n = node_bytes(src) // max(src.meta["val"].element_size(), 1) if isinstance(src, torch.fx.Node) else 0
        return None if n <= config.aot_max_recompute_reduction else f"reduction over {n} elements"
    if (name := target._schema.name.split("::")[-1]) in ("mm", "addmm", "bmm", "baddbmm", "matmul"):
        return "matmul"
    if "convolution" in name:
        return "convolution"
    return "attention" if "attention" in name else f"not known to be cheap ({name})"


class _Regions:
    """Forward/backward regions of a joint graph."""

    def __init__(self, joint: torch.fx.GraphModule, info: JointInfo):
        nodes = list(joint.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        self.primals = placeholders[: info.num_primals]
        self.tangents = placeholders[info.num_primals:]
        self.output = nodes[-1]
        outs = list(self.output.args[0])
        self.fw_outputs = outs[: info.num_fw_outputs]
        self.grads = outs[info.num_fw_outputs:]
        self.bw = set(self.tangents)
        for n in nodes:
            if n.op == "call_function" and any(a in self.bw for a in n.all_input_nodes):
                self.bw.add(n)
        self.fw_needed = _ancestors(self.fw_outputs, stop=set())
        self.bw_needed = _ancestors(self.grads, stop=set())
        self.order = {n: i for i, n in enumerate(nodes)}

    def read_by_backward(self) -> list:
        """Forward-region nodes the backward region reads (plus grads computed in the forward)."""
        out = {a for n in self.bw_needed if n in self.bw for a in n.all_input_nodes if a not in self.bw}
        out.update(g for g in self.grads if isinstance(g, torch.fx.Node) and g not in self.bw)
        return sorted(out, key=self.order.__getitem__)


def _view_root(node: torch.fx.Node) -> torch.fx.Node:
    """Follow view ops back to the node that owns the storage."""
    while node.op == "call_function" and node.target in _VIEW_OPS and node.args \
            and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _ancestors(roots, stop: set) -> set:
    seen: set = set()
    stack = [r for r in roots if isinstance(r, torch.fx.Node)]
    while stack:
        if (n := stack.pop()) in seen or n in stop:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


#: runtime checks (no output; they raise eager's error): kept in the graph that can compute their inputs
_CHECKS = {aten._assert_async.msg, aten._assert_async.default, aten._assert_scalar.default}


def _extract(joint: torch.fx.GraphModule, inputs: list, outputs: list, what: str,
             checks: bool = False) -> torch.fx.GraphModule:
    """A GraphModule computing ``outputs`` from ``inputs`` with the joint graph's nodes; with ``checks``, also every
    runtime check (:data:`_CHECKS`) and random op computable from ``inputs`` (the forward keeps them: a check no output
    depends on was dropped, and a division by zero returned numbers where eager raised; a dropout whose result is
    unused still draws eager's numbers, which the random ops after it follow)."""
    g = torch.fx.Graph()
    env: dict = {}
    for n in inputs:
        p = g.placeholder(n.name)
        p.meta = dict(n.meta)
        env[n] = p
    roots = list(outputs)
    if checks:
        for n in joint.graph.nodes:
            if n.op == "call_function" and (n.target in _CHECKS or _draws_random(n)) and \
                    not any(a.op == "placeholder" and a not in env for a in _ancestors([n], set(env))):
                roots.append(n)
    needed = _ancestors(roots, stop=set(env))
    for n in joint.graph.nodes:
        if n in needed and n not in env:
            if n.op == "placeholder":
                raise InternalError(f"aot partition: the {what} graph needs {n.name}, "
                                    "which is neither saved nor one of its inputs")
            env[n] = g.node_copy(n, env.__getitem__)
    g.output([env[o] if isinstance(o, torch.fx.Node) else o for o in outputs])
    return _make_graph_module(joint, g)


def _symbols_of(vals, plain: bool) -> set:
    """The size symbols in the sizes/strides of tensors and in SymInts among ``vals`` (``plain``: only those a value
    equals exactly, which a graph taking it can bind)."""
    exprs = [x.node.expr for v in vals for x in ((*v.shape, *v.stride()) if isinstance(
        v, torch.Tensor) else (v,)) if isinstance(x, torch.SymInt)]
    return {e for e in exprs if e.is_Symbol} if plain else set().union(*(e.free_symbols for e in exprs))


def _save_symbols(joint, regions: _Regions, saved: list, reasons: dict, bw) -> bool:
    """Save each input size symbol the backward graph ``bw`` uses but cannot bind from its inputs by the wrapper's rule
    (:func:`coil.codegen.wrapper.symbol_bindings`; a strided slice ``x[:, ::2]`` leaves it tensors of ``(s44 + 1) // 2``
    rows), as a SymInt primal or ``sym_size`` of a primal; True if one was missing."""
    missing = _symbols_of((n.meta.get("val") for n in bw.graph.nodes), False) - _symbols_of(
        (n.meta.get("val") for n in bw.graph.nodes if n.op == "placeholder"), True)
    missing &= _symbols_of((p.meta.get("val") for p in regions.primals), True)
    first = next(n for n in joint.graph.nodes if n.op != "placeholder")
    for sym in sorted(missing, key=str):
        for p in regions.primals:
            v = p.meta.get("val")
            sizes = [v] if isinstance(v, torch.SymInt) else list(getattr(v, "shape", ()))
            d = next((d for d, x in enumerate(sizes) if isinstance(x, torch.SymInt) and x.node.expr == sym), None)
            if d is not None:
                node = p
                if not isinstance(v, torch.SymInt):
                    with joint.graph.inserting_before(first):
                        node = joint.graph.call_function(torch.ops.aten.sym_size.int, (p, d))
                    node.meta["val"] = v.shape[d]
                saved.append(node)
                reasons[node] = f"size symbol {sym} for the backward"
                break
    return bool(missing)


def _build(joint, info: JointInfo, regions: _Regions, saved: list, reasons: dict, kind: str) -> Partition:
    bw = _extract(joint, saved + regions.tangents, regions.grads, "backward")
    if _save_symbols(joint, regions, saved, reasons, bw):
        bw = _extract(joint, saved + regions.tangents, regions.grads, "backward")
    fw = _extract(joint, regions.primals, regions.fw_outputs + saved, "forward", checks=True)
    saved_info = []
    storages: dict = {}
    for n in saved:
        root = _view_root(n)
        entry = {"name": n.name, "bytes": node_bytes(n), "reason": reasons.get(n, "")}
        if root.op == "placeholder":
            entry["aliases_input"] = root.name
        saved_info.append(entry)
        storages[root] = node_bytes(root) if root is not n else entry["bytes"]
    bw_nodes = {n.name for n in bw.graph.nodes if n.op == "call_function"}
    recomputed = [n.name for n in joint.graph.nodes
                  if n.op == "call_function" and n not in regions.bw and n.name in bw_nodes]
    total = sum(storages.values())  # bytes of distinct storages: a saved view of an input costs its input once
    trace.log("aot_partition", stage="aot", partitioner=kind, saved=saved_info,
              saved_bytes=total, recomputed=recomputed, num_saved=len(saved))
    return Partition(fw, bw, len(saved), total, saved_info, recomputed)


# --------------------------------------------------------------------------- partitioners

def default_partition(joint: torch.fx.GraphModule, info: JointInfo) -> Partition:
    """Save every forward-region value the backward reads; recompute nothing.

    Returns a :class:`Partition`. Tuple-valued nodes are never saved (their ``getitem`` users are)."""
    regions, saved = _Regions(joint, info), []
    for n in regions.read_by_backward():
        if _saveable(n):
            saved.append(n)
        else:
            saved.extend(u for u in n.users if u not in regions.bw and _saveable(u))
    saved = sorted(set(saved), key=regions.order.__getitem__)
    return _build(joint, info, regions, saved, dict.fromkeys(saved, "read by the backward"), "default")


def checkpointed(candidates, regions: _Regions) -> set:
    """Forward-region nodes inside an activation-checkpoint region (``meta["recompute"]`` a recompute
    ``CheckpointPolicy``, ``meta["ac_graph_id"]`` the region, set by capture on ``torch.utils.checkpoint.checkpoint``
    bodies and copied onto the ATen nodes by make_fx): never saved, always recomputed in the backward. A region's
    outputs (read by a forward node outside it, or returned by the forward) are kept (saved, as eager's checkpoint
    keeps the next region's inputs); random ops stay ordinary candidates (recomputing would draw other numbers)."""
    out, fw_outs = set(), set(regions.fw_outputs)
    for n in candidates:
        if (tag := _region_tag(n)) is None or n.op != "call_function":
            continue
        if _draws_random(n.args[0] if n.target is operator.getitem else n):
            continue
        if _saveable(n) and (n in fw_outs or any(u in regions.fw_needed and _region_tag(u) != tag for u in n.users)):
            continue
        out.add(n)
    return out


def _draws_random(n) -> bool:
    """A random op (recomputing it would draw other numbers); attention with ``dropout_p == 0`` draws nothing."""
    if not (isinstance(n, torch.fx.Node) and isinstance(n.target, torch._ops.OpOverload)) or \
            torch.Tag.nondeterministic_seeded not in n.target.tags:
        return False
    if "attention" in n.target._schema.name:
        return n.kwargs.get("dropout_p", n.args[3] if len(n.args) > 3 else 0.0) != 0
    return True


def _region_tag(n: torch.fx.Node):
    """A node's checkpoint region; a ``getitem`` of a tuple-valued node is in its producer's (the backward's reads of
    saved tuple items make untagged ones)."""
    if n.target is operator.getitem and n.meta.get("recompute") is None and isinstance(n.args[0], torch.fx.Node):
        n = n.args[0]
    return checkpoint_region(n)


def min_cut_partition(joint: torch.fx.GraphModule, info: JointInfo) -> Partition:
    """Save the fewest bytes that let the backward run; recompute cheap chains.

    See the module docstring for the flow network. Returns a :class:`Partition`. Raises :class:`InternalError` if the
    cut is infinite (a bug: something the backward needs can neither be saved nor recomputed)."""
    regions = _Regions(joint, info)
    sinks = regions.read_by_backward()
    candidates, inf = _ancestors(sinks, stop=regions.bw), math.inf
    arcs: list = []     # (from, to, capacity) of the flow network
    bans, must_recompute = {}, checkpointed(candidates, regions)
    grad_leaves = {regions.primals[i] for i in info.grad_inputs if i not in info.nonleaf_inputs}
    free_inputs = {p for p in regions.primals if p not in grad_leaves and isinstance(p.meta.get("val"), torch.Tensor)}
    for n in candidates:
        ban = recompute_ban_reason(n)
        if n in must_recompute:
            ban = None
        elif ban is None and _region_tag(n) is not None and n.op == "call_function":
            ban = "checkpoint region output (kept, as eager's checkpoint keeps its inputs)"
        bans[n] = ban
        cap = float(node_bytes(n)) if _saveable(n) and n not in must_recompute else inf
        # an input that does not require grad or is not a leaf, or a view of it, may be written after the call, which
        # eager allows where its autograd saved what it computed from the input (fuzz s1029 #176: a bool mask, its
        # float cast multiplied; s1042 #309: min(b, dim) saves its indices, not b): saved only where no computed value
        # can stand in (a leaf that requires grad cannot be written in place under grad mode)
        root = _view_root(n)
        if cap != inf and root in free_inputs:
            cap = cap * 1e6 + 1e6
        elif cap != inf and root is not n and root.op == "placeholder":
            cap += 0.25  # a leaf that requires grad over a view of it (t(weight)), as eager: nothing rebuilt per call
        # a tiny tie-breaker prefers saving values the forward computes anyway
        if cap != inf and n not in regions.fw_needed and n.op != "placeholder":
            cap += 0.5
        arcs.append((n.name + "_in", n.name + "_out", cap))
        if ban is not None:
            arcs.append(("source", n.name + "_in", inf))
        arcs.extend((a.name + "_out", n.name + "_in", inf) for a in n.all_input_nodes if a in candidates)
    arcs.extend((n.name + "_out", "sink", inf) for n in sinks)
    if (sink_side := _sink_side(arcs, "source", "sink")) is None:
        raise InternalError("aot min-cut: no finite cut (a value the backward needs can be "
                            "neither saved nor recomputed)")
    if must_recompute:
        trace.log("aot_checkpoint", stage="aot", recomputed=len(must_recompute))
    saved = sorted((n for n in candidates if n.name + "_in" not in sink_side and n.name + "_out" in sink_side),
                   key=regions.order.__getitem__)
    reasons = {n: f"not recomputable: {bans[n]}" if bans[n] is not None else
               "min cut: cheaper to save than to recompute from saved values" for n in saved}
    return _build(joint, info, regions, saved, reasons, "min_cut")


def _sink_side(arcs: list, source, sink) -> Optional[set]:
    """The nodes that reach ``sink`` in the residual network of a maximum ``source``-``sink`` flow over ``arcs``
    (``(u, v, capacity)``; ``math.inf`` allowed): the sink side of a minimum cut, the smallest one, the same for every
    maximum flow (so for any max-flow algorithm). None if an infinite-capacity path joins them (no finite cut).
    Dinic's algorithm: a breadth-first level graph, then augmenting paths along it (current-arc pointers) until
    none is left. Capacities here are multiples of 0.25 (bytes), exact in floats."""
    ids: dict = {}
    for u, v, _ in arcs:
        ids.setdefault(u, len(ids))
        ids.setdefault(v, len(ids))
    s, t = ids.setdefault(source, len(ids)), ids.setdefault(sink, len(ids))
    big = sum(c for *_, c in arcs if c != math.inf) + 1.0  # (more than any finite cut: never saturated)
    out: list = [[] for _ in ids]   # node -> its arc ids; arc e's reverse is e ^ 1
    to, cap, infinite = [], [], []
    for u, v, c in arcs:
        for a, b, r in ((ids[u], ids[v], c), (ids[v], ids[u], 0.0)):
            out[a].append(len(to))
            to.append(b)
            cap.append(big if r == math.inf else r)
            infinite.append(r == math.inf)

    def levels(usable) -> list:
        level = [-1] * len(out)
        level[s], queue = 0, [s]
        for u in queue:
            for e in out[u]:
                if usable(e) and level[to[e]] < 0:
                    level[to[e]] = level[u] + 1
                    queue.append(to[e])
        return level
    if levels(infinite.__getitem__)[t] >= 0:
        return None
    while (level := levels(lambda e: cap[e] > 0))[t] >= 0:
        arc, path, u = [0] * len(out), [], s
        while True:
            if u == t:
                f = min(cap[e] for e in path)
                for e in path:
                    cap[e] -= f
                    cap[e ^ 1] += f
                path, u = [], s
                continue
            arcs_u = out[u]
            while arc[u] < len(arcs_u) and not (cap[e := arcs_u[arc[u]]] > 0 and level[to[e]] == level[u] + 1):
                arc[u] += 1
            if arc[u] < len(arcs_u):
                path.append(e)
                u = to[e]
            elif path:              # a dead end: leave it and retreat
                level[u] = -1
                u = to[path.pop() ^ 1]
                arc[u] += 1
            else:
                break
    names = list(ids)
    seen, queue = {t}, [t]
    for v in queue:             # backwards along arcs with residual capacity
        for e in out[v]:
            if cap[e ^ 1] > 0 and to[e] not in seen:
                seen.add(to[e])
                queue.append(to[e])
    return {names[i] for i in seen}


@torch.library.custom_op("coil::grad_in", mutates_args=())
def grad_in(g: torch.Tensor, call: int) -> torch.Tensor:
    """A gradient entering a custom ``autograd.Function``'s backward in a traced joint graph (an identity, stripped
    before compiling: :func:`strip_grad_in`; ``call`` numbers that backward's call, the same for all its gradients).
    Autograd materializes an undefined one there as zeros when that node runs (``ctx.materialize_grads``), where a
    built-in op's backward keeps it undefined: see :func:`drop_undefined_tangents`."""
    return g.clone()


@grad_in.register_fake
def _grad_in_fake(g, call):
    return torch.empty_like(g)


def _is_grad_in(n) -> bool:
    return n.op == "call_function" and n.target is torch.ops.coil.grad_in.default


def strip_grad_in(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with each :func:`grad_in` replaced by its input (in place)."""
    for n in [n for n in gm.graph.nodes if _is_grad_in(n)]:
        n.replace_all_uses_with(n.args[0])
        gm.graph.erase_node(n)
    gm.recompile()
    return gm


def grad_in_tangents(bw: torch.fx.GraphModule, num_saved: int) -> list:
    """Positions of the tangents of backward graph ``bw`` that reach a custom Function's backward (:func:`grad_in`)."""
    places = [n for n in bw.graph.nodes if n.op == "placeholder"][num_saved:]
    deps = {n: {k} for k, n in enumerate(places)}
    found: set = set()
    for n in bw.graph.nodes:
        if n.op == "call_function":
            deps[n] = set().union(*(deps.get(a, ()) for a in n.all_input_nodes))
            if _is_grad_in(n):
                found |= deps[n]
    return sorted(found)


def drop_undefined_tangents(bw: torch.fx.GraphModule, num_saved: int, missing: tuple, reached: tuple = ()) -> tuple:
    """(graph, per output: is it None) of backward graph ``bw`` for calls whose tangents at positions ``missing`` are
    undefined (autograd's None: an output the loss does not use). Eager skips the backward of an op whose incoming
    gradient is undefined; zeros in their place are not the same (``x * 2, x.sqrt()`` of ``x = 0``, the loss on the
    first: ``2 + 0 * inf``). Backward values are linear in the tangents: one computed from undefined ones only is
    undefined (an undefined output is a None gradient), ``add`` of an undefined and a defined one is the defined one,
    any other op mixing them reads zeros for the undefined one. Tangents ``reached`` (of ``missing``) are outputs
    the backward pass reached with an undefined gradient: a custom Function's backward the undefined value enters
    (:func:`grad_in`) runs in eager, on zeros; so it does where another gradient of that call is defined."""
    g = copy.deepcopy(bw.graph)
    places = [n for n in g.nodes if n.op == "placeholder"]
    undef, dep = {places[num_saved + k] for k in missing}, set(places[num_saved:])
    live = {places[num_saved + k] for k in reached}
    meta = lambda n: (getattr(v := n.meta.get("val"), "shape", None), getattr(v, "dtype", 0))  # noqa: E731
    for n in list(g.nodes):
        ins = [a for a in n.all_input_nodes if a in dep]
        if n.op != "call_function" or not ins or isinstance(n.meta.get("val"), (int, float, bool, torch.SymInt)):
            continue
        dep.add(n)
        if any(a in live for a in ins):
            live.add(n)
        if _is_grad_in(n) and n.args[0] in undef:
            # materialized (zeros, a defined gradient from here on) where the call's node runs
            if n in live or any(m.args[0] not in undef for m in g.nodes if _is_grad_in(m) and m.args[1] == n.args[1]):
                with g.inserting_before(n):
                    z = g.call_function(aten.zeros_like.default, (n.args[0],))
                z.meta = dict(n.meta)
                n.replace_all_uses_with(z)
            else:
                undef.add(n)
            continue
        off = [a for a in ins if a in undef]  # (an add's other term is a gradient even if constant: copysign's zeros)
        on = [a for a in (n.all_input_nodes if n.target is aten.add.Tensor else ins) if a not in undef]
        if off and not on:
            undef.add(n)
        elif off and n.target is aten.add.Tensor and not n.kwargs and len(on) == 1 and meta(on[0]) == meta(n):
            n.replace_all_uses_with(on[0])
        for a in off if on and n.users else ():
            with g.inserting_before(n):
                n.replace_input_with(a, z := g.call_function(aten.zeros_like.default, (a,)))
            z.meta = dict(a.meta)
    out = next(n for n in g.nodes if n.op == "output")
    none, out.args = [o in undef for o in out.args[0]], ([o for o in out.args[0] if o not in undef],)
    g.eliminate_dead_code()
    return strip_grad_in(_make_graph_module(bw, g)), none
