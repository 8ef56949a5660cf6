"""Common-subexpression elimination on functional ATen graphs (docs/aot.md, "CSE").

Hugging Face models slice and expand the attention mask inside every attention call: a 12-layer GPT-2 graph held
12 identical ``slice``/``expand`` chains, and code generation materialized 12 identical masks. This pass keeps the first
of every set of nodes that call the same ``OpOverload`` on the same arguments (nodes by identity after earlier merges,
Python values by equality and type) and points the users of the others at it. Ops that mutate or draw random numbers,
duplicates that are graph outputs (two outputs stay two tensors, as in eager) and placeholders are left alone."""
from __future__ import annotations

import torch
import torch.fx

from coil import trace

__all__ = ["cse_graph", "drop_dead_views"]


def _is_pure(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable and \
        torch.Tag.nondeterministic_seeded not in target.tags and \
        not any(a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)


def _key(value):
    """A hashable, type-exact key for a node argument (None if it cannot be keyed)."""
    if isinstance(value, torch.fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        parts = tuple(_key(v) for v in value)
        return None if any(p is None for p in parts) else (type(value).__name__, parts)
    if isinstance(value, dict):
        parts = tuple((k, _key(v)) for k, v in sorted(value.items()))
        return None if any(p[1] is None for p in parts) else ("dict", parts)
    if isinstance(value, (bool, int, float, str, type(None), torch.dtype, torch.device,
                          torch.layout, torch.memory_format)):
        if isinstance(value, float):  # NaN != NaN: never merge; -0.0 == 0.0 but where(c, -0.0, 0.0) differs
            return None if value != value else ("float", value.hex())
        return (type(value).__name__, value)
    return None


def cse_graph(gm: torch.fx.GraphModule) -> int:
    """Merge duplicate pure nodes of ``gm`` in place; returns how many were removed (logged as event ``aot_cse``)."""
    seen: dict = {}
    removed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not _is_pure(node.target):
            continue
        args, kwargs = _key(node.args), _key(node.kwargs)
        if args is None or kwargs is None:
            continue
        key = (node.target, args, kwargs)
        if (first := seen.get(key)) is None:
            seen[key] = node
            continue
        if any(u.op == "output" for u in node.users):
            continue  # two outputs must stay two tensors, as in eager
        node.replace_all_uses_with(first)
        gm.graph.erase_node(node)
        removed += 1
    if removed:
        gm.graph.lint()
        gm.recompile()
    trace.log("aot_cse", stage="aot", removed=removed)
    return removed


def drop_dead_views(gm: torch.fx.GraphModule) -> int:
    """Erase the view nodes of ``gm`` nothing reads (last first, so chains go); returns how many. Functionalization
    leaves one where an ``as_strided`` read was taken again of a value laid out at eager's strides and offset
    (aot/functional.py): the first one, of a value that starts at 0, may reach past that value's storage, which
    the FX interpreter (the "coil" backend's fallback) refused though nothing reads it (s315 #543)."""
    removed = 0
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target.is_view \
                and not node.users and not node.target._schema.is_mutable:
            gm.graph.erase_node(node)
            removed += 1
    if removed:
        gm.recompile()
    return removed
