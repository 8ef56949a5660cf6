"""Lowerings that re-index instead of computing: views, indexing, concatenation,
padding, scatter-into-slice, creation ops.

Views of realized buffers become :class:`ReinterpretView` (a new strided layout on the same storage: extern kernels can
take them as ``as_strided`` tensors); views of unrealized bodies become :class:`GenericView` (an index function), so a
chain of views costs nothing until a kernel reads it."""
from __future__ import annotations

import functools
from typing import Callable, Optional

import sympy
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

from coil.config import config
from coil.ir.lowering import (FallbackToExtern, _full, broadcast_loader, device, is_box, loader_as, make_pointwise_box,
                              out_dtype, out_size, register_lowering, require_scalars_fit)
from coil.ir.nodes import (ConcatBuffer, ConcatSlice, ConcatStorage, GenericView, InputBuffer, Layout, Pointwise,
                           ReinterpretView, ScatterBuffer, StorageBox, TensorBox, current_graph)
from coil.ir.symbols import (FloorDiv, Mod, as_expr, as_size, broadcasts, contiguous_strides, current_shape_env,
                             guard_true, is_static, linear_index, product, unflatten)
from coil.ir.virtualized import compute_dtype, ops

aten = torch.ops.aten


def strided_base(x: TensorBox):
    """(buffer, layout) when ``x`` is a realized buffer or a strided view of one."""
    if isinstance(d := x.data, StorageBox) and d.is_realized():
        return d.data, d.data.layout
    return (d.data, d.layout) if isinstance(d, ReinterpretView) else None


def make_view(x: TensorBox, size, reindex: Callable, restride: Optional[Callable]) -> TensorBox:
    """View ``x`` with ``size``: ``new[index] = x[reindex(index)]``. ``restride(layout)``
    gives the strided layout of the view of a realized buffer, or None if not expressible."""
    size = [as_expr(s) for s in size]
    if (base := strided_base(x)) is not None and restride is not None:
        buf, layout = base
        if (new := restride(layout)) is not None:
            return TensorBox(ReinterpretView(buf, new))
    return TensorBox(GenericView(x.data, size, reindex, restride))


def _lay(layout, size, stride, offset=None) -> Layout:
    return Layout(layout.device, layout.dtype, list(size), list(stride), layout.offset if offset is None else offset)


