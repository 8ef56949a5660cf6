"""Partitioning for CUDA graphs: split an ATen graph around the ops a CUDA graph cannot
hold, so that the rest is still recorded (docs/cudagraphs.md, "Partitioning").

In: one functional ATen graph about to be compiled under ``config.cudagraphs``, its kind (``gm.meta["coil_aot_graph"]``)
and the compiler the AOT layer would use for it. Out: one callable with the graph's calling convention that runs
*pieces* in order, each compiled alone by that compiler: the graphable ones wrapped by
:func:`~coil.runtime.cudagraph_trees.cudagraphify`, the others (:func:`~coil.runtime.cudagraph_record.ungraphable_node`)
run as compiled code between them. Each op's level (odd: un-graphable, even: graphable, not below what it reads) is its
piece; splits are logged (``cudagraph_split``)."""
from __future__ import annotations

import operator
from typing import Callable

import torch

from coil import trace
from coil.runtime.cudagraph_record import ungraphable_node
from coil.config import config

__all__ = ["partitioning", "split_levels", "PartitionedGraph"]


def partitioning(compiler: Callable) -> Callable:
    """``compiler(gm, example_inputs)``, except that a graph holding un-graphable ops is
    compiled as pieces (module docstring) when ``config.cudagraphs`` is on."""
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        if config.cudagraphs:
            levels, reasons = split_levels(gm)
            if reasons and any(lv % 2 == 0 and not _is_view(n) for n, lv in levels.items()):
                return PartitionedGraph(gm, levels, reasons, compiler)
        return compiler(gm, example_inputs)
    return compile_graph


def _is_view(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.target is operator.getitem or (schema is not None and any(
        a.alias_info is not None and not a.alias_info.is_write for a in schema.returns))


def split_levels(gm: torch.fx.GraphModule) -> tuple[dict, dict]:
    """``(levels, reasons)``: the level of every op node (even: graphable) and, for
    each un-graphable one, why (module docstring)."""
    levels, reasons = {}, {}
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method", "call_module"):
            continue
        base = max((levels.get(i, 0) for i in n.all_input_nodes), default=0)
        if n.target is operator.getitem and n.args[0] in levels:
            levels[n] = levels[n.args[0]]
            continue
        if (why := ungraphable_node(n)) is not None:
            reasons[n] = why
        levels[n] = base + ((base % 2 == 0) == (why is not None))
    return levels, reasons


class PartitionedGraph:
    """One ATen graph run as pieces compiled apart (module docstring). Calling it returns the graph's outputs
    as a tuple; ``output_strides`` is None (pieces return the traced layouts)."""

    #: read by cudagraphify: the pieces are wrapped already
    cudagraph_partitioned = True
    output_strides = None

    def __init__(self, gm: torch.fx.GraphModule, levels: dict, reasons: dict, compiler: Callable):
        from coil.aot.regions import graph_piece  # (coil.aot imports this module)
        from coil.runtime.cudagraph_trees import cudagraphify
        kind = gm.meta.get("coil_aot_graph", "inference")
        saved = gm.meta.get("coil_saved_outputs")
        nodes = list(gm.graph.nodes)
        out_node = nodes[-1]
        flat = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
        user = {a for a in flat[:saved[0]] if isinstance(a, torch.fx.Node)} if saved else set()
        # value node -> index in a call's list of values
        slot: dict = {n: i for i, n in enumerate([n for n in nodes if n.op == "placeholder"]
                                                 + [n for n in nodes if n.op == "get_attr"])}
        self.constants = [(slot[n], getattr(gm, n.target)) for n in nodes if n.op == "get_attr"]
        self.n_inputs = sum(1 for n in nodes if n.op == "placeholder")
        readers: dict = {}
        for n in nodes:
            for i in n.all_input_nodes:
                readers.setdefault(i, set()).add(levels.get(n, float("inf")))
        self.pieces: list = []
        for lv in sorted(set(levels.values())):
            members = [n for n in nodes if levels.get(n) == lv]
            ins = list(dict.fromkeys(i for n in members for i in n.all_input_nodes if levels.get(i) != lv))
            outs = [n for n in members if any(r > lv for r in readers.get(n, ()))]
            outs.sort(key=lambda n: n not in user)
            piece = graph_piece(gm, members, ins, outs)
            piece.meta.update(coil_aot_graph=kind, coil_aot_piece=True)  # not the last reader of saved values
            devices = {v.device.type for n in members + ins for v in [n.meta.get("val")] if isinstance(v, torch.Tensor)}
            # a piece moving tensors between devices runs its ATen ops as they are (one
            # compiled graph's kernels are generated for one device)
            fn = piece.forward if len(devices) > 1 else compiler(piece, [i.meta.get("val") for i in ins])
            if lv % 2 == 0:  # graphable
                fn = cudagraphify(fn, kind, (sum(o in user for o in outs), len(outs)) if kind == "forward" else None)
            for o in outs:
                slot[o] = len(slot)
            self.pieces.append((fn, [slot[i] for i in ins], [slot[o] for o in outs]))
        self.outputs = [("slot", slot[a]) if isinstance(a, torch.fx.Node) else ("const", a) for a in flat]
        self.n_slots = len(slot)
        trace.log("cudagraph_split", stage="runtime", graph=kind, pieces=len(self.pieces),
                  graphed=sum(1 for lv in set(levels.values()) if lv % 2 == 0),
                  ungraphable={n.name: why for n, why in reasons.items()})

    def __call__(self, *args):
        vals = list(args) + [None] * (self.n_slots - len(args))
        for i, c in self.constants:
            vals[i] = c
        for fn, ins, outs in self.pieces:
            for i, v in zip(outs, fn(*[vals[i] for i in ins])):
                vals[i] = v
        return tuple(vals[x] if kind == "slot" else x for kind, x in self.outputs)
