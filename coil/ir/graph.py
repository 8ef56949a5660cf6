"""GraphLowering: interpret a functional ATen FX graph into coil's loop IR.

Input: ``gm`` (ATen ops after coil's decompositions) and example inputs (fake or real).
Output: ``self.buffers`` (ComputedBuffer / ExternKernel / MultiOutput in creation
order, then put in dependency order by :meth:`GraphLowering._order_buffers`), ``self.graph_inputs`` (InputBuffer per
tensor placeholder), ``self.outputs`` (an :class:`OutputSpec` per graph output).

Decisions made here (all logged): which ops fell back to extern kernels (event ``lowering_fallbacks``), and when an
unrealized pointwise value is realized (stored to memory) instead of inlined into readers: graph outputs, inputs of
extern kernels, values with several readers whose body is expensive (more loads than ``config.max_inline_reads`` or more
than :data:`MAX_INLINE_OPS` ops), bodies that grew larger than :data:`MAX_BODY_OPS` ops, and on a CPU transcendental values
that every reader broadcasts to 16x their elements (a squeeze-excitation gate's sigmoid)."""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import operator
import sys
from collections import Counter
from typing import Any, Optional

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import (GuardOnDataDependentSymNode, free_unbacked_symbols, guard_or_true,
                                                   statically_known_true)

from coil import trace
from coil.config import config
from coil.ir import lowering as L
from coil.ir import lowering_activations  # noqa: F401  (registers gelu lowerings)
from coil.ir import lowering_conv  # noqa: F401  (registers conv-bias / max-pool lowerings)
from coil.ir import lowering_views  # noqa: F401  (registers view/index lowerings)
from coil.ir.nodes import (Buffer, ComputedBuffer, ConcatBuffer, ConcatSlice, ConstantBuffer, ExternKernel, GenericView,
                           InputBuffer, Layout, Loops, MultiOutput, Pointwise, ReinterpretView, ScatterBuffer, StorageBox,
                           TensorBox, V)
from coil.ir.symbols import as_expr, current_shape_env, hint, product
from coil.ir.virtualized import compute_dtype, ops
from coil.ir.handlers import TextPrinter, record_pointwise
from coil.ir.lowering import make_pointwise_box
from coil.ir.lowering_views import strided_base

MAX_INLINE_OPS = 64
MAX_BODY_OPS = 256
#: ops costly enough on a CPU that a small value computing one is realized before readers broadcast it (_maybe_realize)
_TRANSCENDENTAL = frozenset({"exp", "expm1", "log", "log1p", "sigmoid", "tanh", "erf", "pow", "sin", "cos"})


def _broadcast_by_every_user(n: torch.fx.Node, factor: int = 16) -> bool:
    """Whether every reader of ``n`` produces at least ``factor`` times as many elements as ``n`` has (static sizes)."""
    vals = [m.meta.get("val") for m in [n, *n.users]]
    if not n.users or not all(isinstance(v, torch.Tensor) and isinstance(v.numel(), int) for v in vals):
        return False
    return all(v.numel() >= factor * vals[0].numel() for v in vals[1:])


@dataclasses.dataclass
class OutputSpec:
    """How the wrapper produces graph output k: ``kind`` is "buffer" (``name``),
    "view" (``as_strided(name, size, stride, offset)``), or "value" (a Python value)."""

    kind: str
    name: Optional[str] = None
    size: Optional[list] = None
    stride: Optional[list] = None
    offset: Any = 0
    value: Any = None


def _resolve_neg_bit(box: TensorBox, value: torch.Tensor) -> TensorBox:
    """``box`` of a tensor whose negation is a lazy bit (``z.conj().imag``, an extern ``_neg_view``:
    ``is_neg()``) as its values: kernels read storage, so its loads negate. (ATen ops, which the externs
    run, read the bit themselves; they get the negated values realized.)"""
    if not value.is_neg():
        return box
    return make_pointwise_box(ops.neg, [box], list(box.get_size()), value.dtype, compute_dtype(value.dtype))


def _specialize_floats(tree, computed: dict, specialize: bool):
    """``tree`` with each SymFloat an extern kernel of this graph computes (``d.item()``, ``1 - d``: ``computed`` maps
    its expression to that extern) read from that extern's result at run time, as eager passes the Python number; with
    ``specialize``, each other backed SymFloat made the float it is now, a guard on its value (a recompile per value):
    the wrapper would write it as a constant (docs/aot.md, "Scalar reads")."""
    def value(v):
        if (ek := computed.get(v.node._expr)) is not None:
            return ek
        return float(v) if specialize and not free_unbacked_symbols(v.node._expr) else v
    return pytree.tree_map_only(torch.SymFloat, value, tree)


def _fake_layout(t: torch.Tensor) -> Layout:
    return Layout(t.device, t.dtype, [as_expr(s) for s in t.shape], [as_expr(s) for s in t.stride()])


_PAD_DEVICES = ("cuda",)  # tests add "cpu" to exercise the path without a GPU
_CHANNELS_LAST_DEVICES = ("cuda",)  # likewise

_aten = torch.ops.aten
_RESHAPES = {_aten.permute.default, _aten.transpose.int, _aten.view.default, _aten._unsafe_view.default,
             _aten.reshape.default, _aten.unsqueeze.default, _aten.squeeze.dim}


def one_copy_chain(n: torch.fx.Node) -> Optional[list]:
    """The nodes from ``n``'s only use on when that is a chain of at most three reshapes or permutes ending in one
    ``clone`` (a rotary backward's ``cat`` of the q/k/v gradients, transposed and made contiguous for the projection's
    mm), the clone last; else None."""
    chain = []
    for _ in range(4):
        if len(n.users) != 1:
            return None
        n = next(iter(n.users))
        chain.append(n)
        if n.target is _aten.clone.default:
            return chain
        if n.target not in _RESHAPES:
            return None
    return None
#: extern ops whose first argument is read (or written) through its storage: it gets
#: eager's strides and offset, not the layout this graph chose for the value (fuzz s214 #5389)
_STORAGE_OPS = (_aten.as_strided_scatter.default, _aten.as_strided.default, _aten.as_strided_copy.default,
                _aten.view.dtype)
#: extern ops that run channels-last when their 4-D inputs are (config.conv_channels_last)
_CHANNELS_LAST_OPS = (_aten.convolution.default, _aten.max_pool2d_with_indices.default, _aten.avg_pool2d.default,
                      _aten._adaptive_avg_pool2d.default, _aten.convolution_backward.default,
                      _aten.max_pool2d_with_indices_backward.default, _aten.avg_pool2d_backward.default,
                      _aten._adaptive_avg_pool2d_backward.default)


def _grouped_conv(n: torch.fx.Node) -> bool:
    """Whether ``convolution`` / ``convolution_backward`` node ``n`` has groups of more than one input channel (not
    depthwise: channels-last is what makes depthwise convolutions fast)."""
    at = (8, 1) if n.target is _aten.convolution.default else (9, 2)
    if len(n.args) <= at[0]:
        return False
    groups, weight = n.args[at[0]], n.args[at[1]]
    w = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
    return isinstance(groups, int) and groups > 1 and isinstance(w, torch.Tensor) and w.shape[1] > 1


def _channels_last_strides(size) -> list:
    """(N, C, H, W) strides of an (N, H, W, C)-ordered dense layout."""
    n, c, h, w = size
    return [c * h * w, sympy.Integer(1), w * c, c]


def _is_channels_last(layout: Layout) -> bool:
    return len(layout.size) == 4 and _strides_agree(layout.size, layout.stride,
                                                    _channels_last_strides(layout.size), False)