def view_reshape(x: TensorBox, new_size) -> TensorBox:
    """``x.view(new_size)`` (any logical reshape; -1 allowed)."""
    old = list(x.get_size())
    new_size = [as_expr(s) for s in new_size]
    if any(s == -1 for s in new_size):
        known = product(s for s in new_size if s != -1)
        new_size = [product(old) // known if s == -1 else s for s in new_size]
    if [s for s in old if s != 1] == [s for s in new_size if s != 1]:
        kept_old = [d for d, s in enumerate(old) if s != 1]  # only size-1 dims move: a pure unsqueeze/squeeze pattern
        kept_new = [d for d, s in enumerate(new_size) if s != 1]

        def reindex(index):
            out = [sympy.Integer(0)] * len(old)
            for do, dn in zip(kept_old, kept_new):
                out[do] = index[dn]
            return out

        def restride(layout):
            stride = [sympy.Integer(1)] * len(new_size)
            for do, dn in zip(kept_old, kept_new):
                stride[dn] = layout.stride[do]
            return _lay(layout, new_size, stride)
        return make_view(x, new_size, reindex, restride)
    memo: dict = {}

    def reindex(index):
        # each body reading the view asks again with the same loop symbols (Swin's window partition: five
        # reshapes deep); static shapes only, where the expression depends on nothing else
        if current_shape_env() is not None:
            return unflatten(linear_index(index, new_size), old)
        if (key := tuple(index)) not in memo:
            memo[key] = unflatten(linear_index(index, new_size), old)
        return list(memo[key])

    def restride(layout):
        if all(st == c or s == 1 for s, st, c in zip(layout.size, layout.stride, contiguous_strides(layout.size))):
            return _lay(layout, new_size, contiguous_strides(new_size))
        stride = view_strides(layout.size, layout.stride, new_size)
        return _lay(layout, new_size, stride) if stride is not None else None
    return make_view(x, new_size, reindex, restride)


def view_strides(old_size, old_stride, new_size) -> Optional[list]:
    """Strides of ``new_size`` viewing a tensor of ``old_size``/``old_stride`` without a
    copy, or None when no strides can (``Tensor.view``'s rule: each run of old dims that
    are contiguous with each other may be split or merged, never crossed).

    E.g. a (32, 32) slice with strides (96, 1) of a (32, 96) matmul output viewed as (2, 16, 4, 8) gets strides (1536,
    96, 8, 1): GPT-2's q/k/v reach attention as views of the QKV projection, like in eager, instead of copies. Symbolic
    sizes and strides are matched as polynomials (a run of (s0, s1) dims is split into (s0, s1, ...) new dims when the
    products agree); under dynamic shapes the copies were three kernels per attention layer."""
    osz, ost, nsz = ([as_expr(v) for v in xs] for xs in (old_size, old_stride, new_size))

    def eq(a, b):
        return sympy.expand(a - b) == 0
    chunks = []  # chunks of old dims (innermost first): (numel, stride of the innermost dim)
    for s, st in reversed([(s, st) for s, st in zip(osz, ost) if s != 1]):
        if chunks and eq(st, chunks[-1][1] * chunks[-1][0]):
            chunks[-1] = (chunks[-1][0] * s, chunks[-1][1])
        else:
            chunks.append((s, st))
    out, d = [None] * len(nsz), len(nsz) - 1
    for numel, base in chunks:
        acc = sympy.Integer(1)
        while d >= 0 and (not eq(acc, numel) or nsz[d] == 1):
            if nsz[d] != 1:
                out[d] = base * acc
                acc *= nsz[d]
            d -= 1
        if not eq(acc, numel):
            return None
    if any(nsz[i] != 1 for i in range(d + 1)):
        return None
    nxt = sympy.Integer(1)  # size-1 dims: the stride of the next dim (as contiguous_strides gives them)
    for i in reversed(range(len(nsz))):
        if out[i] is None:
            out[i] = nxt
        nxt = out[i] * nsz[i]
    return [sympy.expand(v) for v in out]


@register_lowering(aten.view, aten._unsafe_view, aten.reshape, aten.view.dtype)
def _view(x, size):
    if isinstance(size, torch.dtype):
        raise FallbackToExtern()
    return view_reshape(x, out_size())


@register_lowering(aten.permute)
def _permute(x, dims):
    nd = len(x.get_size())
    dims = [d % nd for d in dims]
    size = [x.get_size()[d] for d in dims]
    inverse = {d: i for i, d in enumerate(dims)}
    return make_view(x, size, lambda index: [index[inverse[d]] for d in range(nd)],
                     lambda l: _lay(l, size, [l.stride[d] for d in dims]))


@register_lowering(aten.expand, aten.broadcast_to)
def _expand(x, size, implicit=False):
    size = out_size()
    old = list(x.get_size())
    off = len(size) - len(old)
    bcast = [broadcasts(old[d], size[d + off]) for d in range(len(old))]
    zero = sympy.Integer(0)
    return make_view(x, size, lambda index: [zero if bcast[d] else index[d + off] for d in range(len(old))],
                     lambda l: _lay(l, size, [zero] * off + [zero if b else st for b, st in zip(bcast, l.stride)]))


@register_lowering(aten.unsqueeze, aten.squeeze)
def _unsqueeze_squeeze(x, *args):
    return view_reshape(x, out_size())


def _slice_bound(v, n, default):
    """Eager's clamp of a slice bound ``v`` (int, size expression or None) into ``[0, n]`` for a symbolic extent ``n``:
    the ShapeEnv decides each comparison (the slice's fake trace made the same decisions: no new guard)."""
    v, n = as_expr(default if v is None else v), as_expr(n)
    if is_static(v) and free_unbacked_symbols(n):  # x[1:] of a nonzero() result: no guard can decide, clamp at run time
        return sympy.Max(0, v + n) if v < 0 else sympy.Min(v, n)
    if guard_true(sympy.Lt(v, 0)):
        v = v + n
    if guard_true(sympy.Gt(v, n)):
        return n
    return sympy.Integer(0) if guard_true(sympy.Lt(v, 0)) else v


@register_lowering(aten.slice.Tensor)
def _slice(x, dim=0, start=None, end=None, step=1):
    size_in = list(x.get_size())
    dim = dim % len(size_in)
    return _strided_slice(x, dim, _slice_bound(start, size_in[dim], 0), step, out_size())


def _strided_slice(x, dim, start, step, size):
    """The view ``x[..., start::step, ...]`` (along ``dim``) of size ``size``."""
    return make_view(x, size, lambda index: [i * step + start if d == dim else i for d, i in enumerate(index)],
                     lambda l: _lay(l, size, [st * step if d == dim else st for d, st in enumerate(l.stride)],
                                    l.offset + start * l.stride[dim]))


def _wrap_index(idx, n):
    """``idx`` into a dim of size ``n`` as a non-negative position, as eager's select wraps it. A symbolic index's sign
    and range are guards (decided at the compile-time value): it read ``x[-k]`` at ``-k`` unwrapped, outside the tensor
    (fresh-user trial). Raises IndexError outside ``[-n, n)``, as eager."""
    n = as_expr(n)
    if is_static(idx):
        idx = int(idx)
        if is_static(n) and not -int(n) <= idx < int(n):
            raise IndexError(f"index {idx} is out of bounds for dimension with size {n}")
        return idx + n if idx < 0 else idx
    if free_unbacked_symbols(idx := as_expr(idx)):  # x[t.item()]: wrapped at run time (the trace asserts its range)
        return Mod(idx + n, n)
    if guard_true(sympy.Lt(idx, 0)):
        idx = idx + n
    if not (guard_true(sympy.Le(0, idx)) and guard_true(sympy.Lt(idx, n))):
        raise IndexError(f"index {idx} is out of bounds for dimension with size {n}")
    return idx


@register_lowering(aten.select.int)
def _select(x, dim, idx):
    size_in = list(x.get_size())
    dim = dim % len(size_in)
    return _select_view(x, dim, _wrap_index(idx, size_in[dim]), out_size())


@register_lowering(aten.diagonal)
def _diagonal(x, offset=0, dim1=0, dim2=1):
    """A view: the diagonal's position is the last dim (strided: stride1 + stride2)."""
    nd = len(x.get_size())
    d1, d2 = dim1 % nd, dim2 % nd
    size = out_size()
    o1, o2 = max(-offset, 0), max(offset, 0)
    rest = [d for d in range(nd) if d not in (d1, d2)]

    def reindex(index):
        out = [None] * nd
        for i, d in enumerate(rest):
            out[d] = index[i]
        out[d1] = index[-1] + o1
        out[d2] = index[-1] + o2
        return out

    def restride(l):
        stride = [l.stride[d] for d in rest] + [l.stride[d1] + l.stride[d2]]
        return _lay(l, size, stride, l.offset + o1 * l.stride[d1] + o2 * l.stride[d2])
    return make_view(x, size, reindex, restride)


@register_lowering(aten.flip)
def _flip(x, dims):
    """Re-indexing (``i -> n - 1 - i`` along ``dims``); read through its loader."""
    size = list(x.get_size())
    nd = len(size)
    flipped = {d % nd for d in dims} if nd else set()
    return make_view(x, size, lambda index: [size[d] - 1 - i if d in flipped else i for d, i in enumerate(index)], None)


@register_lowering(aten.repeat)
def _repeat(x, repeats):
    """Tiling by re-indexing: ``out[..., i, ...] = x[..., i % n, ...]`` (new leading dims from ``repeats``: unused)."""
    xs = list(x.get_size())
    extra = len(repeats) - len(xs)
    size = out_size()

    def reindex(index):
        # a size-0 dim: the output is empty too, nothing is read (no ``i % 0``)
        return [sympy.Integer(0) if xs[d] in (0, 1) else Mod(index[d + extra], xs[d]) for d in range(len(xs))]
    return make_view(x, size, reindex, None)


@register_lowering(aten.unfold)
def _unfold(x, dimension, size, step):
    """``x.unfold(d, size, step)``: windows along ``d`` as a strided view (window index at ``d``, offset in it last)."""
    nd = len(x.get_size())
    out = out_size()
    if nd == 0:
        return make_view(x, out, lambda index: [], lambda l: _lay(l, out, [sympy.Integer(1)]))
    d = dimension % nd

    def reindex(index):
        idx = list(index[:-1])
        idx[d] = index[d] * step + index[-1]
        return idx

    def restride(l):
        stride = list(l.stride)
        stride[d] = l.stride[d] * step
        return _lay(l, out, stride + [l.stride[d]])
    return make_view(x, out, reindex, restride)


@register_lowering(aten.as_strided)
def _as_strided(x, size, stride, storage_offset=None):
    # as_strided reads storage: an intermediate is laid out as eager lays it out (a mutated
    # transposed input's new value was realized contiguous here, transposed in eager)
    graph = current_graph()
    x = graph._eager_storage(x, graph.current_node.args[0])
    if (base := strided_base(x)) is None and isinstance(x.data, StorageBox):
        x.data.realize()
        base = strided_base(x)
    if base is None:
        x = TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), x.make_loader(), x.get_size()))
        x.data.realize()
        base = strided_base(x)
    buf, layout = base
    if any(s == 0 for s in buf.layout.size) and not any(s == 0 for s in size):
        # elements of an empty buffer's storage: an empty tensor's data pointer is null,
        # so the ATen op makes the view (a tensor kernels can read) at call time
        raise FallbackToExtern
    # ATen's offset is absolute in the storage; a layout's is relative to the buffer's
    # start, which for a graph input is the input's own storage offset
    off = layout.offset if storage_offset is None else as_expr(storage_offset) - getattr(buf, "storage_offset", 0)
    return TensorBox(ReinterpretView(buf, _lay(layout, [as_expr(s) for s in size], [as_expr(s) for s in stride], off)))


