"""Torch functions that capture records as a checked equivalent written with other ops.

Some ops check their arguments' *values* in eager but lose the check once traced on fake tensors. ``F.one_hot(i, n)``
raises for a class outside ``[0, n)`` in eager; traced, it becomes ``i.unsqueeze(-1) == arange(n)``, which returns an
all-zero row instead (a label bug became a zero target, user report 16). The substitute computes the same values with an
op whose generated kernels check the index (``index_select``: an IndexError on the CPU backends, a device assert under
Triton's debug mode), and keeps fusing: the identity matrix it gathers from is pointwise, so ``one_hot(i, n).float() *
2`` is still one kernel.

Attention with symbolic sizes is recorded as the opaque op ``coil::sdpa`` (:func:`sdpa`),
so that choosing its kernel adds no guards on the sizes.

:func:`substitute` is applied to every ``call_function`` target capture records."""
from __future__ import annotations

import math
import operator
import sys
import types
import weakref
from typing import Callable, Optional

import torch
import torch.utils._pytree as pytree
from torch.utils.checkpoint import CheckpointPolicy

from coil import trace


def one_hot(x: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``F.one_hot`` (int64, shape ``x.shape + (num_classes,)``) with the class index bounds-checked by
    ``index_select``. ``num_classes=-1`` (read from the data) is ``F.one_hot`` itself; a symbolic count stays symbolic
    (``F.one_hot``'s own pinned it: one graph per size)."""
    if not isinstance(num_classes, (int, torch.SymInt)) or num_classes < 0 or x.dtype != torch.int64:
        return torch.nn.functional.one_hot(x, num_classes)
    if num_classes == 0 and x.numel() != 0:
        # every class is out of range, and the gather below would be empty (no check)
        raise RuntimeError("Class values must be smaller than num_classes.")
    iota = torch.arange(num_classes, device=x.device)
    return torch.index_select((iota.unsqueeze(1) == iota).long(), 0, x.reshape(-1)).reshape(*x.shape, num_classes)


def run_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
             is_causal: bool, scale: Optional[float], enable_gqa: bool) -> torch.Tensor:
    """What ``coil::sdpa`` runs: ``F.scaled_dot_product_attention`` (shape ``q.shape[:-1]
    + (v.shape[-1],)``, q's dtype; eager's errors for mismatched sizes)."""
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


_sdpa_op = torch.library.custom_op("coil::sdpa", run_sdpa, mutates_args=())


@_sdpa_op.register_fake
def _(q, k, v, attn_mask, is_causal, scale, enable_gqa):
    shape = (*q.shape[:-1], v.shape[-1])
    if q.dim() != 4 or q.device.type != "cuda":  # the CPU's flash kernel returns q's layout, its math kernel contiguous
        flash = q.dim() == 4 and q.shape[-1] == k.shape[-1] == v.shape[-1] and all(t.stride(-1) == 1 for t in (q, k, v))
        return torch.empty_like(q) if flash and q.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16) \
            else q.new_empty(shape)
    # (B, H, L, D) in (B, L, H, D) memory order: the layout CUDA's fused kernels return
    return q.new_empty((shape[0], shape[2], shape[1], shape[3])).transpose(1, 2)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` (output shape ``query.shape[:-1] + (value.shape[-1],)``, query's dtype). With
    symbolic sizes and nothing to differentiate it is the opaque op ``coil::sdpa``, which picks its kernel when it runs:
    traced, the kernel choice (``_fused_sdp_choice``, on CUDA C++ checks of the sizes and of the mask's alignment) and
    the chosen kernel's mask padding added guards on the sequence length (``L % 8 == 0``: a recompile for each new
    residue class). Static sizes, a gradient or dropout keep the traced ATen ops."""
    if isinstance(scale, torch.SymFloat) and isinstance(query.shape[-1], int):
        # a changing scale: scale query (the default scale undone) instead of pinning it
        query, scale = query * (scale * math.sqrt(query.shape[-1])), None
    sym = any(isinstance(n, torch.SymInt) for t in (query, key) for n in t.shape)
    grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (query, key, value, attn_mask))
    if not sym or grad or dropout_p:
        kw = {"enable_gqa": True} if enable_gqa else {}
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)
    trace.log("opaque_op", stage="capture", op="coil::sdpa",
              reason="symbolic sizes: the kernel is chosen per call, not by guards on them")
    query, key, value, attn_mask = _autocast_casts((query, key, value, attn_mask))   # (trial 80 #2)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # eager makes a boolean mask additive (0 / -inf in query's dtype) in every call:
        # two ATen kernels per layer. As graph nodes, AOT's CSE keeps one conversion for
        # all layers that share the mask, and it fuses with the mask's own kernel
        attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
    return _sdpa_op(query, key, value, attn_mask, bool(is_causal), scale, bool(enable_gqa))


def _autocast_casts(values):
    """``values``, each float tensor but float64 cast as autocast casts a lower-precision op's arguments: for a
    substitute that runs the op in a form autocast does not cast (``coil::sdpa``, a custom op: float32 attention)."""
    def cast(t):
        on = t.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(t.device.type) and t.dtype != torch.float64
        return t.to(torch.get_autocast_dtype(t.device.type)) if on and t.is_floating_point() else t
    return pytree.tree_map_only(torch.Tensor, cast, values)


def lstm(input, hx, *args):
    """``torch.lstm``. Under CPU autocast eager runs a padded sequence as oneDNN's ``mkldnn_rnn_layer``, a
    lower-precision autocast op: its float32 tensors cast, a bfloat16 result. Traced with oneDNN off (coil's joint
    trace, ``_without_mkldnn``), as cell ops reading the cast values in float32 (oneDNN's gates are float32): they
    mixed autocast's bfloat16 products with float32 h0 / c0, a float32 result (trial 80 #3)."""
    if not (isinstance(hx, (tuple, list)) and input.device.type == "cpu" and torch.is_autocast_enabled("cpu")
            and input.dtype in (torch.float32, torch.bfloat16) and hx[0].shape[-1] == hx[1].shape[-1]
            and torch.backends.mkldnn.is_available()):  # (where eager takes oneDNN: no projections)
        return torch.lstm(input, hx, *args)
    low, values = torch.get_autocast_dtype("cpu"), _autocast_casts((input, hx, args))
    if not torch._C._get_mkldnn_enabled():
        values = pytree.tree_map_only(torch.Tensor, lambda t: t.float() if t.dtype == low else t, values)
    with torch.autocast("cpu", enabled=False):
        return pytree.tree_map_only(torch.Tensor, lambda t: t.to(low), torch.lstm(values[0], values[1], *values[2]))


#: coil's opaque ops -> their Python implementations, which generated wrappers call directly: a custom op's dispatch
#: (autograd wrapper, redispatch) cost ~40 us of Python per call on CPU, 12 times per GPT-2 forward
OPAQUE_IMPLS: dict = {torch.ops.coil.sdpa.default: run_sdpa}


def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """``torch.tensor`` of a symbolic int or float as ``torch.full((), data)``, and of a (nested) list holding some as a
    ``stack`` of those: one graph for every value. torch's own traced into a constant, specialized per value, and kept
    only the low 32 bits of an int above 2**31 (``torch.tensor(n)``, n = 2**40 + 1: 1)."""
    sym = (torch.SymInt, torch.SymFloat)
    flat = pytree.tree_leaves(data)
    if not any(isinstance(v, sym) for v in flat) or requires_grad and not isinstance(data, sym):
        return torch.tensor(data, dtype=dtype, device=device, requires_grad=requires_grad, pin_memory=pin_memory)
    # eager's dtype and shape, from the values' hints (an unbacked one has none: a float of its
    # kind, so torch.tensor(x.sum().item()) stays float, not int64 truncating 3.75 to 3)
    like = torch.tensor(pytree.tree_map(lambda v: (v.node.hint if v.node.hint is not None else
                                                   1.0 if isinstance(v, torch.SymFloat) else 1)
                                        if isinstance(v, sym) else v, data), dtype=dtype)
    if isinstance(data, sym):
        return torch.full((), data, dtype=like.dtype, device=device, requires_grad=requires_grad)
    return torch.stack([torch.full((), v, dtype=like.dtype, device=device) for v in flat]).reshape(like.shape)


def as_tensor(data, dtype=None, device=None):
    """``torch.as_tensor`` of a symbolic number or a list holding some: :func:`tensor` (a new tensor in eager too);
    traced, the value was pinned (one graph per value)."""
    if isinstance(data, torch.Tensor) or not any(isinstance(v, (torch.SymInt, torch.SymFloat))
                                                 for v in pytree.tree_leaves(data)):
        return torch.as_tensor(data, dtype=dtype, device=device)
    return tensor(data, dtype=dtype, device=device)


def _symbolic(*sizes) -> bool:
    return any(isinstance(n, torch.SymInt) for n in sizes)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """``F.max_pool1d`` (and ``torch.max_pool1d``) of a symbolic length as ``max_pool2d_with_indices`` over a height of
    1: ATen's C++ composites read the length as an int (one graph per length)."""
    if not _symbolic(*input.shape) or return_indices:  # (a stride of 0 raises as in eager: not read as None)
        return torch.nn.functional.max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    k, st, p, d = (tuple(v)[0] if isinstance(v, (tuple, list)) else v
                   for v in (kernel_size, kernel_size if stride in (None, [], ()) else stride, padding, dilation))
    return torch.ops.aten.max_pool2d_with_indices(input.unsqueeze(-2), [1, k], [1, st], [0, p], [1, d],
                                                  ceil_mode)[0].squeeze(-2)


def adaptive_avg_pool1d(input, output_size):
    """``torch.adaptive_avg_pool1d`` of a symbolic output size as the 2-d pool over a height of 1: ATen's C++ composite
    read the size as an int (one graph per size, also for ``F.interpolate(mode="area")``)."""
    n = output_size[0] if isinstance(output_size, (tuple, list)) and len(output_size) == 1 else output_size
    if not _symbolic(n) or input.dim() not in (2, 3):
        return torch.adaptive_avg_pool1d(input, output_size)
    return torch.ops.aten._adaptive_avg_pool2d(input.unsqueeze(-2), [1, n]).squeeze(-2)


def linspace(start, end, steps, *, dtype=None, device=None, layout=None, requires_grad=False,
             pin_memory=False, out=None):
    """``torch.linspace`` of a symbolic number of steps, as eager's CPU kernel computes it
    (from ``start`` up to the middle, from ``end`` down after it, in the result's float
    dtype): traced, the count was pinned (one graph per size)."""
    dt = dtype or torch.get_default_dtype()
    if not _symbolic(steps) or out is not None or requires_grad or not dt.is_floating_point \
            or isinstance(start, torch.Tensor) or isinstance(end, torch.Tensor):
        return torch.linspace(start, end, steps, dtype=dtype, device=device, requires_grad=requires_grad,
                              **({"out": out} if out is not None else {}))
    # (one step: eager's value is start; sym_max keeps that in a graph where steps may be 1, a size marked unbacked)
    i, step = torch.arange(steps, device=device, dtype=dt), (end - start) / torch.sym_max(steps - 1, 1)
    return torch.where(i < torch.sym_max(steps // 2, 1), start + i * step, end - (steps - 1 - i) * step)


def _triu_count(row, col, offset):
    """How many ``(i, j)`` of a ``row`` x ``col`` grid have ``j - i >= offset``: ``min(row, lo)`` full rows, then rows
    of ``col - offset - i`` elements for ``i`` in ``[lo, hi)`` (symbolic: ``sym_min``/``sym_max``, no guard)."""
    lo, hi = torch.sym_max(0, 1 - offset), torch.sym_min(row, col - offset)
    b = torch.sym_max(0, hi - lo)
    return torch.sym_min(row, lo) * col + b * (2 * (col - offset) - lo - hi + 1) // 2


def _triangle_indices(upper: bool, row, col, offset=0, *, dtype=torch.long, device=None, layout=torch.strided,
                      pin_memory=False):
    """``torch.triu_indices`` (``upper``) / ``tril_indices`` of symbolic sizes: the grid's positions kept by the
    mask, scattered in row-major order into a ``(2, N)`` result of the closed-form count ``N``; traced, ATen's int
    sizes were pinned (one graph per size)."""
    op = torch.triu_indices if upper else torch.tril_indices
    if not _symbolic(row, col, offset) or isinstance(offset, torch.SymInt) or layout not in (None, torch.strided):
        return op(row, col, offset, dtype=dtype, device=device, layout=layout, pin_memory=pin_memory)
    n = _triu_count(row, col, offset) if upper else row * col - _triu_count(row, col, offset + 1)
    k = torch.arange(row * col, device=device)
    i, j = k // col, k % col
    keep = j - i >= offset if upper else j - i <= offset
    dest = torch.where(keep, torch.cumsum(keep, 0) - 1, n).expand(2, -1)
    out = torch.zeros((2, n + 1), dtype=torch.long, device=device).scatter(1, dest, torch.stack([i, j]))
    return out[:, :n].to(dtype or torch.long).contiguous()  # eager's (N, 1) strides, not the (N + 1, 1) of the slice


def triu_indices(row, col, offset=0, **kwargs):
    """``torch.triu_indices`` of symbolic sizes in one graph (:func:`_triangle_indices`)."""
    return _triangle_indices(True, row, col, offset, **kwargs)


def tril_indices(row, col, offset=0, **kwargs):
    """``torch.tril_indices`` of symbolic sizes in one graph (:func:`_triangle_indices`)."""
    return _triangle_indices(False, row, col, offset, **kwargs)


#: torch function -> the function capture records in its place
SUBSTITUTES: dict[Callable, Callable] = {torch.nn.functional.one_hot: one_hot, torch.tensor: tensor,
                                         torch.as_tensor: as_tensor, torch.max_pool1d: max_pool1d,
                                         torch.linspace: linspace, torch.triu_indices: triu_indices,
                                         torch.tril_indices: tril_indices, torch.nn.functional.max_pool1d: max_pool1d,
                                         torch.adaptive_avg_pool1d: adaptive_avg_pool1d,
                                         torch.nn.functional.scaled_dot_product_attention: sdpa, torch.lstm: lstm}


def substitute_graph(gm: torch.fx.GraphModule) -> None:
    """Apply :func:`substitute` to a torch-level FX graph from another capture
    (``torch.compile(backend="coil")``), in place."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.target is torch.ops.higher_order.tag_activation_checkpoint and \
                not getattr(gm, node.args[0].target).graph.find_nodes(op="get_attr"):  # (not nested ones)
            _inline_checkpoint(gm, node)
            changed = True
        elif node.op == "call_function":
            if (new := substitute(node.target)) is not node.target:
                node.target, changed = new, True
        if node.target in (operator.pow, operator.ipow, torch.pow, "pow", "pow_"):
            changed = _pow_scalars_as_tensors(gm.graph, node) or changed
    if changed:
        gm.recompile()


def _pow_scalars_as_tensors(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """The capture's rule for a pow of a tensor that needs grad (``call_op`` in variables/tensor.py), in torch's graph:
    a symbolic base or exponent becomes a 0-d tensor (ATen's pow backward cannot read a SymInt scalar)."""
    vals = [a.meta.get("example_value") if isinstance(a, torch.fx.Node) else a for a in node.args]
    t = next((v for v in vals if isinstance(v, torch.Tensor) and v.requires_grad), None)
    if t is None or not any(isinstance(v, (torch.SymInt, torch.SymFloat)) for v in vals):
        return False
    with graph.inserting_before(node):
        dt = t.dtype if t.dim() == 0 else torch.promote_types(t.dtype, torch.float32)   # (a 0-d t: no promotion)
        node.args = tuple(graph.call_function(torch.full, ((), a), {"dtype": dt})
                          if isinstance(v, (torch.SymInt, torch.SymFloat)) else a for a, v in zip(node.args, vals))
    return True


def _inline_checkpoint(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    """torch's capture of ``torch.utils.checkpoint.checkpoint``, a ``tag_activation_checkpoint`` call of a
    subgraph, inlined and tagged as coil's capture does (``call_checkpoint``): run as a HOP by make_fx,
    eager's checkpoint machinery refused an in-place op or dropout in the body."""
    from coil.capture.variables.hops import _region_ids
    body, region, before = getattr(gm, node.args[0].target), next(_region_ids), set(gm.graph.nodes)
    with gm.graph.inserting_before(node):
        outs = gm.graph.graph_copy(body.graph, dict(zip(body.graph.find_nodes(op="placeholder"), node.args[1:])))
    for n in set(gm.graph.nodes) - before:
        if "recompute" not in n.meta:
            n.meta.update(recompute=CheckpointPolicy.PREFER_RECOMPUTE, ac_graph_id=region)
    for u in list(node.users):
        u.replace_all_uses_with(outs[u.args[1]])
        gm.graph.erase_node(u)
    gm.graph.erase_node(node)


def substitute(target):
    """The function to record for ``call_function`` target ``target``."""
    try:
        new = SUBSTITUTES.get(target, target)
    except TypeError:  # unhashable target
        return target
    return _by_object(new) if isinstance(new, types.FunctionType) and _misnamed(new) else new


_CALLERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _misnamed(fn: types.FunctionType) -> bool:
    """FX writes a torch function into the graph's code by its ``__module__`` and name, so a torch function that is not
    there by that name was called as another: ``torch.func.jacrev(torch.tanh)`` (``functools.wraps``) as ``torch.tanh``,
    a silent wrong result under backends that run the graph's code."""
    module = fn.__module__ or ""
    return module.startswith("torch") and getattr(sys.modules.get(module), fn.__name__, None) is not fn


def _by_object(fn: types.FunctionType) -> Callable:
    """A caller of ``fn`` that FX refers to as an object (a global of the graph's code), not by name."""
    if fn not in _CALLERS:
        def call(*args, **kwargs):
            return fn(*args, **kwargs)
        call.__name__ = call.__qualname__ = fn.__name__
        _CALLERS[fn] = call
    return _CALLERS[fn]