def _in_channels_last_order(layout: Layout) -> bool:
    """Whether a 4-D layout walks memory in (N, H, W, C) order with C at stride 1, dense or not: a channels-last
    buffer, or a channel slice of one (a view of a DenseNet concat storage, whose row holds more channels)."""
    if len(layout.size) != 4:
        return False
    try:
        n, c, h, w = (int(v) for v in layout.size)
        sn, sc, sh, sw = (int(v) for v in layout.stride)
    except (TypeError, ValueError):
        return _is_channels_last(layout)
    return c > 1 and sc == 1 and (w == 1 or sw >= c) and (h == 1 or sh >= sw * w) and (n == 1 or sn >= sh * h)
_PADDABLE_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


class _BernoulliInLayout:
    """``torch.empty_like(x).bernoulli_(p)``, which the extern kernel of ``bernoulli.p`` / ``bernoulli.Tensor`` runs
    when ``x`` is an uninitialized buffer (``_EMPTY_OPS``): that is the functionalized form of an in-place fill (eager's
    CPU dropout is ``empty_like(x).bernoulli_(1 - p)``, traced as ``bernoulli.p(empty_permuted(...))``), which draws in
    the memory order of its buffer, while ATen's functional ``bernoulli`` allocates contiguous and draws in logical
    order: with ``fallback_random``, dropout of a transposed tensor got another mask than eager (user report 9). A
    ``bernoulli.p`` of any other tensor is the user's functional ``torch.bernoulli(x, p)`` and runs as is."""

    tags = (torch.Tag.nondeterministic_seeded,)   # it draws from the generator (the scheduler keeps draws in order)

    def __call__(self, x, p=0.5, *, generator=None):
        return torch.empty_like(x).bernoulli_(p, generator=generator)

    def __repr__(self):
        return "empty_like(x).bernoulli_(p)"


bernoulli_in_layout = _BernoulliInLayout()
_CHECKS = (torch.ops.aten._assert_async.msg, torch.ops.aten._assert_async.default,
           torch.ops.aten._assert_scalar.default)
_INPLACE_BERNOULLI = (torch.ops.aten.bernoulli.p, torch.ops.aten.bernoulli.Tensor)
_EMPTY_OPS = (torch.ops.aten.empty_permuted.default, torch.ops.aten.empty_like.default,
              torch.ops.aten.empty_strided.default, torch.ops.aten.empty.memory_format,
              torch.ops.aten.new_empty.default, torch.ops.aten.new_empty_strided.default)


class _AsStridedScatterOnce:
    """``as_strided_scatter`` through a view whose stride-0 dims (size > 1) are narrowed to one
    index, as is ``src``: ATen's refuses to copy into memory several elements share, while the
    functional form of a write through such a view passes here when the program wrote one value
    per location, or none (``a.as_strided_((1, 4, 1), (0, 0, 2))[1:].clamp_(min=2)``: s216 #15681)."""

    def __call__(self, x, src, size, stride, storage_offset=None):
        dims = [d for d, (n, st) in enumerate(zip(size, stride)) if isinstance(st, int) and st == 0
                and isinstance(n, int) and n > 1]
        if dims:
            size = list(size)
            for d in dims:
                size[d], src = 1, src.narrow(d, 0, 1)
        return torch.ops.aten.as_strided_scatter.default(x, src, size, stride, storage_offset)

    def __repr__(self):
        return "as_strided_scatter (one element per location)"


as_strided_scatter_once = _AsStridedScatterOnce()


def _empty_like_layout(lay: Optional[Layout], out: Layout) -> Layout:
    """``out`` with the strides ``torch.empty_like`` gives a tensor of layout ``lay``
    (its own when dense; ``out`` unchanged when ``lay`` is unknown or symbolic)."""
    if lay is None or list(lay.size) != list(out.size) or not all(
            isinstance(v, (int, sympy.Integer)) for v in list(lay.size) + list(lay.stride)):
        return out
    like = torch.empty_like(torch.empty_strided([int(v) for v in lay.size],
                                                [int(v) for v in lay.stride], device="meta"))
    return Layout(out.device, out.dtype, list(out.size), [sympy.Integer(v) for v in like.stride()], sympy.Integer(0))


def misaligned_leading_dim(strides) -> bool:
    """Whether a 2-D matrix with ``strides`` has a BLAS leading dimension (its row
    stride, or its column stride when transposed) that is not a multiple of 8 elements.
    Matrices with neither stride 1 are copied by ATen anyway: False."""
    s0, s1 = (int(v) for v in strides)
    ld = s0 if s1 == 1 else s1 if s0 == 1 else None
    return ld is not None and ld % 8 != 0


def _misaligned_ld(x) -> bool:
    """:func:`misaligned_leading_dim` of IR operand ``x`` (False if it has no strides)."""
    try:
        return misaligned_leading_dim(x.get_stride())
    except (TypeError, ValueError, AttributeError):
        return False


def _pads_matmuls(meta) -> bool:
    """Whether a matmul whose output is fake tensor ``meta`` may be padded: a 2-D fp16/bf16
    result on a padding device (``_PAD_DEVICES``) with ``config.pad_matmul_outputs`` on."""
    return (isinstance(meta, torch.Tensor) and meta.device.type in _PAD_DEVICES and meta.dim() == 2
            and meta.dtype in (torch.float16, torch.bfloat16) and config.pad_matmul_outputs)