# ------------------------------------------------------------------------ concatenation

def _idx(e):
    return ops.index_expr(e, torch.int64)


def _c(v):  # (a symbolic size: a kernel argument)
    return ops.constant(int(v), torch.int64) if is_static(v) else ops.index_expr(as_expr(v), torch.int64)


@register_lowering(aten.cat)
def _cat(tensors, dim=0):
    size, odt, cdt = out_size(), out_dtype(), compute_dtype(out_dtype())
    dim = dim % len(size)
    parts, positions = [], []
    offset = 0
    for i, t in enumerate(tensors):
        if len(t.get_size()) == 1 and t.get_size()[0] == 0 and len(size) > 1:
            continue  # legacy empty tensor
        n = as_size(t.get_size()[dim])
        parts.append((offset, n, t))
        positions.append(i)
        offset += n
    if config.concat_buffer_min_inputs > 0 and not any(s == 0 for s in size) and \
            (buf := _concat_buffer(parts, positions, dim, size, odt, _costly(parts))) is not None:
        return buf

    def inner(index):
        result = None
        for k, (o, n, t) in enumerate(parts):
            load = loader_as(t, t.get_size(), cdt)

            def body(load=load, o=o):
                i = list(index)
                i[dim] = index[dim] - o
                return load(i)
            if k == len(parts) - 1:
                v = ops.masked(ops.ge(_idx(index[dim]), _c(o)), body, 0.0 if cdt.is_floating_point else 0) \
                    if result is not None else body()
            else:
                cond = ops.logical_and(ops.ge(_idx(index[dim]), _c(o)), ops.lt(_idx(index[dim]), _c(o + n))) \
                    if o != 0 else ops.lt(_idx(index[dim]), _c(o + n))
                v = ops.masked(cond, body, 0.0 if cdt.is_floating_point else 0)
            result = v if result is None else ops.where(ops.lt(_idx(index[dim]), _c(o)), result, v)
        return result
    return TensorBox.create(Pointwise(device(), odt, inner, size))


