"""IR nodes of coil's loop-level IR.

A lowering returns a :class:`TensorBox` (the IR value of one ATen tensor), whose chain is ``TensorBox → (views) →
StorageBox → data`` (docs/ir.md, "Values"): views (:class:`ReinterpretView`, :class:`GenericView`) change indexing,
never copy; ``StorageBox.data`` is unrealized loops (:class:`Pointwise`, :class:`Reduction`, inlined into every reader)
or a realized :class:`Buffer` (:class:`InputBuffer`, :class:`ComputedBuffer`, :class:`ExternKernel`);
``StorageBox.realize()`` turns loops into a ComputedBuffer registered with the graph.

Invariants: sizes/strides/index expressions are sympy expressions; a Buffer's
``layout`` is fixed once created; every realized buffer has a unique name ``bufN`` (or
the placeholder name for inputs); a body only reads buffers created before it."""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import threading
from typing import Callable, Optional, Sequence

import sympy
import torch

from coil.ir.symbols import PRECOMPUTED, as_expr, contiguous_strides, is_static, product, sym
from coil.ir.virtualized import ops, set_ops_handler
from coil.ir.handlers import DependencyRecorder


class _Current(threading.local):
    graph = None
    #: the origin (see :attr:`Loops.origin`) of the body running now on an ops handler
    origin = None


V = _Current()


def current_graph():
    """The GraphLowering being built (buffers register themselves with it)."""
    if V.graph is None:
        raise RuntimeError("no GraphLowering is active")
    return V.graph


# ---------------------------------------------------------------------------- origins
#
# Every Loops records the user's source location of the ATen node whose lowering made it
# (``node.meta["stack_trace"]``, which capture sets and make_fx copies into the ATen graphs). While a body
# runs on an ops handler, ``V.origin`` is the origin of the innermost body running (a loader of an inlined
# producer sets its own), so a handler can tell which user line an op came from: the C++ kernel names it in
# the IndexError of a failed bounds check. Only codegen pays for it, never a kernel call.

def _node_origin() -> Optional[str]:
    node = getattr(V.graph, "current_node", None)
    return None if not (meta := getattr(node, "meta", None)) else meta.get("stack_trace") or meta.get("stack")


def current_origin() -> Optional[str]:
    """The stack trace of the user code behind the body running now (or None)."""
    return V.origin


def _run_from(origin: Optional[str], fn: Callable, *args):
    saved = V.origin
    V.origin = origin
    try:
        return fn(*args)
    finally:
        V.origin = saved


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def describe_origin(origin: Optional[str]) -> Optional[str]:
    """``"m.py:5 in f: <source line>"`` for the innermost frame of ``origin`` (a ``stack_trace``, or capture's
    ``meta["stack"]`` summary) outside torch's own modules; None if it names no frame."""
    if not origin:
        return None
    frames = []  # (file, line, function, source), outermost first
    lines = origin.splitlines()
    for k, line in enumerate(lines):
        for m in _FRAME.finditer(line):
            nxt = lines[k + 1].strip() if k + 1 < len(lines) else ""
            src = nxt if nxt and not _FRAME.search(nxt) else ""
            frames.append((m.group(1), m.group(2), m.group(3), src))
    if " <- " in origin:  # capture's summary lists the innermost frame first
        frames.reverse()
    if not frames:
        return None
    file, line, fn, src = ([f for f in frames if not f[0].startswith(_TORCH_DIR)] or frames)[-1]
    return f"{file}:{line} in {fn}" + (f": {src}" if src else "")


@functools.lru_cache(maxsize=65536)
def _strided_index(offset: sympy.Expr, terms: tuple) -> sympy.Expr:
    """``offset + sum(i * stride)`` (sympy arithmetic, cached: bodies are run again and again with the same
    index by the scheduler and the kernel generators)."""
    for i, st in terms:
        offset = offset + i * st
    return offset