def _maybe_pad_matmul_output(ek: ExternKernel, meta: torch.Tensor) -> None:
    """Pad a CUDA fp16/bf16 ``mm``/``addmm`` (alpha = beta = 1) whose rows are not 16-byte aligned
    (``N % 8 != 0`` or ``K % 8 != 0``): the wrapper runs it through ``matmul_padded``; for a padded N
    the result keeps a padded row stride (``ek.padded_output``) and a graph output gets a contiguous copy
    (``_output_spec``). The padded dims must be static. docs/codegen.md, "Padded matmuls"."""
    if ek.op not in _PADDABLE_MATMULS or not _pads_matmuls(meta) or ek.kwargs:
        return
    a, b = ek.args[1:3] if ek.op is torch.ops.aten.addmm.default else ek.args[0:2]
    m, n = meta.shape
    k = a.get_size()[1]
    if not (isinstance(n, int) and all(isinstance(v, int) for v in meta.stride()) and tuple(meta.stride()) == (n, 1)):
        return  # N symbolic or the output not contiguous
    hm, hk = hint(as_expr(m)), hint(as_expr(k))
    big = hm * n >= (1 << 20) or hm * hk >= (1 << 20) or hk * n >= (1 << 20)
    pad_n = n % 8 != 0 and n >= 64 and big
    # an operand whose leading dimension (row stride, or column stride when transposed) is not a multiple of 8: K %
    # 8, or a transposed operand with M % 8 / N % 8 (a symbolic stride is never padded: _misaligned_ld is False for it)
    pad_k = big and min(hm, n, hk) >= 64 and (_misaligned_ld(a) or _misaligned_ld(b))
    if not (pad_n or pad_k):
        return
    if ek.op is torch.ops.aten.addmm.default:
        bias_size = [str(x) for x in ek.args[0].get_size()] if hasattr(ek.args[0], "get_size") else None
        if bias_size not in ([str(n)], ["1", str(n)], ["1"], []):
            return
    ek.padded_matmul = True
    npad = -(-n // 8) * 8 if pad_n else n
    if pad_n:
        ek.layout = Layout(meta.device, meta.dtype, [as_expr(m), as_expr(n)],
                           [as_expr(npad), sympy.Integer(1)], sympy.Integer(0))
        ek.padded_output = True
    trace.log("pad_matmul", stage="lowering", buffer=ek.name, op=str(ek.op), m=str(m), n=n,
              k=str(k), pad_n=pad_n, pad_k=pad_k, row_stride=npad)


def _padded_matmul_result(r) -> bool:
    """Whether lowered value ``r`` is (a view of) the row-padded output of :func:`_maybe_pad_matmul_output`."""
    d = getattr(r, "data", None)
    return bool(getattr(d.data if isinstance(d, (ReinterpretView, StorageBox)) else None, "padded_output", False))


class GraphLowering(torch.fx.Interpreter):
    """Lower one ATen graph (see module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, device: torch.device):
        super().__init__(gm, garbage_collect_values=False)
        self.gm, self.example_inputs, self.device = gm, list(example_inputs), torch.device(device)
        self.buffers: list[Buffer] = []
        self.name_to_buffer: dict[str, Buffer] = {}
        self.graph_inputs: dict[str, InputBuffer] = {}
        self.placeholder_names: list[str] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.outputs: list[OutputSpec] = []
        #: placeholder indices of inputs a scatter writes in place (_write_inputs_in_place)
        self.inputs_written: list[int] = []
        # (id of a view's IR node, strides) -> (the node, its materialized buffer): a value
        # handed to an extern kernel and also returned is copied once, not twice
        self._materialized: dict = {}
        self.fallbacks, self.native = Counter(), Counter()
        self.seen_unbacked: set = set()  # (run_node)
        self.binders: dict = {}  # unbacked symbol -> the t.item() extern binding it (ComputedBuffer.get_read_names)
        self.float_externs: dict = {}  # SymFloat expression -> the extern kernel computing it (_specialize_floats)
        self.current_node, self._counter = None, itertools.count()
        #: random ops lowered natively; the wrapper draws this many seeds per call
        #: into the int64 buffer ``seeds`` (one Philox stream per op)
        self.seed_count = 0
        self._inputs_iter = iter(self.example_inputs)
        self.channels_last = self._use_channels_last()
        #: a channels-last forward returns its saved tensors in the layout it computed
        #: them in; aot compiles the backward with those strides (``output_strides``)
        self.free_saved_layouts = (self.channels_last and self.gm.meta.get("coil_aot_graph") == "forward"
                                   and self.gm.meta.get("coil_saved_outputs") is not None)
        self.output_strides: list = []

    def _use_channels_last(self) -> bool:
        """Whether this graph runs its convolutions channels-last (logged)."""
        if not config.conv_channels_last or self.device.type not in _CHANNELS_LAST_DEVICES:
            return False
        conv_nodes = [n for n in self.gm.graph.nodes
                      if (n.target is _aten.convolution.default
                          and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim() == 4)
                      or (n.target is _aten.convolution_backward.default
                          and isinstance(n.args[0].meta.get("val"), torch.Tensor)
                          and n.args[0].meta["val"].dim() == 4)]
        convs = len(conv_nodes)
        kind = self.gm.meta.get("coil_aot_graph") if hasattr(self.gm, "meta") else None
        # a training forward may only return saved tensors channels-last when aot
        # compiles the backward with the strides it reports (coil_saved_outputs is set)
        use = convs > 0 and (kind != "forward" or self.gm.meta.get("coil_saved_outputs") is not None)
        reason = None if config.conv_channels_last_training or kind not in ("forward", "backward") else \
            "training graph (config.conv_channels_last_training is off)"
        if reason is None and any(map(_grouped_conv, conv_nodes)):
            reason = "grouped convolution with more than one input channel per group (cuDNN runs it channels-last " \
                     "with a generic transform of its own: 4.5 ms instead of 2.1 in RegNetY's AMP step on an H100)"
        use = use and reason is None
        if convs:
            trace.log("layout_channels_last", stage="lowering", enabled=use, convolutions=convs,
                      graph=kind or "unknown", reason=None if use else reason)
        return use

    def default_strides(self, loops) -> Optional[list]:
        """Strides for a value realized without a requested layout (None: contiguous). In a channels-last graph, a 4-D
        pointwise value that reads a buffer in channels-last order of its batch and channel sizes or of its batch and
        image sizes is channels-last too (BatchNorm + ReLU after a convolution, a max pool's window, BatchNorm of a
        concatenation or of a concat storage's channel slice in a DenseNet), so the next convolution gets it without a
        transpose and a reduction over it reads along C like the other channels-last buffers of the graph."""
        if not self.channels_last or not isinstance(loops, Pointwise) or len(loops.get_size()) != 4:
            return None
        size = [str(v) for v in loops.get_size()]
        for name in record_pointwise(loops).read_names():
            b = self.name_to_buffer.get(name)
            if b is None or b.layout is None or not _in_channels_last_order(b.layout):
                continue
            other = [str(v) for v in b.layout.size]
            # the same batch and channels (a pooling window's image is smaller) or batch and image (a concatenation)
            if other[0] == size[0] and (other[1] == size[1] or other[2:] == size[2:]):
                return _channels_last_strides(loops.get_size())
        return None

    # -- registry ---------------------------------------------------------------------------
    def new_buffer_name(self) -> str:
        return f"buf{next(self._counter)}"

    def new_seed_index(self) -> int:
        """Index of a fresh seed in the per-call ``seeds`` buffer (registered lazily)."""
        if self.seed_count == 0:
            self.name_to_buffer["seeds"] = InputBuffer(
                "seeds", Layout(self.device, torch.int64, [sympy.Integer(1 << 20)], [sympy.Integer(1)]))
        self.seed_count += 1
        return self.seed_count - 1

    def register_buffer(self, buf: Buffer) -> None:
        self.buffers.append(buf)
        self.name_to_buffer[buf.name] = buf

    def device_for_node(self) -> torch.device:
        v = self.current_node.meta.get("val") if self.current_node is not None else None
        if isinstance(v, (list, tuple)):
            v = next((t for t in v if isinstance(t, torch.Tensor)), None)
        return v.device if isinstance(v, torch.Tensor) else self.device

    # -- running --------------------------------------------------------------------------
    def lower(self) -> "GraphLowering":
        prev, V.graph = V.graph, self
        try:
            with trace.stage("lowering"):
                self.run(*self.example_inputs)
            self._order_buffers()
        finally:
            V.graph = prev
        if config.verbose and self.fallbacks:
            print(f"coil: extern kernels in this graph: {dict(self.fallbacks)}", file=sys.stderr)
        if trace.enabled():
            trace.log("lowering_fallbacks", stage="lowering", fallbacks=dict(self.fallbacks), native=dict(self.native))
            trace.artifact("loop_ir", lambda: self.format_ir(), kind="text")
        return self

    def _order_buffers(self) -> None:
        """Put every buffer after the buffers it reads (stable: a valid creation order is kept as it is). Bodies are
        define-by-run, so a body whose loader is made when it runs reads what its input is *then*: ``y = x * 2; return
        cat([y, x]), y`` lowered the cat (buf0) while ``y`` was an inlined body; ``y`` became buf1 as a graph output,
        and the cat's body then loaded buf1, which ran after it (the wrapper read an unassigned buf1)."""
        pos = {b.get_name(): i for i, b in enumerate(self.buffers)}
        deps = [{pos[r] for r in b.get_read_names() if r in pos and r != b.get_name()} for b in self.buffers]
        if all(d < i for i, ds in enumerate(deps) for d in ds):
            return
        users: dict = {}
        for i, ds in enumerate(deps):
            for d in ds:
                users.setdefault(d, []).append(i)
        missing = [len(ds) for ds in deps]
        ready = [i for i, m in enumerate(missing) if m == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for u in users.get(i, ()):
                missing[u] -= 1
                if missing[u] == 0:
                    heapq.heappush(ready, u)
        assert len(order) == len(self.buffers), "cyclic buffer reads"
        trace.log("buffer_order", stage="lowering",
                  moved=[self.buffers[i].get_name() for k, i in enumerate(order) if i != k])
        self.buffers = [self.buffers[i] for i in order]

    def run_node(self, n: torch.fx.Node) -> Any:
        self.current_node = n
        syms = free_unbacked_symbols(n.meta.get("val")) if n.op != "output" else set()
        #: data-dependent sizes this node makes (``y[:x.item()]``: the slice's length)
        self.fresh_unbacked, self.seen_unbacked = syms - self.seen_unbacked, self.seen_unbacked | syms
        out = super().run_node(n)
        if n.op == "call_function" and isinstance(out, TensorBox):
            self._maybe_realize(n, out)
        return out

    def placeholder(self, target, args, kwargs):
        value, name = next(self._inputs_iter), self.current_node.name
        self.placeholder_names.append(name)
        if isinstance(value, torch.Tensor):
            buf = InputBuffer(name, _fake_layout(value))
            # where the input starts in its storage: layouts are relative to it, ATen's
            # as_strided offsets are absolute (lowering_views._as_strided)
            buf.storage_offset = as_expr(value.storage_offset())
            self.graph_inputs[name] = self.name_to_buffer[name] = buf
            return _resolve_neg_bit(TensorBox(StorageBox(buf)), value)
        if isinstance(value, (torch.SymInt, torch.SymBool)):  # a size the graph uses as an int: its expression;
            return sympy.Symbol(name) if isinstance(value, torch.SymBool) else as_expr(value)  # a bool: the arg
        return value

    def get_attr(self, target, args, kwargs):
        if isinstance(value := super().get_attr(target, args, kwargs), torch.Tensor):
            name = f"const_{target.replace('.', '_')}"
            buf = ConstantBuffer(name, _fake_layout(value), value)
            self.constants[name], self.name_to_buffer[name] = value, buf
            return TensorBox(StorageBox(buf))
        return value

    def call_function(self, target, args, kwargs):
        if target is operator.getitem:
            return args[0][args[1]]
        val = self.current_node.meta.get("val")
        if target is _aten._local_scalar_dense.default and isinstance(val, (torch.SymInt, torch.SymFloat)) \
                and free_unbacked_symbols(val.node._expr):
            # t.item() as a size: run it; the wrapper binds its symbol to the result, or checks it equals what the
            # ShapeEnv replaced the symbol by (``arange(n) + y``: n == len(y))
            self.make_extern(target, args, kwargs)
            unbacked = free_unbacked_symbols(as_expr(val))
            self.buffers[-1].binds = as_expr(val) if unbacked else None
            self.binders[as_expr(val)] = self.buffers[-1].get_name()
            self.buffers[-1].expects = None if unbacked else as_expr(val)
            return as_expr(val)
        if target is _aten.sym_size.int and self.fresh_unbacked and isinstance(args[0], TensorBox):
            return args[0].get_size()[args[1]]  # a symbol no op binds (CSE merged two nonzeros)
        if isinstance(val, (torch.SymInt, torch.SymBool)):
            # size arithmetic (sym_size, operator.mul, floordiv ...) and relations (runtime asserts): the fake trace's
            # result is already the expression in the ShapeEnv's symbols
            return as_expr(val)
        if getattr(target, "is_view", False) and not self.current_node.users:
            return None  # a view nothing reads (as_strided of an empty one ran: fuzz s81 #3325)
        if isinstance(target, torch._ops.HigherOrderOperator):
            from coil.ir.hops import LOWERINGS  # cond: branches compiled apart (ir/hops.py)
            if target in LOWERINGS:
                self.native[str(target)] += 1
                return LOWERINGS[target](self, args, kwargs)
        fn = L.LOWERINGS.get(target)
        if fn is not None and (self._has_complex(args, kwargs) or self.fresh_unbacked and
                               isinstance(val, torch.Tensor)):
            # no kernel backend has complex dtypes; a size only this op's output says (the
            # wrapper binds it from the extern's result): run the ATen op
            fn = None
        if fn is not None:
            try:
                out = fn(*args, **kwargs)
                self.native[str(target)] += 1
                return out
            except L.FallbackToExtern:
                pass
            except TypeError as e:
                # a lowering that needs an int size got a symbolic one (dynamic shapes):
                # the ATen op runs as an extern kernel instead (values stay exact)
                if current_shape_env() is None:
                    raise
                trace.log("dynamic_lowering_fallback", stage="lowering", op=str(target), error=str(e)[:500])
        if target not in _CHECKS:   # (a runtime check of values is an ATen call by design, not a missing lowering)
            self.fallbacks[str(target)] += 1
        return self.make_extern(target, args, kwargs)

    def output(self, target, args, kwargs):
        results = args[0]
        flat = list(results) if isinstance(results, (list, tuple)) else [results]
        out_nodes = self.current_node.args[0]
        out_nodes = list(out_nodes) if isinstance(out_nodes, (list, tuple)) else [out_nodes]
        metas = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in out_nodes]
        saved = self.gm.meta.get("coil_saved_outputs") if self.free_saved_layouts else None
        free = self.gm.meta.get("coil_free_layout_outputs", ()) if config.keep_padded_matmul_outputs else ()
        memo: dict = {}
        for i, (a, m) in enumerate(zip(out_nodes, metas)):
            if isinstance(m, torch.Tensor) and statically_known_true(m.numel() == 0) and \
                    isinstance(a, torch.fx.Node):      # (an unbacked numel: not known empty)
                e = _empty_eager(a, memo)  # eager's strides for an empty output
                metas[i] = m if e is None else e
        for i, (r, meta) in enumerate(zip(flat, metas)):
            # a saved output, or an LM head's logits (config.keep_padded_matmul_outputs), keeps the layout it has
            keep = saved is not None and saved[0] <= i < saved[1]
            if keep and isinstance(meta, torch.Tensor) and not all(isinstance(s, int) for s in meta.stride()):
                keep = False  # symbolic strides: output_strides are ints, the backward would read the traced ones
            if not keep and i in free and _padded_matmul_result(r):
                trace.log("padded_output_kept", stage="lowering", output=i, buffer=r.data.data.get_name(),
                          reason="a user output computed by a padded matmul keeps its padded row stride")
                keep = True
            self.outputs.append(self._saved_output_spec(r, meta) if keep else self._output_spec(r, meta))
        self._write_inputs_in_place(flat)
        self.output_strides = [self._spec_strides(o) for o in self.outputs]
        return results

    def _write_inputs_in_place(self, flat: list) -> None:
        """Scatter an input's new value into the input itself (docs/ir.md, "Inputs written in place").
        ``gm.meta["coil_mutated_inputs"]`` (set by aot for inference graphs) maps output ``k`` to the input ``j`` whose
        new value it is. When that value is a ScatterBuffer over a fresh copy of the whole input (``index_copy_``,
        ``index_put_``, ``scatter_`` of a KV cache or a buffer) with the input's layout, and nothing else reads the
        input, the copy is dropped and the scatter writes into the input's memory: the graph returns the input object,
        which the epilogue does not copy back. Indices go to ``self.inputs_written``."""
        if not (muts := self.gm.meta.get("coil_mutated_inputs")):
            return  # (most graphs: no buffer's reads are recorded for this)
        readers: dict = {}
        for b in self.buffers:
            for n in b.get_read_names():
                readers.setdefault(n, []).append(b)
        for k, j in muts.items():
            d = flat[k].data if isinstance(flat[k], TensorBox) else None
            sb = d.data if isinstance(d, StorageBox) else None
            name = self.placeholder_names[j]
            inp = self.graph_inputs.get(name)
            if not isinstance(sb, ScatterBuffer) or inp is None or getattr(sb.target, "copy_of", None) is not inp:
                continue
            same = [list(map(str, (l.size, l.stride, l.offset, l.dtype))) for l in (inp.layout, sb.target.layout)]
            if same[0] != same[1] or readers.get(name) != [sb.target] or any(o.name == name for o in self.outputs) \
                    or (self.outputs[k].kind, self.outputs[k].name) != ("buffer", sb.get_name()):
                continue
            self.buffers.remove(sb.target)
            del self.name_to_buffer[sb.target.get_name()]
            sb.target, sb._reads = inp, None
            self.inputs_written.append(j)
        if self.inputs_written:
            trace.log("inputs_written_in_place", stage="lowering", inputs=self.inputs_written)

    def _saved_output_spec(self, r, meta) -> OutputSpec:
        """A saved-for-backward output of a forward whose backward is compiled with the strides this graph reports
        (``output_strides``): it keeps its layout (a channels-last activation stays NHWC, not copied to NCHW). A view
        not yet realized is realized as an extern op's argument is (:meth:`realize_input`): the backward's extern op
        reads it as the forward's did (an attention bias keeps its aligned rows), and both share one copy."""
        if not isinstance(r, TensorBox):
            return OutputSpec("value", value=r)
        if isinstance(d := r.data, GenericView) and isinstance(meta, torch.Tensor):
            if not isinstance(d := self.realize_input(r, meta), ReinterpretView):
                return OutputSpec("buffer", d.get_name())
        if isinstance(d, ReinterpretView):
            return OutputSpec("view", d.data.get_name(), list(d.layout.size), list(d.layout.stride), d.layout.offset)
        if isinstance(d, StorageBox):
            return OutputSpec("buffer", d.realize().get_name())
        return OutputSpec("buffer", self._materialize(r, None).get_name())

    def _spec_strides(self, o: OutputSpec):
        """The strides output ``o`` is returned with (ints), or None (not a tensor)."""
        try:
            return tuple(int(v) for v in (o.stride if o.kind == "view" else self.name_to_buffer[o.name].get_stride()))
        except (TypeError, KeyError, AttributeError):  # (a value: no name)
            return None

    # -- helpers --------------------------------------------------------------------------
    def _has_complex(self, args, kwargs) -> bool:
        """Whether the node being lowered reads or produces a complex tensor."""
        def walk(v):
            if isinstance(v, (list, tuple)):
                return any(walk(x) for x in v)
            if isinstance(v, dict):
                return any(walk(x) for x in v.values())
            if isinstance(v, (TensorBox, torch.Tensor)):
                return v.get_dtype().is_complex if isinstance(v, TensorBox) else v.dtype.is_complex
            return isinstance(v, torch.dtype) and v.is_complex
        return walk(self.current_node.meta.get("val")) or walk(list(args)) or walk(kwargs)

    def _output_spec(self, r, meta) -> OutputSpec:
        """How graph output ``r`` (fake tensor ``meta``) is returned. Every tensor output has exactly ``meta``'s strides
        (storage offset 0 for a copy): the caller may be the backward graph, which was traced with these fake strides
        and indexes its inputs with them (a slice saved for the backward, ``(x * 2)[:, 1:5]`` with strides (7, 1), came
        back dense and the backward read the wrong elements), and for a user the strides are eager's. A view whose
        strides already agree is returned as a view; anything else is written into a buffer with those strides (a
        non-dense one keeps its gaps; stride-0 dims are written once per element)."""
        if not isinstance(r, TensorBox):
            return OutputSpec("value", value=r)
        d = r.data
        stride = [as_expr(s) for s in meta.stride()] if isinstance(meta, torch.Tensor) else None
        if (base := strided_base(r)) is not None and (isinstance(base[0], ConcatSlice) or isinstance(
                base[0], ConcatBuffer) and list(base[0].layout.size) != list(base[0].storage.layout.size)):
            # a concatenated input, or a concatenation that a longer one extends: returned as it is, it would
            # share its storage with the longer concatenation
            return OutputSpec("buffer", self._materialize(r, stride).get_name())
        if isinstance(d, GenericView):  # (a weight's autocast copy, transposed, saved for the backward)
            d = self._view_of_base(d, stride) or d
        if isinstance(d, ReinterpretView):
            if stride is not None and not _same_strides(d.layout, meta):
                # e.g. a view of a row-padded matmul result
                return OutputSpec("buffer", self._materialize(r, stride).get_name())
            # (strides that differ only on size-1 dims: the same memory, the fake strides)
            return OutputSpec("view", d.data.get_name(), list(d.layout.size),
                              stride if stride is not None else list(d.layout.stride), d.layout.offset)
        if isinstance(d, StorageBox) and d.is_realized():
            lay = d.data.layout
            if stride is not None and lay is not None and not _same_strides(lay, meta):
                # a padded matmul result (its row stride), a channels-last convolution output
                return OutputSpec("buffer", self._materialize(r, stride).get_name())
            if stride is not None and lay is not None and lay.offset == 0 and \
                    [str(v) for v in lay.stride] != [str(v) for v in stride]:
                # strides differing only on size-1 dims: an as_strided view with the fake strides (same memory, no copy)
                return OutputSpec("view", d.data.get_name(), list(lay.size), stride, sympy.Integer(0))
            return OutputSpec("buffer", d.data.get_name())
        if isinstance(d, StorageBox):
            return OutputSpec("buffer", d.realize(stride).get_name())
        return OutputSpec("buffer", self._materialize(r, stride).get_name())

    def _materialize(self, x: TensorBox, stride) -> Buffer:
        """A ComputedBuffer holding view ``x`` (strides ``stride`` or contiguous), made once per (view, strides)."""
        key = (id(x.data), None if stride is None else tuple(stride))
        if (hit := self._materialized.get(key)) is not None and hit[0] is x.data:
            return hit[1]
        box = TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), x.make_loader(), x.get_size()))
        buf = box.data.realize(stride)
        self._materialized[key] = (x.data, buf)
        return buf

    def _maybe_realize(self, n: torch.fx.Node, box: TensorBox) -> None:
        if not isinstance(sb := box.data, StorageBox) or not isinstance(sb.data, Pointwise):
            return
        users, h = len(n.users), record_pointwise(sb.data)
        nops, nreads = h.num_ops, len(set(h.loads))
        if nops > MAX_BODY_OPS and users == 1 and one_copy_chain(n) is not None:
            return  # the copy takes the body and is realized in its own layout (no transposing copy kernel)
        if nops > MAX_BODY_OPS or (users > 1 and (nreads > config.max_inline_reads or nops > MAX_INLINE_OPS)):
            # eager's layout when it is a dense permutation (the value may also be a graph output, which must have the
            # fake strides: no copy then); contiguous ones take the default (channels-last graphs choose their own)
            meta = n.meta.get("val")
            dense = isinstance(meta, torch.Tensor) and _dense_non_overlapping(meta) and not meta.is_contiguous() \
                and _same_size(meta, sb.data.get_size())
            sb.realize([as_expr(v) for v in meta.stride()] if dense else None)
        elif sb.data.get_device().type == "cpu" and h.op_names & _TRANSCENDENTAL and _broadcast_by_every_user(n):
            sb.realize()  # computed once, not once per element its readers broadcast it to (a squeeze-excitation gate)

    def realize_input(self, x: TensorBox, meta=None):
        """A realized buffer or strided view to hand to an extern kernel. A value that must be materialized gets the
        strides eager had (``meta``), since extern ops choose their output layout from their inputs' strides."""
        stride = None
        if isinstance(meta, torch.Tensor) and _same_size(meta, x.get_size()):
            try:  # (not dense: e.g. q/k/v, permuted slices of one projection)
                stride = [as_expr(s) for s in (meta.stride() if _dense_non_overlapping(meta)
                                               else _dense_strides_like(meta))]
            except GuardOnDataDependentSymNode:  # strides of unknown order (unbacked): contiguous
                stride = None
        if isinstance(d := x.data, GenericView):
            d = self._view_of_base(d, stride) or d
        if isinstance(d, ReinterpretView):
            if stride is None:
                return d
            # eager's strides on its size-1 dims too (the same elements): CPU flash attention
            # read a size-1 batch dim's stride 1 as a step and ran past an expanded input
            unit = [as_expr(m) if n == 1 else s for n, s, m in zip(d.layout.size, d.layout.stride, meta.stride())]
            return d if unit == list(d.layout.stride) else \
                ReinterpretView(d.data, dataclasses.replace(d.layout, stride=unit))
        return d.realize(stride) if isinstance(d, StorageBox) else self._materialize(x, stride)

    def _view_of_base(self, view: GenericView, stride, storage: Optional[torch.Tensor] = None) -> Optional[ReinterpretView]:
        """``view`` (views of unrealized loops of as many elements) as a strided view of the loops realized in their
        default layout, when that view has ``stride`` (any strides when None); else None, realizing nothing. A linear
        layer's backward reads the output gradient ``g`` in one ``mm`` and ``g.t()`` in the other: both then read one
        buffer, where a copy of ``g.t()`` wrote every element a second time. With ``storage`` (the view's fake tensor,
        for a storage op) the view may hold fewer elements; the loops must then be that fake's whole storage and the
        view at its storage offset."""
        chain, base = [], view
        while isinstance(base, GenericView):
            if base.restride is None:
                return None
            chain.append(base.restride)
            base = base.data
        if not isinstance(base, StorageBox) or not isinstance(base.data, (Loops, Buffer)):
            return None
        elems = product(base.data.get_size())
        if storage is None and sympy.expand(product(view.get_size()) - elems) != 0:
            return None
        base_stride = None
        if isinstance(base.data, Buffer):  # realized since the views were made
            lay = base.data.layout
        else:
            loops = base.data
            base_stride = self.default_strides(loops)
            lay = (Layout(loops.device, loops.dtype, list(loops.get_size()), list(base_stride))
                   if base_stride is not None else Layout.contiguous(loops.device, loops.dtype, loops.get_size()))
        if lay is None:
            return None
        for restride in reversed(chain):
            if (lay := restride(lay)) is None:
                return None
        if stride is not None and any(str(n) != "1" and str(a) != str(b) for n, a, b in zip(lay.size, lay.stride, stride)):
            return None
        if storage is not None and (
                sympy.expand(lay.offset - as_expr(storage.storage_offset())) != 0 or
                sympy.expand(elems * storage.element_size() - as_expr(storage.untyped_storage().nbytes())) != 0):
            return None
        return ReinterpretView(base.realize(base_stride), lay)

    def _eager_storage(self, x: TensorBox, fx_arg) -> TensorBox:
        """``x`` as eager lays it out, for an op that reads its storage: a value this graph realized with other strides
        (a scatter's target is laid out contiguous, eager's out-of-place ``index_put`` keeps a transposed input's
        strides) or computed and not yet realized is copied to eager's strides when those are dense at offset 0 (graph
        inputs have eager's layout already). A view of a value not yet realized whose storage in eager is that value
        (``split(a, [2, 4])[0].view(torch.int32)``, then read past the slice by ``as_strided``) is a view of the value
        realized whole, not a copy of the view's elements alone."""
        fv = fx_arg.meta.get("val") if isinstance(fx_arg, torch.fx.Node) else None
        if isinstance(fv, torch.Tensor) and isinstance(x.data, GenericView) and (v := self._view_of_base(
                x.data, [as_expr(s) for s in fv.stride()], storage=fv)) is not None:
            return TensorBox(v)
        if not (isinstance(fv, torch.Tensor) and fv.storage_offset() == 0 and _dense_non_overlapping(fv)):
            return x
        eager, base = [as_expr(s) for s in fv.stride()], strided_base(x)
        if base is not None and not isinstance(base[0], (ConcatSlice, ConcatBuffer)) and (  # (shared storage)
                isinstance(base[0], InputBuffer) or (list(base[1].stride) == eager and base[1].offset == 0)):
            return x
        if base is None and isinstance(x.data, StorageBox):
            x.data.realize(stride=eager)
            return x
        return TensorBox(StorageBox(self._materialize(x, eager)))

    def make_extern(self, target, args, kwargs):
        args, kwargs = _specialize_floats((args, kwargs), self.float_externs, isinstance(target, torch._ops.OpOverload))
        cl = self.channels_last and target in _CHANNELS_LAST_OPS

        def conv(a, fa):
            if isinstance(a, TensorBox):
                meta = fa.meta.get("val") if isinstance(fa, torch.fx.Node) else None
                if cl and len(a.get_size()) == 4:
                    return self._channels_last_input(a)
                r = self.realize_input(a, meta)
                return self._traced_layout_input(a, r, meta) if self.channels_last and not cl else r
            if isinstance(a, (list, tuple)):
                fas = fa if isinstance(fa, (list, tuple)) and len(fa) == len(a) else [None] * len(a)
                return type(a)(conv(x, f) for x, f in zip(a, fas))
            return a
        n, meta = self.current_node, self.current_node.meta.get("val")
        if target in _STORAGE_OPS and args and isinstance(args[0], TensorBox):
            args = (self._eager_storage(args[0], n.args[0]),) + tuple(args[1:])
        if target in _PADDABLE_MATMULS and not kwargs:
            padded = self._matvec_as_reduction(target, args, meta)
            if padded is None and target is torch.ops.aten.mm.default:
                padded = self._mm_with_padded_operand(args, meta)
            if padded is not None:
                return padded
        if cl and target is _aten.convolution.default and not config.conv_channels_last_weights \
                and len(args) > 1 and self._is_graph_input(args[1]):
            # the weight as it comes: ATen's convolution makes the channels-last copy
            # itself (in C++, cheaper on the host than a generated kernel's launch)
            weight = self.realize_input(args[1], n.args[1].meta.get("val"))
            args = tuple(conv(a, fa) if i != 1 else weight for i, (a, fa) in enumerate(zip(args, n.args)))
        else:
            args = conv(tuple(args), tuple(n.args))
        kwargs = {k: conv(v, n.kwargs.get(k)) for k, v in kwargs.items()}
        name = self.new_buffer_name()
        if isinstance(meta, torch.Tensor):
            lay, op = self._extern_layout(meta, cl), target
            if target is _aten.as_strided_scatter.default:
                op = as_strided_scatter_once
            if target in _INPLACE_BERNOULLI and args and isinstance(n.args[0], torch.fx.Node) \
                    and n.args[0].target in _EMPTY_OPS:
                # eager's in-place bernoulli_ of a fresh buffer, made functional by tracing
                lay, op = _empty_like_layout(getattr(args[0], "layout", None), lay), bernoulli_in_layout
            ek = ExternKernel(name, lay, op, args, kwargs)
            _maybe_pad_matmul_output(ek, meta)
            self.register_buffer(ek)
            return _resolve_neg_bit(TensorBox(StorageBox(ek)), meta)
        ek = ExternKernel(name, None, target, args, kwargs)
        self.register_buffer(ek)
        if isinstance(meta, torch.SymFloat):  # a Python float at run time, which later externs read (_specialize_floats)
            self.float_externs[meta.node._expr] = ek

        def build(v, path):
            if isinstance(v, torch.Tensor):
                mo = MultiOutput(self.new_buffer_name(), self._extern_layout(v, cl), ek, path)
                self.register_buffer(mo)
                return TensorBox(StorageBox(mo))
            return type(v)(build(x, path + (i,)) for i, x in enumerate(v)) if isinstance(v, (list, tuple)) else v
        return build(meta, ())

    # -- channels-last convolutions -----------------------------------------------------
    @staticmethod
    def _is_graph_input(x) -> bool:
        """Whether TensorBox ``x`` is a graph input as it was passed (no view, no copy)."""
        d = getattr(x, "data", None)
        return isinstance(d, StorageBox) and isinstance(d.data, InputBuffer)

    def _traced_layout_input(self, x: TensorBox, r, meta):
        """In a channels-last graph, ``r`` (the realized ``x`` for an extern op that is not one of the channels-last
        ops) with the strides the op was traced with when ``r`` is a channels-last 4-D buffer or view and the traced
        input was not: some ATen kernels give other values for such input (``_weight_norm_interface_backward`` on a
        channels-last ``convolution_backward`` weight gradient did), and the fake outputs the rest of the graph relies
        on came from the traced strides."""
        lay = getattr(r, "layout", None)
        if not isinstance(meta, torch.Tensor) or meta.dim() != 4 or lay is None or len(lay.size) != 4 \
                or not _is_channels_last(lay) or not _dense_non_overlapping(meta) or not _same_size(meta, x.get_size()):
            return r
        want = [as_expr(v) for v in meta.stride()]
        if all(str(a) == str(b) or str(n) == "1" for a, b, n in zip(lay.stride, want, meta.shape)):
            return r
        return self._materialize(x, want)

    def _channels_last_input(self, x: TensorBox):
        """4-D ``x`` as a channels-last buffer or view (a copy only if it is not one)."""
        if isinstance(d := x.data, ReinterpretView) and _is_channels_last(d.layout):
            return d
        if isinstance(d, StorageBox) and d.is_realized() and d.data.layout is not None \
                and _is_channels_last(d.data.layout):
            return d.data
        stride = _channels_last_strides(x.get_size())
        return d.realize(stride) if isinstance(d, StorageBox) and not d.is_realized() else self._materialize(x, stride)

    @staticmethod
    def _extern_layout(meta: torch.Tensor, channels_last: bool) -> Layout:
        """The layout an extern kernel's output is given: the fake tensor's, or channels-last for a 4-D output of a
        channels-last op (ATen's convolution and pooling return the memory format of their input). A wrong guess costs a
        copy (``ensure_layout``), never a wrong value."""
        lay = _fake_layout(meta)
        if channels_last and meta.dim() == 4:
            lay = Layout(lay.device, lay.dtype, lay.size, _channels_last_strides(lay.size), lay.offset)
        return lay

    # -- matmul operands with a misaligned leading dimension ----------------------------
    def _matvec_as_reduction(self, target, args, meta) -> Optional[TensorBox]:
        """A one-row CUDA fp16/bf16 ``mm``/``addmm`` ``(1, K) @ (K, N)`` with at least 2^18 weight elements, as a
        generated sum over K in float32, the bias added before the one rounding (as cuBLAS does). A matrix-vector
        product is memory-bound: this reads the weight once, where a product cuBLAS would need padded (N or a leading
        dimension not a multiple of 8) copied all of it every call (GPT-2 decoding's LM head, 1 x 50257: 77 MB a
        token), and an aligned one ran cuBLAS's GEMM kernel plus, for long K, a split-K reduction kernel (a decoding
        step's four matmuls a layer), whose epilogue (bias, GELU, residual add) is now fused into the sum's kernel.
        None when it does not apply."""
        if not _pads_matmuls(meta):
            return None
        bias, (a, b) = (args[0], args[1:3]) if target is torch.ops.aten.addmm.default else (None, args[:2])
        try:
            (m, k), (_, n) = [int(v) for v in a.get_size()], [int(v) for v in b.get_size()]
        except (TypeError, AttributeError):
            return None
        if m != 1 or k * n < (1 << 18):
            return None
        la = self._strided_or_copy(a).make_loader()  # K values, read N times
        lb, f32 = b.make_loader(), torch.float32
        prod = Pointwise(meta.device, f32, lambda i: ops.mul(la([i[0], i[2]]), lb([i[2], i[1]])), [m, n, k])
        lr = L.make_reduction(TensorBox.create(prod), [2], False, "sum", f32).make_loader()
        lbias = L.loader_as(bias, [m, n], f32) if bias is not None else None
        trace.log("matvec_as_reduction", stage="lowering", n=n, k=k, bias=bias is not None)
        return TensorBox.create(Pointwise(meta.device, meta.dtype,
                                          lambda i: ops.add(lr(i), lbias(i)) if lbias else lr(i), [m, n]))

    def _mm_with_padded_operand(self, args, meta) -> Optional[TensorBox]:
        """``a @ b`` on CUDA in fp16/bf16 where ``a``'s leading dimension is not a multiple of 8, computed
        from a zero-padded copy of ``a``'s storage made by a generated kernel and shared by every matmul
        that reads the same tensor (docs/ir.md, "Misaligned matmul operands"); None when the pattern does
        not apply (the wrapper's ``matmul_padded`` then handles it: :func:`_maybe_pad_matmul_output`)."""
        if not _pads_matmuls(meta) or len(args) != 2:
            return None
        a, b = args
        if not (isinstance(a, TensorBox) and isinstance(b, TensorBox)):
            return None
        try:
            (m, k), (_, nn) = [int(v) for v in a.get_size()], [int(v) for v in b.get_size()]
        except TypeError:
            return None
        if nn % 8 != 0 or min(m, k, nn) < 64 or m * k < (1 << 20) or (base := self._strided(a)) is None:
            return None
        s0, s1 = (int(v) for v in base.get_stride())
        if s1 == 1 and s0 == k and k % 8 != 0:  # row-major, misaligned K
            kp = -(-k // 8) * 8
            ap, bp = self._padded_copy(base, k, kp), self._padded_rows(self._strided_or_copy(b), k, kp)
            out = ExternKernel(self.new_buffer_name(), _fake_layout(meta), torch.ops.aten.mm.default, (ap, bp), {})
            self.register_buffer(out)
            trace.log("pad_matmul_operand", stage="lowering", buffer=out.name, m=m, n=nn, k=k,
                      padded="k", operand=ap.get_name())
            return TensorBox(StorageBox(out))
        if s0 == 1 and s1 == m and m % 8 != 0:  # transposed, misaligned M
            # (a linear layer's weight gradient g.t() @ x, x often a view of a value not yet realized; giving up
            # there, matmul_padded made a transposing ATen copy of g.t(): 6.8 ms of XLM-R's step on an H200)
            if (bt := self._strided_or_copy(b)) is None or misaligned_leading_dim(bt.get_stride()):
                return None
            mp = -(-m // 8) * 8
            t = ReinterpretView(base.data, Layout(base.layout.device, base.layout.dtype, [as_expr(k), as_expr(m)],
                                                  [as_expr(m), sympy.Integer(1)], base.layout.offset))
            tp = self._padded_copy(t, m, mp)
            ap = ReinterpretView(tp, Layout(tp.get_device(), tp.get_dtype(), [as_expr(mp), as_expr(k)],
                                            [sympy.Integer(1), as_expr(mp)], sympy.Integer(0)))
            dev, dt = meta.device, meta.dtype
            out = ExternKernel(self.new_buffer_name(),
                               Layout(dev, dt, [as_expr(mp), as_expr(nn)], [as_expr(nn), sympy.Integer(1)]),
                               torch.ops.aten.mm.default, (ap, bt), {})
            self.register_buffer(out)
            trace.log("pad_matmul_operand", stage="lowering", buffer=out.name, m=m, n=nn, k=k,
                      padded="m", operand=tp.get_name())
            return TensorBox(ReinterpretView(out, Layout(dev, dt, [as_expr(m), as_expr(nn)],
                                                         [as_expr(nn), sympy.Integer(1)])))
        return None

    def _strided_or_copy(self, x: TensorBox):
        """``x`` as a realized buffer or strided view (:meth:`_strided`; a view of a value not yet realized: of that
        value realized whole, :meth:`_view_of_base`), else a copy of its elements (:meth:`_materialize`)."""
        return self._strided(x) or (isinstance(x.data, GenericView) and self._view_of_base(x.data, None)) or \
            self._materialize(x, None)

    def _strided(self, x: TensorBox):
        """``x`` as a realized buffer or ReinterpretView (realizing computed values)."""
        d = x.data
        return d if isinstance(d, ReinterpretView) else d.realize() if isinstance(d, StorageBox) else None

    def _padded_copy(self, x, c: int, cp: int) -> Buffer:
        """A contiguous (R, cp) copy of 2-D ``x`` (R, c) with zero columns c..cp, made by a
        generated kernel once per source layout."""
        lay = x.layout
        key = ("pad_cols", x.get_name(), tuple(map(str, lay.size)), tuple(map(str, lay.stride)), str(lay.offset), cp)
        if (hit := self._materialized.get(key)) is not None:
            return hit[1]
        buf = self._padded_rows(x, c, cp, dim=1)
        self._materialized[key] = (None, buf)
        return buf

    def _padded_rows(self, x, k: int, kp: int, dim: int = 0) -> Buffer:
        """A contiguous copy of 2-D ``x`` with dim ``dim`` grown from ``k`` to ``kp``
        (zeros beyond ``k``): rows for ``dim=0``, columns for ``dim=1``."""
        size = [int(v) for v in x.get_size()]
        size[dim] = kp
        load, idt = x.make_loader(), torch.int32

        def inner(index):
            ok = ops.lt(ops.index_expr(index[dim], idt), ops.constant(k, idt))
            return ops.masked(ok, lambda: load(list(index)), 0.0)
        return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), inner, size)).data.realize()

    def format_ir(self) -> str:
        lines = [f"{name}: input {b.get_dtype()} size={b.get_size()} stride={b.get_stride()}"
                 for name, b in self.graph_inputs.items()]
        for b in self.buffers:
            if isinstance(b, ConcatSlice):
                head, _, body = TextPrinter.format(b).partition("\n")
                lines.append(f"{head} view of {b.storage.name} at +{b.view_offset}\n{body}")
            elif isinstance(b, ComputedBuffer):
                lines.append(TextPrinter.format(b))
            elif isinstance(b, ExternKernel):
                lines.append(f"{b.name}: extern {b.op}({', '.join(sorted(b.input_names()))})")
            elif isinstance(b, MultiOutput):
                lines.append(f"{b.name}: {b.parent.name}{''.join(f'[{i}]' for i in b.path)}")
            elif isinstance(b, ConcatBuffer):
                lines.append(f"{b.name}: concatenation of {', '.join(b.get_read_names())} (view of {b.storage.name})")
        return "\n".join(lines)