def _concat_strides(parts, dim: int, size, meta) -> list:
    """Strides of a concat storage of ``size`` (fake tensor ``meta``): channels-last when the graph runs its
    convolutions so and an input is a channels-last buffer (the next convolution reads it without a copy), else
    eager's when dense, else contiguous."""
    from coil.ir.graph import _channels_last_strides, _dense_non_overlapping, _is_channels_last
    if getattr(current_graph(), "channels_last", False) and len(size) == 4 and dim == 1 and any(
            (b := strided_base(t)) is not None and _is_channels_last(b[1]) for _, _, t in parts):
        return _channels_last_strides(size)
    if isinstance(meta, torch.Tensor) and all(is_static(v) for v in list(size) + list(meta.stride())) \
            and _dense_non_overlapping(meta):
        return [as_expr(v) for v in meta.stride()]
    return contiguous_strides(size)


def _copy_strides(node) -> Optional[list]:
    """Static strides for ``node``'s value under which its one use, a chain of reshapes and permutes ending in a
    ``clone`` (``graph.one_copy_chain``), reads it in the clone's own order (a rotary backward's q/k/v gradient
    ``cat``, transposed for the projection's mm), or None."""
    from coil.ir.graph import one_copy_chain
    cats = node.graph.find_nodes(op="call_function", target=aten.cat.default)
    if (chain := one_copy_chain(node)) is None or \
            any(n is not node and list(node.args[0][:len(n.args[0])]) == list(n.args[0]) for n in cats):
        return None  # (a concatenation of a family of several: its storage is theirs too)
    out = chain[-1].meta.get("val")
    if not isinstance(out, torch.Tensor) or not all(is_static(v) for v in [*out.shape, *out.stride()]):
        return None
    t = torch.empty_strided(tuple(out.shape), tuple(out.stride()), device="meta")
    try:
        for m in reversed(chain[:-1]):
            if m.target is aten.permute.default:
                perm = [d % t.dim() for d in m.args[1]]
                t = t.permute([perm.index(d) for d in range(t.dim())])
            elif m.target is aten.transpose.int:
                t = t.transpose(m.args[1], m.args[2])
            else:
                t = t.view(tuple(m.args[0].meta["val"].shape))
    except RuntimeError:
        return None  # a reshape the clone's layout cannot be viewed back through
    return [as_expr(v) for v in t.stride()]


def _non_empty(n) -> bool:
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return not (isinstance(v, torch.Tensor) and statically_known_true(v.numel() == 0))


def _longest_extension(node, dim: int, odt):
    """The ``cat`` of the graph along ``dim`` with ``odt`` results whose inputs begin with ``node``'s, the one with
    the most inputs (``node`` itself when none has more): DenseNet's dense layers each concatenate the feature maps
    before them, and the block's last concatenation holds every earlier one as a prefix."""
    ins, best = list(node.args[0]), node
    for n in node.graph.find_nodes(op="call_function", target=aten.cat.default):
        a, v = n.args[0], n.meta.get("val")
        d = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        if len(a) > len(best.args[0]) and list(a[:len(ins)]) == ins and isinstance(v, torch.Tensor) \
                and v.dtype == odt and v.dim() == len(node.meta["val"].shape) and d % v.dim() == dim:
            best = n
    return best