@dataclasses.dataclass
class Layout:
    """A strided layout: element ``index`` lives at ``offset + sum(index[d]*stride[d])``."""

    device: torch.device
    dtype: torch.dtype
    size: list
    stride: list
    offset: sympy.Expr = sympy.Integer(0)

    def make_indexer(self) -> Callable[[Sequence[sympy.Expr]], sympy.Expr]:
        size, offset = list(self.size), self.offset
        dims = [(d, st) for d, (sz, st) in enumerate(zip(size, self.stride)) if sz != 1]

        def indexer(index):
            assert len(index) == len(size), (index, size)
            return _strided_index(offset, tuple((index[d], st) for d, st in dims))
        return indexer

    def storage_numel(self) -> sympy.Expr:
        """Elements of storage this layout touches (offset + extent)."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride))

    def is_contiguous(self) -> bool:
        return all(st == c or s == 1 for s, st, c in
                   zip(self.size, self.stride, contiguous_strides(self.size))) and self.offset == 0

    @staticmethod
    def contiguous(device, dtype, size) -> "Layout":
        size = [as_expr(s) for s in size]
        return Layout(device, dtype, size, contiguous_strides(size))


class IRNode:
    """Base of all IR values. A node that wraps another (``self.data``: a box, a view)
    takes its size, dtype, device and loader from it unless it defines its own."""

    def get_size(self) -> list:
        return self.data.get_size()

    def get_dtype(self) -> torch.dtype:
        return self.data.get_dtype()

    def get_device(self) -> torch.device:
        return self.data.get_device()

    def make_loader(self) -> Callable:
        """``loader(index) -> ops value`` for element ``index`` of this tensor."""
        return self.data.make_loader()

    def get_numel(self) -> sympy.Expr:
        return product(self.get_size())


class _Laid(IRNode):
    """A node with a :class:`Layout` (``self.layout``): its size, strides, dtype, device; loads of ``get_name()``."""

    def get_size(self):
        return self.layout.size

    def get_stride(self):
        return self.layout.stride

    def get_dtype(self):
        return self.layout.dtype

    def get_device(self):
        return self.layout.device

    def make_loader(self):
        name, indexer = self.get_name(), self.layout.make_indexer()
        return lambda index: ops.load(name, indexer(index))


# ---------------------------------------------------------------------------- loops

class Loops(IRNode):
    """A define-by-run body over ``ranges``: ``inner_fn(index) -> ops value``."""

    def __init__(self, device, dtype, inner_fn, ranges):
        self.device, self.dtype, self.inner_fn = device, dtype, inner_fn
        self.ranges = [as_expr(r) for r in ranges]
        #: the user code whose ATen node's lowering made this body (see "origins" above)
        self.origin = _node_origin()

    def get_size(self):
        return self.ranges

    def get_dtype(self):
        return self.dtype

    def get_device(self):
        return self.device


class Pointwise(Loops):
    """Elementwise body: element ``index`` of the result is ``inner_fn(index)``; read
    inlined, an fp16/bf16 body's float32 value is rounded to its dtype, as eager stores it."""

    def make_loader(self):
        inner, origin, dtype = self.inner_fn, self.origin, self.dtype
        run = inner if origin is None else lambda index: _run_from(origin, inner, index)
        if dtype in (torch.float16, torch.bfloat16):
            return lambda index: ops.to_dtype(run(index), dtype, torch.float32)
        return run


class Reduction(Loops):
    """``out[index] = reduce_{r in reduction_ranges} inner_fn(index, r)``.

    ``reduction_type`` is one of :data:`coil.ir.virtualized.REDUCTION_TYPES`; ``dtype``
    is the output dtype, ``src_dtype`` the dtype of ``inner_fn``'s values."""

    def __init__(self, device, dtype, inner_fn, ranges, reduction_ranges, reduction_type, src_dtype):
        super().__init__(device, dtype, inner_fn, ranges)
        self.reduction_ranges = [as_expr(r) for r in reduction_ranges]
        self.reduction_type, self.src_dtype = reduction_type, src_dtype

    def make_loader(self):
        raise RuntimeError("a Reduction must be realized before it is read")


# ---------------------------------------------------------------------------- buffers

class Buffer(_Laid):
    """A named tensor in memory with a fixed :class:`Layout`."""

    def __init__(self, name: str, layout: Layout):
        self.name, self.layout = name, layout

    def get_name(self) -> str:
        return self.name

    def __repr__(self):
        return f"{type(self).__name__}({self.name}, size={self.layout.size}, dtype={self.layout.dtype})"


class InputBuffer(Buffer):
    """A graph placeholder."""


class ConstantBuffer(InputBuffer):
    """A tensor constant of the graph (``get_attr``); ``value`` is the real tensor."""

    def __init__(self, name, layout, value):
        super().__init__(name, layout)
        self.value = value