def _same_size(meta: torch.Tensor, size) -> bool:
    """Whether fake tensor ``meta`` has IR size ``size`` (sizes compared as expressions)."""
    return [as_expr(v) for v in meta.shape] == list(size)


def _dense_strides_like(t: torch.Tensor) -> list[int]:
    """Dense strides for ``t``'s shape with the dims in ``t``'s memory order (largest stride outermost; ties keep dim
    order). An extern op given a tensor laid out in this order picks the output layout fake tracing predicted from
    ``t``: attention fed contiguous (B, H, S, D) copies of q/k/v where eager had (B, S, H, D)-ordered views returned
    another output layout, and every layer paid a copy to fix it up. A broadcast (stride-0) dim sits just outside the
    dims after it, as in a contiguous layout: ranked by its stride it would become the innermost dim, and ATen kernels
    that read the last dim as contiguous without checking (the CPU flash attention of SDPA, fed a K/V expanded over
    heads: Gemma's single KV head) computed garbage. A stride that was a multiple of 8 elements and 16 bytes in ``t``
    stays one (the rows are padded): eager's SDPA pads an attention mask's last dim to 8 elements and slices it, and the
    CUDA kernel rejects a bias realized densely (``attn_bias is not correctly aligned``: HF Swin's training step,
    49 x 49 windows)."""
    def rank(d):
        if t.stride(d) != 0:
            return t.stride(d)
        return max((t.stride(e) * t.shape[e] for e in range(d + 1, t.dim()) if t.stride(e) != 0), default=1)
    order = sorted(range(t.dim()), key=lambda d: (-rank(d), d))
    strides = [0] * t.dim()
    acc, align = 1, max(8, 16 // t.element_size())
    for d in reversed(order):
        s = t.stride(d)
        if isinstance(s, int) and s and s % align == 0 and isinstance(acc, int) and acc > 1 and acc % align:
            acc += align - acc % align   # aligned rows, as in t
        strides[d] = acc
        n = t.shape[d]
        # a symbolic size (>= 2) multiplies as its expression: int() would specialize it
        acc = acc * (max(int(n), 1) if isinstance(n, int) else as_expr(n))
    return strides


def _strides_agree(size, a, b, symbolic: bool) -> bool:
    """Whether strides ``a`` and ``b`` of a tensor of ``size`` agree on every dim not of size 1. Symbolic strides
    (dynamic shapes) agree if their expressions are equal; a value neither int nor size gives ``symbolic``."""
    try:
        # (sizes compared as expressions: ``s == 1`` on an unbacked SymInt guards on data)
        return all(as_expr(s) == 1 or as_expr(x) == as_expr(y)
                   or sympy.expand(as_expr(x) - as_expr(y)) == 0 for s, x, y in zip(size, a, b))
    except (TypeError, ValueError):
        return symbolic


def _empty_eager(node: torch.fx.Node, memo: dict) -> Optional[torch.Tensor]:
    """Zero-element ``node`` as eager computes it: its ATen op run (free) on empty tensors that have the strides eager
    gives its inputs, so a zero-element graph output gets eager's strides, which fake tensors do not always give
    (``x.t().contiguous() + 1`` of a (0, 17) ``x``: eager (1, 17), fake (1, 1), since fake's elementwise rule takes
    every empty tensor as contiguous; user report 4). A graph input, a small tensor with elements (zeros: a 0-d scale,
    a broadcast (17, 1) operand), a random op, or an op that fails on empty tensors stands for itself with its fake
    strides. None when ``node`` is not a tensor of at most 4096 elements with static sizes."""
    if node in memo:
        return memo[node]
    memo[node] = None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or any(not isinstance(v, int) for v in [*val.shape, *val.stride()]) \
            or val.numel() > 4096:
        return None
    out = None
    with unset_fake_temporarily(), torch.no_grad():
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and val.numel() == 0 \
                and torch.Tag.nondeterministic_seeded not in node.target.tags:
            ins = {a: _empty_eager(a, memo) for a in node.all_input_nodes}
            if all(t is not None for t in ins.values()):
                try:
                    out = node.target(*torch.fx.node.map_arg(node.args, ins.__getitem__),
                                      **torch.fx.node.map_arg(node.kwargs, ins.__getitem__))
                except Exception:  # an op that needs more than empty tensors
                    out = None
        if not isinstance(out, torch.Tensor) or list(out.shape) != list(val.shape) or out.dtype != val.dtype:
            try:
                out = torch.empty_strided(tuple(val.shape), val.stride(), dtype=val.dtype, device=val.device).zero_()
            except Exception:  # e.g. a device this process cannot allocate on
                out = None
    memo[node] = out
    return out


def _same_strides(layout: Layout, t: torch.Tensor) -> bool:
    """Whether ``layout`` has ``t``'s strides (size-1 dims ignored; symbolic strides are compared as expressions)."""
    return _strides_agree(t.shape, layout.stride, t.stride(), True)


def _dense_non_overlapping(t: torch.Tensor) -> bool:
    # an undecidable (unbacked) size counts as not 1, an undecidable stride as another: both only say "not dense" (safe)
    pairs = sorted((st, s) for s, st in zip(t.shape, t.stride()) if guard_or_true(s != 1))
    expect = 1
    for st, s in pairs:
        if guard_or_true(st != expect):
            return False
        expect *= s
    return True