def _costly(parts) -> bool:
    """Whether the unrealized pointwise inputs of a ``cat`` hold more than ``MAX_INLINE_OPS`` ops together: inlined as
    one where-chain, every element would compute all of them (GPT-NeoX's query/key/value gradient, a cat of partial
    rotary backwards, evaluated six sines and cosines per element); in slices each element computes its own."""
    from coil.ir.graph import MAX_INLINE_OPS
    from coil.ir.handlers import count_ops
    bodies = [t.data.data for _, n, t in parts if n != 0 and isinstance(getattr(t, "data", None), StorageBox)
              and type(t.data.data) is Pointwise]
    return len(parts) > 1 and sum(count_ops(b)[0] for b in bodies) > MAX_INLINE_OPS


def _concat_buffer(parts, positions, dim: int, size, odt, costly: bool = False) -> Optional[TensorBox]:
    """``cat`` as a :class:`ConcatBuffer` (docs/ir.md, "Concat buffers"), or None when it stays one pointwise body
    (the longest concatenation extending this one has fewer than ``config.concat_buffer_min_inputs`` non-empty
    inputs and its inputs are not ``costly``). Every concatenation of one family (:func:`_longest_extension`) views one
    :class:`ConcatStorage` sized for the longest; each input not yet in it becomes a :class:`ConcatSlice`: an unrealized
    pointwise input of the output dtype computed straight into its slice (its readers then read the slice), any other
    input copied (converted to the output dtype)."""
    g, dev = current_graph(), device()
    if not isinstance(node := getattr(g, "current_node", None), torch.fx.Node) or node.target is not aten.cat.default:
        return None
    longest = _longest_extension(node, dim, odt)
    if sum(1 for a in longest.args[0] if _non_empty(a)) < config.concat_buffer_min_inputs and not costly:
        return None
    if longest not in (memo := g.__dict__.setdefault("_concat_storages", {})):
        meta = longest.meta["val"]
        full, copy = [as_expr(v) for v in meta.shape], _copy_strides(longest)
        lay = Layout(dev, odt, full, copy or _concat_strides(parts, dim, full, meta))
        storage = ConcatStorage(g.new_buffer_name(), lay)
        storage.for_copy = copy is not None
        g.name_to_buffer[storage.name] = storage
        memo[longest] = (storage, {})
    storage, placed = memo[longest]
    stride = list(storage.layout.stride)
    for (o, n, t), i in zip(parts, positions):
        if i in placed or n == 0:
            continue
        lay = Layout(dev, odt, [as_expr(v) for v in t.get_size()], stride)
        d = t.data
        body = d.data if isinstance(d, StorageBox) and type(d.data) is Pointwise and d.data.dtype == odt else \
            Pointwise(dev, odt, loader_as(t, t.get_size(), compute_dtype(odt)), t.get_size())
        sl = ConcatSlice(g.new_buffer_name(), lay, body, storage, as_expr(o) * stride[dim])
        if body is getattr(d, "data", None):
            d.data = sl  # the input's other readers read the slice
        g.register_buffer(sl)
        placed[i] = sl
    mine = [placed[i] for (_, n, _), i in zip(parts, positions) if i in placed]
    cat = ConcatBuffer(g.new_buffer_name(), Layout(dev, odt, list(size), stride), storage, mine)
    g.register_buffer(cat)
    return TensorBox(StorageBox(cat))