def memory_loop_order(layout: Layout) -> Optional[list[int]]:
    """The order of ``layout``'s dims that walks its storage forward (largest stride
    outermost, size-1 dims first), or None when that is the logical (row-major) order or
    no such order exists (symbolic sizes, equal or zero strides: broadcast, overlap).

    A pointwise ComputedBuffer iterates its ranges in this order, so a buffer stored transposed (e.g. ``(3072, 4096)``
    with strides ``(1, 3072)``, made for an extern matmul that reads it as a transposed view) is written with
    consecutive addresses per consecutive ``xindex`` instead of one element every 3072 (GPT-2's backward spent 0.27 ms
    per layer in such a kernel on an H200, about 7x its memory floor). Inductor reorders loops by stride for the same
    reason."""
    try:
        sizes, strides = [int(s) for s in layout.size], [int(s) for s in layout.stride]
    except TypeError:
        return None
    big = [d for d, s in enumerate(sizes) if s != 1]
    if len({strides[d] for d in big}) != len(big) or any(strides[d] <= 0 for d in big):
        return None
    ordered = sorted(big, key=lambda d: -strides[d])
    return None if ordered == big else [d for d, s in enumerate(sizes) if s == 1] + ordered


def reduction_loop_order(data: "Reduction") -> Optional[list[int]]:
    """The order of a reduction's reduced dims that walks the memory of the first input it reads with distinct
    constant strides along them (largest stride outermost), or None for the logical order. Eager reduces in
    memory order too (TensorIterator sorts dims by stride): summing ``x.t()`` of ``[[1.5e308, 9e-308],
    [-8e307, -1.7e308]]`` in logical order added -8e307 and -1.7e308 first and overflowed to -inf where eager
    gives -1.04e308. Not for argmax/argmin, whose result is the position in logical order."""
    rr = data.reduction_ranges
    if data.reduction_type in ("argmax", "argmin") or not all(is_static(s) for s in rr):
        return None
    if len(big := [d for d, s in enumerate(rr) if int(s) != 1]) < 2:
        return None
    index = [sym(f"i{d}") for d in range(len(data.ranges))]
    rindex, h = [sym(f"r{d}") for d in range(len(rr))], DependencyRecorder()
    with set_ops_handler(h):
        data.inner_fn(index, rindex)
    for _, e in h.loads:
        e = sympy.sympify(e)
        strides = [sympy.diff(e, rindex[d]) for d in big]
        if not all(s.is_Integer and s > 0 for s in strides) or len(set(strides)) != len(big):
            continue
        ordered = [d for _, d in sorted(zip(strides, big), key=lambda t: -t[0])]
        return None if ordered == big else [d for d in range(len(rr)) if d not in big] + ordered
    return None


def _to_logical(order: Optional[list[int]], index: Sequence) -> list:
    """Loop-order ``index`` -> logical index (identity when ``order`` is None)."""
    if order is None:
        return list(index)
    out = [None] * len(order)
    for pos, d in enumerate(order):
        out[d] = index[pos]
    return out


class ComputedBuffer(Buffer):
    """A buffer computed by a loop body (``data`` is Pointwise or Reduction).

    ``loop_order`` (pointwise buffers only): the logical dims in the order the buffer's loops run, outermost first
    (:func:`memory_loop_order`), or None for the logical order. ``get_ranges()`` and the ``index`` that
    :meth:`store_body` takes follow the loop order; the body and the layout still see logical indices. Likewise
    ``rloop_order`` for a reduction's reduced dims (:func:`reduction_loop_order`), ``get_reduction_ranges()`` and
    ``rindex``."""

    def __init__(self, name: str, layout: Layout, data: Loops):
        super().__init__(name, layout)
        self.data, self._reads = data, None
        self.loop_order = memory_loop_order(layout) if isinstance(data, Pointwise) else None
        self._rloop_order = False  # computed on first use (the body may read later buffers)

    @property
    def rloop_order(self) -> Optional[list[int]]:
        if self._rloop_order is False:
            self._rloop_order = reduction_loop_order(self.data) if self.is_reduction() else None
        return self._rloop_order

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def get_ranges(self) -> list:
        return [self.data.ranges[d] for d in self.loop_order] if self.loop_order is not None else self.data.ranges

    def get_reduction_ranges(self) -> list:
        if not self.is_reduction():
            return []
        if self.rloop_order is not None:
            return [self.data.reduction_ranges[d] for d in self.rloop_order]
        return self.data.reduction_ranges

    def store_body(self, index: Sequence, rindex: Sequence = ()) -> None:
        """Run the body for output ``index`` (and reduction ``rindex``) on the current
        ops handler, ending in ``ops.store`` / ``ops.store_reduction``."""
        _run_from(self.data.origin, self._store_body, index, rindex)

    def _store_body(self, index, rindex) -> None:
        indexer, index = self.layout.make_indexer(), _to_logical(self.loop_order, index)
        out_index = indexer(list(index))
        if isinstance(self.data, Reduction):
            rindex = _to_logical(self.rloop_order, rindex)
            value = self.data.inner_fn(list(index), list(rindex))
            red = ops.reduction(self.data.dtype, self.data.src_dtype, self.data.reduction_type, value)
            ops.store_reduction(self.name, out_index, red)
        else:
            ops.store(self.name, out_index, self.data.inner_fn(list(index)))

    def make_symbolic_index(self):
        """Fresh loop symbols ``(index, rindex)`` named i0.. / r0.. for this buffer."""
        return ([sym(f"i{d}") for d in range(len(self.get_ranges()))],
                [sym(f"r{d}") for d in range(len(self.get_reduction_ranges()))])

    def get_read_names(self) -> list[str]:
        """Names of buffers the body loads, in first-read order (cached)."""
        if self._reads is None:  # (and the ``t.item()`` externs binding an unbacked symbol in its indices or sizes)
            h = DependencyRecorder.record(self)
            self._reads = list(dict.fromkeys(h.read_names() + _binders(h.exprs + [i for _, i in h.loads] +
                                                                       list(map(as_expr, self.get_size())))))
        return self._reads