@register_lowering(aten.constant_pad_nd)
def _pad(x, pad, value=0.0):
    size, odt, cdt = out_size(), out_dtype(), compute_dtype(out_dtype())
    old = list(x.get_size())
    nd = len(old)
    lows = [0] * nd
    for k in range(len(pad) // 2):
        lows[nd - 1 - k] = pad[2 * k]
    load = loader_as(x, old, cdt)
    fill = float(value) if cdt.is_floating_point else int(value)

    def inner(index):
        src = [index[d] - lows[d] for d in range(nd)]
        cond = None
        for d in range(nd):
            if lows[d] == 0 and is_static(size[d]) and is_static(old[d]) and int(size[d]) <= int(old[d]):
                continue
            ok = ops.logical_and(ops.ge(_idx(src[d]), _c(0)), ops.lt(_idx(src[d]), _c(old[d])))
            cond = ok if cond is None else ops.logical_and(cond, ok)
        return load(src) if cond is None else ops.masked(cond, lambda: load(src), fill)
    return TensorBox.create(Pointwise(device(), odt, inner, size))


@register_lowering(aten.slice_scatter)
def _slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    size, odt, cdt = out_size(), out_dtype(), compute_dtype(out_dtype())
    dim = dim % len(size)
    # eager's clamp into [0, n] (a[-4:] of 3 elements starts at 0, not -1); the step may be a SymInt (x[::k]'s backward)
    start, end = _slice_bound(start, size[dim], 0), _slice_bound(end, size[dim], size[dim])
    step = as_expr(step)
    r = Mod(-start, step)  # i + r: a multiple of step where i - start is, and never negative
    lx, ls = loader_as(x, size, cdt), loader_as(src, src.get_size(), cdt)

    def inner(index):
        i = _idx(index[dim])
        cond = ops.logical_and(ops.ge(i, _c(start)), ops.lt(i, _c(end)))
        if step != 1:
            cond = ops.logical_and(cond, ops.eq(_idx(Mod(index[dim] + r, step)), _c(0)))

        def body():
            j = list(index)
            j[dim] = FloorDiv(index[dim] + r, step) - FloorDiv(start + step - 1, step)
            return ls(j)
        return ops.where(cond, ops.masked(cond, body, 0), lx(index))
    return TensorBox.create(Pointwise(device(), odt, inner, size))


@register_lowering(aten.select_scatter)
def _select_scatter(x, src, dim, idx):
    size, odt, cdt = out_size(), out_dtype(), compute_dtype(out_dtype())
    dim = dim % len(size)
    idx = _wrap_index(idx, size[dim])
    lx, ls = loader_as(x, size, cdt), loader_as(src, src.get_size(), cdt)

    def inner(index):
        cond = ops.eq(_idx(index[dim]), _c(idx))
        j = [i for d, i in enumerate(index) if d != dim]
        return ops.where(cond, ops.masked(cond, lambda: ls(j), 0), lx(index))
    return TensorBox.create(Pointwise(device(), odt, inner, size))


# ----------------------------------------------------------------------------- indexing

@register_lowering(aten.embedding)
def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    size, odt = out_size(), out_dtype()
    wl, il = weight.make_loader(), indices.make_loader()
    nidx = len(indices.get_size())
    num = weight.get_size()[0]

    def inner(index):
        row = ops.indirect_indexing(il(index[:nidx]), num, wrap_neg=False)  # eager rejects < 0
        return wl([row] + list(index[nidx:]))
    return TensorBox.create(Pointwise(device(), odt, inner, size))


def _advanced_index(xs: list, indices, out_shape: Optional[list] = None) -> tuple[list, Callable]:
    """Advanced indexing ``x[indices]`` of a tensor of sizes ``xs`` (``indices``: a tensor or None per leading dim):
    ``(shape, source)``, ``source(index)`` being the index into ``x`` that element ``index`` of the result reads.
    The result's shape is the indices' broadcast shape where the indexed dims were when they are adjacent, else in
    front of the other dims; symbolic sizes stay symbolic (dynamic shapes). Given the result's (static or symbolic)
    shape ``out_shape``, the broadcast shape is read from it. Boolean indices, or none, are FallbackToExtern."""
    indices = list(indices) + [None] * (len(xs) - len(indices))
    pos = [d for d, t in enumerate(indices) if t is not None]
    if not pos or any(indices[d].get_dtype() in (torch.bool, torch.uint8) for d in pos):
        raise FallbackToExtern()
    first = pos[0] if pos == list(range(pos[0], pos[-1] + 1)) else 0
    nb = max(len(indices[d].get_size()) for d in pos)
    bshape = _broadcast_sizes([list(indices[d].get_size()) for d in pos]) if out_shape is None else \
        [as_expr(s) for s in out_shape[first:first + nb]]
    rest_dims = [xs[d] for d in range(len(xs)) if d not in pos]
    loaders = {d: broadcast_loader(indices[d], bshape) for d in pos}

    def source(index):
        bidx, rest = list(index[first:first + nb]), iter(list(index[:first]) + list(index[first + nb:]))
        return [ops.indirect_indexing(loaders[d](bidx), xs[d]) if d in loaders else next(rest) for d in range(len(xs))]
    return rest_dims[:first] + bshape + rest_dims[first:], source


@register_lowering(aten.index.Tensor)
def _index(x, indices):
    size, xl = out_size(), x.make_loader()
    _, source = _advanced_index(list(x.get_size()), indices, size)
    return TensorBox.create(Pointwise(device(), out_dtype(), lambda index: xl(source(index)), size))


def _gather_along(x, dim, index, row_index):
    """``out[i] = x[i with i[dim] := index[row_index(i)]]``; eager rejects negative indices (only ``x[idx]`` wraps)."""
    size, odt = out_size(), out_dtype()
    dim = dim % max(len(x.get_size()), 1)
    xl, il = x.make_loader(), index.make_loader()
    n = x.get_size()[dim] if x.get_size() else 1

    def inner(idx):
        if j := list(idx):
            j[dim] = ops.indirect_indexing(il(row_index(idx, dim)), n, wrap_neg=False)
        return xl(j)
    return TensorBox.create(Pointwise(device(), odt, inner, size))


@register_lowering(aten.index_select)
def _index_select(x, dim, index):
    return _gather_along(x, dim, index, lambda idx, d: [idx[d]] if index.get_size() else [])


@register_lowering(aten.gather)
def _gather(x, dim, index, sparse_grad=False):
    return _gather_along(x, dim, index, lambda idx, d: idx)


# ----------------------------------------------------------------------------- creation

@register_lowering(aten.full, aten.full_like, aten.zeros_like, aten.ones_like, aten.empty, aten.empty_strided,
                   aten.scalar_tensor, aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty,
                   aten.new_empty_strided, aten.fill.Scalar, aten.empty_permuted)
def _creation(*args, **kwargs):
    target = current_graph().current_node.target
    name = target._overloadpacket.__name__ if hasattr(target, "_overloadpacket") else str(target)
    value = args[1] if name in ("full", "full_like", "new_full", "fill") else args[0] if name == "scalar_tensor" \
        else 1 if "ones" in name else 0
    require_scalars_fit(out_dtype(), value)
    return _full(out_size(), value, out_dtype())


@register_lowering(aten.arange.start_step)
def _arange(start, end, step=1, **kwargs):
    size, odt, cdt = out_size(), out_dtype(), compute_dtype(out_dtype())
    sym = lambda v: isinstance(v, torch.SymInt) or isinstance(v, sympy.Basic) and not v.is_number  # noqa: E731

    def inner(index):
        if cdt.is_floating_point:
            def num(v):
                return ops.to_dtype(ops.index_expr(as_expr(v), torch.int64), cdt, torch.int64) if sym(v) \
                    else ops.constant(float(v), cdt)
            v = ops.to_dtype(ops.index_expr(index[0], torch.int64), cdt, torch.int64)
            return ops.add(ops.mul(v, num(step)), num(start))
        step_e, start_e = (as_expr(v) if sym(v) else int(v) for v in (step, start))
        return ops.index_expr(index[0] * step_e + start_e, cdt)
    return TensorBox.create(Pointwise(device(), odt, inner, size))


@register_lowering(aten.split_with_sizes, aten.split.Tensor, aten.split.sizes)
def _split(x, sizes, dim=0):
    """Splits are slices (views); returns a list like ATen."""
    size = list(x.get_size())
    dim = dim % len(size)
    n = int(size[dim])
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)] or [0]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [_slice_view(x, dim, b, b + s) for b, s in zip(starts, sizes)]


def _slice_view(x, dim, start, end):
    size = list(x.get_size())
    size[dim] = sympy.sympify(end - start)
    return _strided_slice(x, dim, start, 1, size)


def _select_view(x, dim, idx, size=None):
    """The view ``x.select(dim, idx)`` (``size``: its size, default ``x``'s less ``dim``)."""
    size = [s for d, s in enumerate(x.get_size()) if d != dim] if size is None else size
    return make_view(x, size, lambda index: [*index[:dim], sympy.sympify(idx), *index[dim:]],
                     lambda l: _lay(l, size, [s for d, s in enumerate(l.stride) if d != dim],
                                    l.offset + idx * l.stride[dim]))


# ----------------------------------------------------------------------------- scatter

def _whole_input(x: TensorBox) -> bool:
    return isinstance(x.data, StorageBox) and isinstance(x.data.data, InputBuffer)


def _fresh_copy(x: TensorBox):
    buf = TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), x.make_loader(), x.get_size())).data.realize()
    # a copy of a whole graph input: a scatter that makes the input's new value may write into the
    # input itself instead (GraphLowering._write_inputs_in_place)
    buf.copy_of = x.data.data if _whole_input(x) else None
    return buf


def _scatter_box(x, ranges, dest_fn, value_fn, mode, acc_dtype=None) -> TensorBox:
    """A ScatterBuffer over a fresh copy of ``x``; an accumulating one adds into a copy in ``acc_dtype`` (default: the
    kernel backend's atomic add dtype, ``coil.codegen.atomic_add_dtype``) converted back to ``x``'s dtype after."""
    dt = x.get_dtype()
    if mode == "atomic_add":
        from coil.codegen import atomic_add_dtype
        if (acc := acc_dtype or atomic_add_dtype(x.get_device(), dt)) != dt:
            xs = list(x.get_size())
            wide = make_pointwise_box(lambda v: v, [x], xs, acc, acc)
            out = _scatter_box(wide, ranges, dest_fn, value_fn, mode, acc)
            # converted in the body, not only when stored: an inlining reader sees the wrapped int8/bool/rounded bf16
            return make_pointwise_box(lambda v: ops.to_dtype(v, dt, acc), [out], xs, dt, acc)
    target, g = _fresh_copy(x), current_graph()
    sb = ScatterBuffer(g.new_buffer_name(), target, ranges, dest_fn, value_fn, mode)
    g.register_buffer(sb)
    return TensorBox(StorageBox(sb))


def _broadcast_sizes(shapes: list) -> list:
    """The broadcast of ``shapes`` (lists of ints or sympy sizes), as ``torch.broadcast_shapes``."""
    n = max(map(len, shapes))
    return [functools.reduce(lambda d, e: e if broadcasts(d, e) else d,
                             [as_expr(s[len(s) - n + i]) for s in shapes if len(s) - n + i >= 0]) for i in range(n)]


@register_lowering(aten.index_put, aten._unsafe_index_put)
def _index_put(x, indices, values, accumulate=False):
    """``out = x.clone(); out[indices] = values`` (``+=`` with accumulate, atomically)."""
    rshape, dest = _advanced_index(list(x.get_size()), indices)
    vload = loader_as(values, rshape, compute_dtype(x.get_dtype()))
    return _scatter_box(x, rshape, dest, vload, "atomic_add" if accumulate else None)