def _binders(exprs: list) -> list[str]:
    """The ``t.item()`` externs that bind the unbacked symbols of ``exprs``: a step using the symbol reads them."""
    if not (binds := getattr(V.graph, "binders", None)):
        return []
    syms = [s for e in exprs if isinstance(e, sympy.Basic) for s in sorted(e.free_symbols, key=str)]
    syms += [t for s in syms if s in PRECOMPUTED for t in sorted(PRECOMPUTED[s].free_symbols, key=str)]  # trunc(zf0)
    return [binds[s] for s in syms if s in binds]


class ScatterBuffer(ComputedBuffer):
    """Writes into a fresh copy of a tensor at computed (often indirect) positions:
    ``index_put``, ``scatter``, ``scatter_add``.

    Its storage *is* the storage of ``target`` (a ComputedBuffer made for this purpose by the lowering, read by nothing
    else): the wrapper aliases it (``buf7 = buf5``) instead of allocating. The body iterates over ``ranges`` (the
    scattered elements); ``dest_fn(index)`` gives the destination index in the target's shape and ``value_fn(index)``
    the value; ``mode`` is None (overwrite) or "atomic_add"."""

    def __init__(self, name, target: ComputedBuffer, ranges, dest_fn, value_fn, mode):
        data = Pointwise(target.get_device(), target.get_dtype(), value_fn, ranges)
        super().__init__(name, target.layout, data)
        self.loop_order = None  # ranges are the scattered elements, not the layout's dims
        self.target, self.dest_fn, self.value_fn, self.mode = target, dest_fn, value_fn, mode

    def _store_body(self, index, rindex) -> None:
        dest = self.dest_fn(list(index))
        ops.store(self.name, self.layout.make_indexer()(dest), self.value_fn(list(index)), self.mode)

    def get_read_names(self):
        return list(dict.fromkeys(super().get_read_names() + [self.target.get_name()]))


class ConcatStorage(Buffer):
    """The memory of one or more concatenations (docs/ir.md, "Concat buffers"): allocated by the wrapper before the
    first :class:`ConcatSlice` written into it; no step computes or reads it by name (its slices and its
    :class:`ConcatBuffer` views do)."""

    #: laid out for the clone that ends its concatenation's one use, which may then read it as it is
    #: (``lowering_views._copy_strides``, ``lowering._clone_in_place``)
    for_copy = False


class ConcatBuffer(Buffer):
    """The result of a ``cat`` whose inputs are written straight into ``storage`` (docs/ir.md, "Concat buffers"):
    a view of the storage from its start with the storage's strides (a concatenation whose inputs begin another's,
    as in a dense block, is a prefix of it). It computes nothing and reads its slices, so every reader comes after
    the last of them is written (the scheduler sees a step between them and fuses across it nothing)."""

    def __init__(self, name: str, layout: Layout, storage: ConcatStorage, slices: list):
        super().__init__(name, layout)
        self.storage, self.slices = storage, slices

    def get_read_names(self):
        return [s.get_name() for s in self.slices]