def _one_per_row(xs: list, isize: list, dim: int) -> bool:
    """Whether a scatter's index ``isize`` (into ``xs`` along ``dim``) holds one index per row: size 1 along ``dim``
    and ``xs``'s size along every other dim, so each element of the result is written at most once and the scatter
    is ``where(i[dim] == index[row], src[row], x[i])`` (as eager, whatever the order of writes)."""
    return len(isize) == len(xs) and isize[dim] == 1 and all(
        d == dim or as_expr(isize[d]) == as_expr(xs[d]) for d in range(len(xs)))


@register_lowering(aten.scatter.src, aten.scatter.value, aten.scatter_add)
def _scatter(x, dim, index, src):
    target = current_graph().current_node.target
    if not (xs := list(x.get_size())):
        raise FallbackToExtern()  # 0-d: eager's only index is 0 (min.dim's backward of a 0-d input)
    dim = dim % len(xs)
    isize, il = list(index.get_size()), index.make_loader()
    cdt = compute_dtype(x.get_dtype())
    vload = loader_as(src, isize, cdt) if not is_box(src) else (lambda i, l=loader_as(src, src.get_size(), cdt): l(i))

    def dest(i):
        d = list(i)
        d[dim] = ops.indirect_indexing(il(i), xs[dim], wrap_neg=False)  # eager rejects < 0
        return d
    mode = "atomic_add" if target == aten.scatter_add.default else None
    if _one_per_row(xs, isize, dim) and not _whole_input(x):
        # one index per row along ``dim`` (nll_loss's backward, one_hot): a pointwise select that fuses with its
        # readers, no scatter buffer (a graph input's scatter may instead write into the input: _fresh_copy)
        xl = loader_as(x, xs, cdt)

        def inner(i):
            row = [*i[:dim], sympy.Integer(0), *i[dim + 1:]]
            hit = ops.eq(ops.index_expr(i[dim], torch.int64), ops.index_expr(dest(row)[dim], torch.int64))
            old, v = xl(i), vload(row)
            return ops.where(hit, ops.add(old, v) if mode else v, old)
        return TensorBox.create(Pointwise(device(), x.get_dtype(), inner, xs))
    low = x.get_dtype() in (torch.float16, torch.bfloat16)
    # eager's CPU scatter_add accumulates fp16/bf16 in fp32 (4096 adds of 0.1 in bf16:
    # 410, in bf16 steps 32); its CUDA kernel adds in the low precision, as coil does
    acc = torch.float32 if mode and low and x.get_device().type == "cpu" else None
    return _scatter_box(x, isize, dest, vload, mode, acc)


# ----------------------------------------------------------------------------- random

@register_lowering(aten.rand, aten.rand_like, aten.randn, aten.randn_like, aten.bernoulli.p, aten.bernoulli.default)
def _random(*args, **kwargs):
    """In-kernel Philox random numbers (``tl.rand``/``tl.randn``): one seed per op per call from the wrapper's ``seeds``
    buffer, offset = the element's flat index. The stream differs from eager's; ``config.fallback_random``, and a random
    op off the graph's device (a CPU ``torch.rand([])`` in a GPU graph), run the ATen op instead."""
    g = current_graph()
    if config.fallback_random or device().type != g.device.type:
        raise FallbackToExtern()    # (the seeds live on the graph's device)
    target = g.current_node.target
    name = target._overloadpacket.__name__
    size, odt, cdt = out_size(), out_dtype(), compute_dtype(out_dtype())
    k = g.new_seed_index()
    p_load = None
    if name == "bernoulli":
        if target == aten.bernoulli.p:
            p = float(args[1] if len(args) > 1 else kwargs.get("p", 0.5))
            p_load = lambda i: ops.constant(p, torch.float32)
        else:
            p_load = loader_as(args[0], size, torch.float32)

    def inner(index):
        seed = ops.load_seed("seeds", k)
        off = ops.index_expr(linear_index(index, size), torch.int32)
        v = ops.randn(seed, off) if name.startswith("randn") else ops.rand(seed, off)
        if p_load is not None:
            v = ops.to_dtype(ops.lt(v, p_load(index)), odt, torch.bool)
        elif name in ("rand", "rand_like") and odt in (torch.float16, torch.bfloat16):
            # [0, 1) as eager's: a float32 draw just below 1 rounds up to 1.0 in half / bfloat16 (0.2% of bf16 draws)
            v = ops.minimum(v, ops.constant(1 - torch.finfo(odt).eps / 2, torch.float32))
            v = ops.to_dtype(v, odt, torch.float32) if cdt != torch.float32 else v
        elif cdt != torch.float32:
            v = ops.to_dtype(v, odt, torch.float32)
        return v
    return TensorBox.create(Pointwise(device(), odt, inner, size))