class ConcatSlice(ComputedBuffer):
    """An input of a concatenation computed (or copied) into its slice of ``storage``. Its layout has the storage's
    strides at offset 0: its name is bound to a view of the storage ``view_offset`` elements past its start, so the
    offset never appears in a kernel (same-shaped slices of one storage share a kernel source). A slice never takes
    a freed buffer, is never stored over a dead input and is not returned to the user as it is."""

    def __init__(self, name: str, layout: Layout, data: Loops, storage: ConcatStorage, view_offset):
        super().__init__(name, layout, data)
        self.storage, self.view_offset = storage, as_expr(view_offset)


class ExternKernel(Buffer):
    """An ATen op run as-is. ``args``/``kwargs`` hold IR tensors (realized buffers or ReinterpretViews) and plain Python
    values; ``layout`` is None when the op returns several tensors (read them through :class:`MultiOutput`)."""

    def __init__(self, name, layout, op, args, kwargs):
        super().__init__(name, layout)
        self.op, self.args, self.kwargs = op, args, kwargs
        self.origin = _node_origin()  # the wrapper's comment names it (an error raised here)
        self.binders = _binders(torch.utils._pytree.tree_leaves((args, kwargs)))  # ``x[t.item()]``: t's extern

    def input_names(self) -> list[str]:
        def visit(a):
            if isinstance(a, (list, tuple)):
                return [n for x in a for n in visit(x)]
            if isinstance(a, ReinterpretView):
                return [a.data.get_name()]
            return [a.get_name()] if isinstance(a, Buffer) else []
        return list(dict.fromkeys(visit(list(self.args) + list(self.kwargs.values()))))

    def get_read_names(self):
        return list(dict.fromkeys(self.input_names() + self.binders))


class MultiOutput(Buffer):
    """Output ``path`` (tuple of indices) of a multi-output ExternKernel."""

    def __init__(self, name, layout, parent: ExternKernel, path: tuple):
        super().__init__(name, layout)
        self.parent, self.path = parent, path

    def get_read_names(self):
        return [self.parent.get_name()]


# ---------------------------------------------------------------------------- views

class ReinterpretView(_Laid):
    """A strided view of a realized buffer: same storage, another layout."""

    def __init__(self, data: Buffer, layout: Layout):
        assert isinstance(data, Buffer)
        self.data, self.layout = data, layout

    def get_name(self):
        return self.data.get_name()


class GenericView(IRNode):
    """A view of any IR value by re-indexing: ``self[index] = data[reindex(index)]``. ``restride(layout)``, when
    given, is the view's strided layout over ``data`` realized with ``layout`` (None where not expressible)."""

    def __init__(self, data: IRNode, size, reindex: Callable, restride: Optional[Callable] = None):
        self.data, self.size, self.reindex, self.restride = data, [as_expr(s) for s in size], reindex, restride

    def get_size(self):
        return self.size

    def make_loader(self):
        inner, reindex = self.data.make_loader(), self.reindex
        return lambda index: inner(reindex(list(index)))


# ---------------------------------------------------------------------------- boxes

class StorageBox(IRNode):
    """Holds either unrealized loops or a realized buffer; ``realize`` converts."""

    def __init__(self, data: IRNode):
        self.data = data

    def is_realized(self) -> bool:
        return isinstance(self.data, Buffer)

    def realize(self, stride: Optional[list] = None) -> Buffer:
        """Make this value a named ComputedBuffer (contiguous unless ``stride``)."""
        if isinstance(self.data, Buffer):
            return self.data
        assert isinstance(self.data, Loops)
        g, size = current_graph(), self.data.get_size()
        if stride is None and hasattr(g, "default_strides"):
            stride = g.default_strides(self.data)
        layout = (Layout(self.data.device, self.data.dtype, list(size), list(stride))
                  if stride is not None else Layout.contiguous(self.data.device, self.data.dtype, size))
        buf = ComputedBuffer(g.new_buffer_name(), layout, self.data)
        g.register_buffer(buf)
        self.data = buf
        return buf


class TensorBox(IRNode):
    """The IR value of one ATen tensor (what lowerings take and return)."""

    def __init__(self, data: IRNode):
        self.data = data

    @staticmethod
    def create(data: IRNode) -> "TensorBox":
        return TensorBox(StorageBox(data))

    def __repr__(self):
        return f"TensorBox({self.data!r})"
