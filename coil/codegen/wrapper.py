"""The generated Python wrapper: one function per graph that allocates, launches, frees.

``WrapperCodegen(graph, steps, kernels).generate()`` returns (source, globals): straight-line code that
allocates kernel outputs with ``empty_strided``, calls kernels and extern kernels, releases each buffer
after its last reader and reuses freed buffers of the same size, stride, dtype and device (``buf7 = buf2
# reuse``). With ``boxed=True`` it also defines ``call_boxed(args)``, which empties its input list and
releases each input after its last reader. docs/codegen.md, "Wrapper"."""
from __future__ import annotations

import bisect
import itertools
import math
from typing import Optional, Any

import sympy
import torch
from torch.utils._sympy.printers import PythonPrinter
from torch.utils._sympy.symbol import SymT, symbol_is_type

from coil.ir.nodes import (Buffer, ComputedBuffer, ConcatBuffer, ConcatSlice, ConcatStorage, ExternKernel, Layout,
                           MultiOutput, ReinterpretView, ScatterBuffer, describe_origin)
from coil.capture.substitutes import OPAQUE_IMPLS
from coil.ir.graph import misaligned_leading_dim
from coil.ir.symbols import PRECOMPUTED, as_expr, bare_symbol, is_size_symbol, precomputed_symbol_of, product, pyexpr
from coil.schedule.scheduler import FusedGroup, buffer_bytes
from coil.codegen.common import layout_key


def reinterpret(t: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    """``t`` viewed with ``size``/``stride`` at ``offset`` elements past its start."""
    return t.as_strided(size, stride, t.storage_offset() + offset)


#: ATen's alias of a tensor without dispatch (``(t, size, stride, offset increment)``), where torch has it
_FAST_VIEW = getattr(torch._C._dynamo.guards, "_reinterpret_tensor", None)


#: extern ops whose output ATen always allocates contiguous (structured kernels: the meta function sets the strides,
#: so fake and real tensors agree): their ``ensure_layout`` (about 0.5 µs of host time a call) is left out
_CONTIGUOUS_OUT = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
                             torch.ops.aten.baddbmm.default})


def ensure_layout(t: torch.Tensor, size, stride, dtype=None) -> torch.Tensor:
    """``t`` if its strides are ``stride`` (ignoring size-1 dims), else a copy that has
    them: extern kernels may pick another output layout than fake tensors predicted.

    ``t`` may be None: CUDA attention kernels return undefined tensors (None in Python) for outputs whose fake version
    is an empty tensor (e.g. a debug mask); those are never read, so None passes through. ``dtype`` (an output of a
    multi-output op): converted to it where the kernel returned another than its meta kernel said (user report 58)."""
    if t is None:
        return t
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    st = t.stride()
    if st == stride or all(a == b or n == 1 for a, b, n in zip(st, stride, size)):  # (first: one tuple comparison)
        return t
    out = dst = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    for d in [d for d, (n, s) in enumerate(zip(size, stride)) if s == 0 and n > 1]:  # an expanded layout (its value
        t, dst = t.narrow(d, 0, 1), dst.narrow(d, 0, 1)  # equal along d): copy_ refuses to write it (view_as_complex
    dst.copy_(t)                                             # of an expand, where the kernel got a contiguous copy)
    return out


def check_size(t, size, op: str) -> None:
    """Raise where data-dependent op ``op`` returned a tensor ``t`` of another size than ``size`` (or a number ``t``
    other than ``size``: ``.item()``), the one the graph relied on (``x.nonzero() + y`` assumed the count equals
    ``len(y)``: eager broadcasts or raises there; torch.compile raises too)."""
    if (got := tuple(t.shape) if isinstance(t, torch.Tensor) else t) != size:
        raise RuntimeError(f"coil: runtime assertion failed: {op} returned {got}, the compiled graph assumed {size} "
                           "(broadcasting or a torch._check decided it while tracing)")


def empty_row_padded(size, row_stride: int, device, dtype) -> torch.Tensor:
    """An uninitialized (M, N) tensor whose rows start ``row_stride >= N`` elements apart,
    backed by a full (M, row_stride) allocation (so the padding columns exist)."""
    m, n = size
    return torch.empty((m, row_stride), device=device, dtype=dtype)[:, :n]


def aligned_copy(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A (rows, cols) copy of 2-D ``x`` (at most that large; zeros beyond its rows and columns) whose BLAS leading
    dimension is a multiple of 8 elements, in ``x``'s own order: column-major when ``x`` is (a transposed operand),
    else row-major, so that the copy reads and writes memory in order. (Copied row-major, XLM-R's transposed output
    gradient, 250002 x 4096 bf16, took 6.8 ms on an H200.)"""
    r, c = x.shape
    if x.stride(0) == 1 and x.stride(1) != 1:  # column-major
        dst = torch.empty((cols, -(-rows // 8) * 8), device=x.device, dtype=x.dtype)[:, :rows].t()
    else:
        dst = torch.empty((rows, -(-cols // 8) * 8), device=x.device, dtype=x.dtype)[:, :cols]
    dst[:r, :c].copy_(x)
    if rows > r:
        dst[r:].zero_()
    if cols > c:
        dst[:r, c:].zero_()
    return dst


def matmul_padded(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
    """``out = a @ b (+ bias)`` with every operand cuBLAS sees 16-byte aligned.

    ``a`` is (M, K), ``b`` (K, N), ``bias`` (N,), (1, N), (1,) or (); ``out`` is (M, N), either contiguous or from
    :func:`empty_row_padded` (row stride ``P > N``). When K or N is not a multiple of 8 (16-bit dtypes),
    ``a``/``b``/``bias`` are copied into zero-padded buffers (K up to ``Kp``, N up to ``P``) and the product is written
    into the whole (M, P) allocation. When only N is unaligned and both operands' leading dimensions are aligned,
    nothing is copied: the first ``N - N % 8`` columns and the last few are two products written into ``out``'s padded
    rows (GPT-2's LM head: a 77 MB weight copy per call saved; an ``align1`` GEMM takes ~3 ms at M = 4096). Not with
    a bias when M > K: ATen's addmm into a non-contiguous ``out`` first fills it with the broadcast bias, a pass over
    (M, N) that costs more than copying the (K, N) weight (XLM-R's LM head, 4096 x 768 @ 768 x 250002: 1.65 ms on an
    H200), while into the whole contiguous (M, P) allocation cuBLASLt adds the bias in its epilogue."""
    m, n = out.shape
    k = a.shape[1]
    p = out.stride(0) if n > 1 else n
    kp = -(-k // 8) * 8
    if p != n and kp == k and (bias is None or m <= k) and \
            not (misaligned_leading_dim(a.stride()) or misaligned_leading_dim(b.stride())):
        n8 = n - n % 8
        bias = bias.reshape(-1).expand(n) if bias is not None else None
        for lo, hi in ((0, n8), (n8, n)):
            if bias is None:
                torch.mm(a, b[:, lo:hi], out=out[:, lo:hi])
            else:
                torch.addmm(bias[lo:hi], a, b[:, lo:hi], out=out[:, lo:hi])
        return
    full = out.as_strided((m, p), (p, 1)) if p != n else out
    ap = aligned_copy(a, m, kp) if kp != k or misaligned_leading_dim(a.stride()) else a
    bt = aligned_copy(b, kp, p) if kp != k or p != n or misaligned_leading_dim(b.stride()) else b
    if bias is None:
        torch.mm(ap, bt, out=full)
    else:
        biasp = torch.zeros((p,), device=bias.device, dtype=bias.dtype)
        biasp[:n].copy_(bias.reshape(-1).expand(n))  # bias is (N,), (1, N), (1,) or ()
        torch.addmm(biasp, ap, bt, out=full)


def _alias_roots(buffers) -> dict:
    """Buffer name -> names of the buffers whose storage it shares, for the outputs of
    extern ops whose schema returns an alias of an argument (and their MultiOutputs)."""
    roots: dict = {}
    for b in buffers:
        schema = getattr(b.parent.op if isinstance(b, MultiOutput) else getattr(b, "op", None), "_schema", None)
        if schema is None or not any(r.alias_info is not None for r in schema.returns):
            continue
        src = b.parent if isinstance(b, MultiOutput) else b
        names = [n for n in src.input_names()]
        roots[b.get_name()] = list(dict.fromkeys(names + [r for n in names for r in roots.get(n, ())]))
    for b in buffers:  # concatenations and their inputs are views of their storage
        if isinstance(b, (ConcatSlice, ConcatBuffer)):
            roots[b.get_name()] = [b.storage.get_name()]
    return roots


def _free_size_symbols(x, out: set) -> None:
    """Add ``x``'s size symbols (sympy exprs, nested lists/tuples/dicts, IR views, laid-out buffers) to ``out``."""
    if isinstance(x, sympy.Basic):
        out.update(s for s in x.free_symbols if is_size_symbol(s))
    elif isinstance(x, (list, tuple)):
        for v in x:
            _free_size_symbols(v, out)
    elif isinstance(x, dict):
        _free_size_symbols(list(x.values()), out)
    elif isinstance(getattr(x, "layout", None), Layout):
        _free_size_symbols([x.layout.size, x.layout.stride, x.layout.offset], out)


def symbol_bindings(graph, needed: set, sources: Optional[dict] = None) -> list[str]:
    """Wrapper lines binding every size symbol in ``needed`` from the call's arguments, once per call: a SymInt
    placeholder that is the symbol (``s0 = arg0``), else a size, stride or storage offset of a tensor input that is
    exactly the symbol (``s1 = primals_3.size(1)``), or the number a 0-d tensor input holds (``zf0 = arg1.item()``, for
    a precomputed size made from a dynamic float). Raises NotImplementedError for a symbol no input defines alone (the
    "coil" backend then falls back, logged)."""
    sources = _symbol_sources(graph) if sources is None else sources
    # after what they read; one an input passes whole (a backward's ``int(k * 10)``) is bound from it instead
    late = sorted((s for s in needed if s in PRECOMPUTED and s not in sources), key=lambda s: s.name)
    needed = (set(needed) - set(late)).union(*(PRECOMPUTED[s].free_symbols for s in late))
    if missing := sorted(str(s) for s in needed if s not in sources):
        raise NotImplementedError(f"coil wrapper: size symbols {missing} are not a size, stride "
                                  "or SymInt input of this graph")
    return [f"    {s.name} = {sources[s]}" for s in sorted(needed, key=lambda s: s.name)] + [
        f"    {s.name} = {PythonPrinter().doprint(PRECOMPUTED[s])}" for s in late]


def _precomputed_after(sym, bound: set) -> list[str]:
    """Lines computing precomputed sizes made from data-dependent symbol ``sym`` just bound (``ps0 = math.trunc(zuf2)``
    for ``zeros(int(t.item()))``), added to ``bound``: not computable with the bindings at call start."""
    lines = []
    for s, e in list(PRECOMPUTED.items()):
        if sym in e.free_symbols and s not in bound and e.free_symbols <= bound:
            lines.append(f"    {s.name} = {PythonPrinter().doprint(e)}")
            bound.add(s)
    return lines


def _bound_late(s) -> bool:
    """Whether size symbol ``s`` is bound mid-call: a data-dependent number (``u0``, ``zuf0``) or a precomputed size
    made from one (``ps0 = math.trunc(zuf2)``), so no expression of it can be computed at the call's start."""
    return symbol_is_type(s, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT)) or \
        (s in PRECOMPUTED and any(_bound_late(v) for v in PRECOMPUTED[s].free_symbols))


def _symbol_sources(graph) -> dict:
    """Symbol -> the expression over the call's arguments that is exactly it (see :func:`symbol_bindings`)."""
    sources: dict = {}
    for name, value in zip(graph.placeholder_names, graph.example_inputs):
        if isinstance(value, torch.SymInt) and (s := bare_symbol(as_expr(value))) is not None:
            sources.setdefault(s, name)
        elif isinstance(value, torch.SymInt) and (ps := precomputed_symbol_of(as_expr(value))) is not None:
            # a precomputed size passed in whole: a backward reading the forward's ``int(k * 10)``, whose float
            # symbol no input of the backward defines
            sources.setdefault(ps, name)
    for n in graph.gm.graph.find_nodes(op="call_function", target=torch.ops.aten._local_scalar_dense.default):
        # a 0-d tensor input holding a dynamic number (a float's ``zf0``) that a size is made from
        v, src = n.meta.get("val"), n.args[0]
        if isinstance(v, (torch.SymInt, torch.SymFloat)) and v.node.expr.is_Symbol and src.op == "placeholder":
            sources.setdefault(v.node.expr, f"{src.name}.item()")
    for name in graph.placeholder_names:
        if (b := graph.graph_inputs.get(name)) is None:
            continue
        for d, e in enumerate(b.layout.size):
            if (s := bare_symbol(e)) is not None:
                sources.setdefault(s, f"{name}.size({d})")
            elif e.is_Add and len(e.free_symbols) == 1:
                # ``2*u1 + 1`` (a backward's tangent of a ``zeros(2 * t.item() + 1)`` output): u1 from the size
                # (solved without substituting s = 0: a backward's ``FloorDiv(8, s) + 1`` of ``x[::s]`` divides by it)
                s = next(iter(e.free_symbols))
                if (a := e.coeff(s)).is_Integer and a != 0 and (c := sympy.expand(e - a * s)).is_Integer:
                    sources.setdefault(s, f"(({name}.size({d}) - {c}) // {a})")
        for d, e in enumerate(b.layout.stride):
            if (s := bare_symbol(e)) is not None:
                sources.setdefault(s, f"{name}.stride({d})")
    for name, value in zip(graph.placeholder_names, graph.example_inputs):
        # an input's storage offset: AOT lays a written input's value out at it for an as_strided read (s315 #543)
        if isinstance(value, torch.Tensor) and isinstance(off := value.storage_offset(), torch.SymInt) \
                and (s := bare_symbol(as_expr(off))) is not None:
            sources.setdefault(s, f"{name}.storage_offset()")
    return sources


class WrapperCodegen:
    """Build the wrapper source for scheduled steps (see module docstring)."""

    @staticmethod
    def _bind_unbacked(value: str, layout, bound: set) -> list:
        """Lines binding the data-dependent (unbacked) sizes of an extern kernel's output ``value`` (``u1 =
        buf2.size(0)`` after ``nonzero``), the first time one appears, before anything that uses them."""
        out = []
        for d, e in enumerate(getattr(layout, "size", None) or ()):
            if isinstance(e, sympy.Symbol) and symbol_is_type(e, SymT.UNBACKED_INT) and e not in bound:
                bound.add(e)
                out.append(f"    {e.name} = {value}.size({d})")
        return out

    def __init__(self, graph, steps: list, kernels: dict, boxed: bool = False, reuse: bool = True):
        self.graph, self.steps, self.kernels, self.boxed, self.reuse = graph, steps, kernels, boxed, reuse
        self.globals: dict[str, Any] = {"torch": torch, "math": math, "empty_strided": torch.empty_strided,
                                        "reinterpret": reinterpret, "ensure_layout": ensure_layout,
                                        "check_size": check_size, "empty_row_padded": empty_row_padded,
                                        "matmul_padded": matmul_padded}
        self._alloc: list = []  # (_empty)
        self._view: list = []  # (_reinterpret)
        self.lines: list[str] = []
        self._extern_ids: dict[Any, str] = {}
        self._hoisted: dict[str, str] = {}  # size expression text -> its local (_expr)
        self._shaped: dict[str, Layout] = {}  # buffer name -> the view layout it is allocated in (_view_shaped)

    def _expr(self, e) -> str:
        """The text of size ``e`` (int or sympy). A compound expression (``s0 * s1``) is a local computed once per call
        after the symbol bindings (launches, allocations and views reuse a few products; each recomputed costs host time
        per call), except one reading a data-dependent size, which is bound later in the call."""
        if isinstance(e, int):
            return str(e)
        e = sympy.sympify(e)
        if e.is_Symbol or e.is_number or any(_bound_late(s) for s in e.free_symbols):
            return pyexpr(e)
        return self._hoisted.setdefault(pyexpr(e), f"_sz{len(self._hoisted)}")

    def _check_size(self, value: str, expected: str, op) -> str:
        return f"    check_size({value}, {expected}, {str(op)!r})"

    def _tuple(self, xs) -> str:
        items = [self._expr(x) for x in xs]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    def _reinterpret(self, name: str, size, stride, offset, internal: bool = True) -> str:
        """A view of ``name``. One the wrapper only passes to kernels (not a graph output: those keep ``as_strided``'s
        view tracking) is ATen's alias without dispatch (as Inductor's; ~0.5 µs less a view on a CPU host) unless a
        dispatch mode is on, decided once per call."""
        fn = "view_of" if internal and _FAST_VIEW is not None else "reinterpret"
        if fn == "view_of" and not self._view:
            self.globals.update(fast_view=_FAST_VIEW, modes=torch._C._len_torch_dispatch_stack)
            self._view = ["    view_of = fast_view if not modes() else reinterpret"]
        return f"{fn}({name}, {self._tuple(size)}, {self._tuple(stride)}, {self._expr(offset)})"

    def _empty(self, b) -> str:
        # the first device's buffers: ATen's allocation without argument parsing and dispatch (as Inductor's; ~1.8 µs
        # less a buffer on a CPU host) unless a dispatch mode, deterministic fill or another current CUDA device is on
        l = self._shaped.get(b.get_name(), b.layout)
        d, cur = l.device, getattr(torch._C, "_cuda_getDevice", None)
        fast = getattr(torch._C._dynamo.guards, f"_empty_strided_{d.type}", None) if d.type in ("cpu", "cuda") else None
        if not self._alloc and fast is not None and (d.type == "cpu" or cur is not None):
            self.globals.update(fast_empty=fast, det=torch._C._get_deterministic_algorithms, cur=cur,
                                modes=torch._C._len_torch_dispatch_stack, slow_empty=lambda size, stride, dtype:
                                torch.empty_strided(size, stride, dtype=dtype, device=d))
            on = f" and cur() == {d.index}" if d.type == "cuda" else ""
            self._alloc = [d, f"    empty_strided = fast_empty if not (det() or modes()){on} else slow_empty"]
        if self._alloc[:1] == [d]:  # (the local empty_strided: other devices call torch's)
            return f"    {b.name} = empty_strided({self._tuple(l.size)}, {self._tuple(l.stride)}, {l.dtype})"
        return (f"    {b.name} = torch.empty_strided({self._tuple(l.size)}, {self._tuple(l.stride)}, "
                f"device={self._dev(l.device)}, dtype={l.dtype})")

    def _global(self, prefix: str, value) -> str:
        if (key := (prefix, id(value))) not in self._extern_ids:
            self._extern_ids[key] = name = f"{prefix}{len(self._extern_ids)}"
            self.globals[name] = value
        return self._extern_ids[key]

    def _dev(self, device: torch.device) -> str:
        name = f"dev_{device.type}{device.index if device.index is not None else ''}"
        self.globals[name] = device
        return name

    def _on_kernel_device(self, plan, name: str) -> str:
        """The argument expression of buffer ``name`` for the kernel of ``plan``: a CPU buffer that a GPU kernel reads
        (a 0-d CPU tensor beside CUDA tensors, which eager takes as a scalar: DeBERTa's
        ``torch.sqrt(torch.tensor(d) * scale)``) is copied to the kernel's device at each launch, since a GPU kernel
        cannot dereference host memory. Graphs that read CPU tensors are not recorded as CUDA graphs
        (runtime/cudagraph_record.py), so the copy is never captured."""
        kdev, dev = plan.buffer(plan.nodes[0].name).get_device(), plan.buffer(name).get_device()
        if kdev is None or dev is None or kdev.type == "cpu" or dev.type != "cpu":
            return name
        return f"{name}.to({self._dev(kdev)}, non_blocking=True)"

    def _arg(self, a) -> str:
        if isinstance(a, ReinterpretView):
            if (own := self._shaped.get(a.data.get_name())) is not None and layout_key(own) == layout_key(a.layout):
                return a.data.get_name()  # allocated in this view's layout (_view_shaped)
            return self._reinterpret(a.data.get_name(), a.layout.size, a.layout.stride, a.layout.offset)
        if isinstance(a, Buffer):
            return a.get_name()
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(self._arg(x) for x in a) + "]"
        if isinstance(a, torch.dtype):
            return str(a)
        if isinstance(a, torch.device):
            return self._dev(a)
        if isinstance(a, (torch.memory_format, torch.layout)):
            return self._global("c", a)
        if isinstance(a, sympy.Basic) and not a.is_number:
            return self._expr(a)  # a symbolic size: its value this call
        if isinstance(a, sympy.Integer):  # a size that is static here (an ATen Scalar takes no sympy number)
            a = int(a)
        if isinstance(a, float) and (a != a or a in (float("inf"), float("-inf"))):
            return f"float('{a}')"
        return repr(a) if isinstance(a, (int, float, bool, str, type(None))) else self._global("c", a)

    def _view_shaped(self, excluded: set) -> dict:
        """Buffer name -> the layout to allocate it in, for a contiguous ComputedBuffer that extern kernels read only
        through one contiguous reshape of it (a linear layer's ``(B*S, D)`` view of a ``(B, S, D)`` activation): the
        memory is the same, our kernels take only its pointer, so allocated in the view's shape it is passed to the
        externs as it is, without a view a call (about 1.5 µs of host time each on an H100 host). Buffers in
        ``excluded`` (outputs, stored in place, scatter targets) and those an extern reads directly keep theirs."""
        views: dict = {}
        direct: set = set()

        def visit(a):
            if isinstance(a, ReinterpretView):
                views.setdefault(a.data.get_name(), []).append(a.layout)
            elif isinstance(a, Buffer):
                direct.add(a.get_name())
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)
        for st in self.steps:
            if isinstance(b := getattr(st, "buffer", None), ExternKernel):
                visit([b.args, list(b.kwargs.values())])
        out = {}
        for name, lays in views.items():
            buf = self.graph.name_to_buffer.get(name)
            if type(buf) is not ComputedBuffer or name in direct or name in excluded or not buf.layout.is_contiguous():
                continue
            fits = [l for l in lays if l.is_contiguous() and l.dtype == buf.layout.dtype
                    and sympy.expand(product(l.size) - product(buf.layout.size)) == 0]
            if fits:
                keys = [layout_key(l) for l in fits]
                out[name] = fits[max(range(len(fits)), key=keys.count)]
        return out

    def _live_bytes(self, allocs: list, last_use: dict, out_names: set, inplace: dict) -> tuple[list[int], dict]:
        """(bytes of intermediate buffers live during each step if every buffer were freed after its last reader, bytes
        per buffer name), from the sizes' hints. The pool (:meth:`generate`) keeps a dead buffer for a later allocation
        of its layout only while that does not raise this timeline's peak: held across the steps between, it would stay
        allocated while they allocate afresh (timm Swin-T, bf16, batch 2: a planned peak of 19.6 MB against 13.8)."""
        delta, nbytes = [0] * (len(self.steps) + 1), {}
        for i, s in enumerate(self.steps):
            ext = getattr(s, "buffer", None)
            for b in allocs[i] + ([ext] if isinstance(ext, ExternKernel) and ext.layout is not None else []):
                if isinstance(b, (ConcatSlice, ScatterBuffer)):
                    continue  # (views of a storage counted once)
                nbytes[b.get_name()] = n = buffer_bytes(b, {})
                end = len(self.steps) - 1 if b.get_name() in out_names else last_use.get(b.get_name(), i)
                delta[i + (b.get_name() in inplace)] += n  # (stored over its dead input at step i)
                delta[end + 1] -= n
        return list(itertools.accumulate(delta[:-1])), nbytes

    def generate(self) -> tuple[str, dict]:
        g = self.graph
        out_names = {o.name for o in g.outputs if o.name is not None}
        allocs: list[list[Buffer]] = []  # allocations and reads per step
        reads: list[list[str]] = []
        concats: set = set()  # allocated before the first of their slices
        for s in self.steps:
            if isinstance(s, FusedGroup):
                k = self.kernels[id(s)]
                bs = []
                for n in k.plan.output_names:
                    b = g.name_to_buffer[n]
                    if isinstance(b, ConcatSlice) and b.storage.name not in concats:
                        concats.add(b.storage.name)
                        bs.append(b.storage)
                    bs.append(b)
                allocs.append(bs)
                reads.append(list(k.plan.input_names))
            else:
                allocs.append([])
                reads.append(s.read_names())
        # an extern op returning a view of an argument (aten.view.dtype, view_as_real): the argument's storage lives
        # while the view does, so a read of the view is a read of the argument, and an output view keeps it out of reuse
        roots = _alias_roots(g.buffers)
        reads = [rs + [r for n in rs for r in roots.get(n, ())] for rs in reads]
        out_names |= {r for n in list(out_names) for r in roots.get(n, ())}
        last_use: dict[str, int] = {n: i for i, rs in enumerate(reads) for n in rs}
        scatter_targets = {b.target.get_name() for b in g.buffers if isinstance(b, ScatterBuffer)}
        for i, bs in enumerate(allocs):  # read only by the kernel that writes it (a C++ softmax's exp): freed after it
            for b in bs:
                if type(b) is ComputedBuffer and b.get_name() not in scatter_targets \
                        and last_use.setdefault(b.get_name(), i) == i:
                    reads[i].append(b.get_name())
        # outputs stored over a dead input (KernelPlan.inplace): the input's storage is the output's from then on
        inplace = {o: n for k in self.kernels.values() for o, n in getattr(k.plan, "inplace", {}).items()}
        handed = set(inplace.values())
        self._shaped = self._view_shaped(out_names | scatter_targets | handed | set(inplace))

        def key(b: Buffer):  # (the layout allocated: a freed buffer's tensor keeps its shape)
            return layout_key(self._shaped.get(b.get_name(), b.layout))
        # the steps that allocate each layout from the pool: a freed buffer is kept for reuse only while the pool
        # holds fewer of its layout than later steps will take (more would stay alive to the end, unused)
        alloc_steps: dict = {}
        for i, bs in enumerate(allocs):
            for b in bs:
                if b.get_name() not in inplace and not isinstance(b, ConcatSlice):
                    alloc_steps.setdefault(key(b), []).append(i)
        pool: dict[tuple, list[str]] = {}
        live, nbytes = self._live_bytes(allocs, last_use, out_names, inplace)
        cap = max(live, default=0)
        ours: set[str] = set()
        bound_late: set = set()  # unbacked sizes bound from extern outputs (_bind_unbacked)
        params = ", ".join(g.placeholder_names)
        inputs = set(g.graph_inputs) - out_names  # tensors
        input_dels: list = []  # (line index, input name): where call_boxed releases it
        L = self.lines
        L.append(f"def call({params}):")
        self.globals.update(g.constants)
        if g.seed_count:
            self.globals["randint"] = torch.randint
            L.append(f"    seeds = randint({2 ** 31 - 1}, ({g.seed_count},), device={self._dev(g.device)}, "
                     f"dtype=torch.int64)")
        for i, s in enumerate(self.steps):
            for b in allocs[i]:
                k = key(b)
                if isinstance(b, ScatterBuffer):
                    L.append(f"    {b.name} = {b.target.get_name()}  # scatter into its target")
                    ours.add(b.name)
                    continue
                if isinstance(b, ConcatSlice):
                    lay = b.layout
                    L.append(f"    {b.name} = {self._reinterpret(b.storage.name, lay.size, lay.stride, b.view_offset)}"
                             f"  # slice of {b.storage.name}")
                    ours.add(b.name)
                    continue
                if b.name in inplace:
                    L.append(f"    {b.name} = {inplace[b.name]}  # in place")
                elif pool.get(k):  # (the old name is dropped: bound, it would hold the buffer to the return)
                    L.append(f"    {b.name} = {(old := pool[k].pop())}  # reuse\n    del {old}")
                else:
                    L.append(self._empty(b))
                ours.add(b.name)
            if isinstance(s, FusedGroup):
                k = self.kernels[id(s)]
                if not (isinstance(k.plan.numel, int) and k.plan.numel == 0):
                    kname = self._global("k", k.generated.launcher)
                    if entry := getattr(k.generated.launcher, "wrapper_entry", None):
                        kname += f".{entry}"  # the launch itself, without the launcher's __call__ frame
                    args = [self._on_kernel_device(k.plan, n) for n in k.generated.arg_names]
                    args += [self._expr(e) for e in k.generated.size_args]
                    L.append(f"    {kname}({', '.join(args)})  # {k.generated.name}")
            else:
                b = s.buffer
                if isinstance(b, ExternKernel):
                    padded = getattr(b, "padded_matmul", False)
                    # an OpOverload's __call__ only forwards to its C++ ``_op``: bind that directly (one Python frame
                    # less per extern call) (coil's opaque ops: their Python implementation, no dispatch)
                    op = self._global("extern", OPAQUE_IMPLS.get(b.op) or getattr(b.op, "_op", b.op)
                                      if isinstance(b.op, torch._ops.OpOverload) else b.op)
                    args = [self._arg(a) for a in b.args]
                    args += [f"{k_}={self._arg(v)}" for k_, v in b.kwargs.items()]
                    if padded:  # mm/addmm into a row-padded buffer (ir/graph.py)
                        l = b.layout
                        if getattr(b, "padded_output", False):
                            L.append(f"    {b.name} = empty_row_padded({self._tuple(l.size)}, "
                                     f"{self._expr(l.stride[0])}, device={self._dev(l.device)}, dtype={l.dtype})")
                        else:
                            L.append(self._empty(b))
                        mm_args = args[1:] + [args[0]] if len(args) == 3 else args
                        L.append(f"    matmul_padded({b.name}, {', '.join(mm_args)})  # {b.op}, padded")
                    else:
                        where = describe_origin(getattr(b, "origin", None))
                        L.append(f"    {b.name} = {op}({', '.join(args)})  # {b.op}"
                                 + (f" (from {where})" if where and "\n" not in where else ""))
                    L += self._bind_unbacked(b.name, b.layout, bound_late)
                    if torch.Tag.dynamic_output_shape in getattr(b.op, "tags", ()) and b.layout is not None:
                        L.append(self._check_size(b.name, self._tuple(b.layout.size), b.op))
                    if getattr(b, "expects", None) is not None:
                        L.append(self._check_size(b.name, self._expr(b.expects), b.op))
                    if getattr(b, "binds", None) is not None:  # u2 = t.item()
                        L.append(f"    {b.binds.name} = {b.name}")
                        bound_late.add(b.binds)
                        L += _precomputed_after(b.binds, bound_late)
                    if b.layout is not None and not (b.op in _CONTIGUOUS_OUT and b.layout.is_contiguous()):
                        L.append(f"    {b.name} = ensure_layout({b.name}, {self._tuple(b.layout.size)}, "
                                 f"{self._tuple(b.layout.stride)})")
                elif isinstance(b, ConcatBuffer):
                    L.append(f"    {b.name} = {self._reinterpret(b.storage.name, b.layout.size, b.layout.stride, 0)}"
                             f"  # concatenation of {', '.join(b.get_read_names())}")
                elif isinstance(b, MultiOutput):
                    part = f"{b.parent.name}{''.join(f'[{i}]' for i in b.path)}"
                    L += self._bind_unbacked(part, b.layout, bound_late)
                    if torch.Tag.dynamic_output_shape in getattr(b.parent.op, "tags", ()):
                        L.append(self._check_size(part, self._tuple(b.layout.size), b.parent.op))
                    L.append(f"    {b.name} = ensure_layout({part}, {self._tuple(b.layout.size)}, "
                             f"{self._tuple(b.layout.stride)}, {b.layout.dtype})")
                ours.add(b.name)
            for n in dict.fromkeys(reads[i]):
                if last_use.get(n) == i and n in ours and n not in out_names:
                    b = g.name_to_buffer.get(n)
                    pooled = isinstance(b, (ComputedBuffer, ConcatStorage)) and not isinstance(b, ConcatSlice)
                    lk = key(b) if pooled else None
                    steps = alloc_steps.get(lk, ())
                    nxt = bisect.bisect_right(steps, i) + len(pool.get(lk, ()))  # the allocation that would take it
                    held = live[i + 1:steps[nxt]] if nxt < len(steps) else []  # the steps it would be kept across
                    if self.reuse and lk is not None and nxt < len(steps) and n not in scatter_targets \
                            and n not in handed and max(held, default=0) + nbytes.get(n, 0) <= cap:
                        live[i + 1:steps[nxt]] = [v + nbytes.get(n, 0) for v in held]
                        pool.setdefault(lk, []).append(n)
                    else:
                        L.append(f"    del {n}")
                elif last_use.get(n) == i and n in inputs:
                    input_dels.append((len(L), n))
        outs = [o.name if o.kind == "buffer" else self._reinterpret(o.name, o.size, o.stride, o.offset, internal=False)
                if o.kind == "view" else self._arg(o.value) for o in g.outputs]
        L.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        needed: set = set()
        _free_size_symbols([list(g.buffers)] + [[o.size, o.stride, o.offset, o.value] for o in g.outputs]
                           + [[b.view_offset, b.storage] for b in g.buffers if isinstance(b, ConcatSlice)], needed)
        for k in self.kernels.values():
            _free_size_symbols(k.generated.size_args, needed)
        for b in g.buffers:
            if isinstance(b, ExternKernel):
                _free_size_symbols([b.args, b.kwargs], needed)
        # int arguments made symbolic (``n`` in ``x * n``, ``topk(k)``) are not sizes (they
        # may be <= 0, so not positive) but extern ops and outputs read them: bind them too
        if (ints := {as_expr(v) for v in g.example_inputs if isinstance(v, torch.SymInt) and as_expr(v).is_Symbol}):
            leaves = [o.value for o in g.outputs] + [x for b in g.buffers if isinstance(b, ExternKernel)
                                                     for x in torch.utils._pytree.tree_leaves([b.args, b.kwargs])]
            needed |= {s for x in leaves if isinstance(x, sympy.Basic) for s in x.free_symbols} & ints
        # an unbacked size an input also has (a backward's tangent of a nonzero-sized output) is
        # bound from that input up front: it may be read before the extern whose output has it
        sources = _symbol_sources(g)
        needed -= bound_late - set(sources)
        head = symbol_bindings(g, needed, sources) if needed else []
        head += [f"    {name} = {text}" for text, name in self._hoisted.items()] + self._alloc[1:] + self._view
        L[1:1] = head  # dynamic shapes: bind the symbols once per call, before any use
        if self.boxed:
            L += self._boxed(L[len(head) + 1:], head, input_dels, inputs - set(last_use))
        return "\n".join(L) + "\n", self.globals

    def _boxed(self, body: list, head: list, dels: list, unread: set) -> list:
        """``call_boxed(args)``: ``call``'s ``body`` (after its def line and the symbol bindings ``head``) with each
        tensor input released after its last reader (``dels``); tensor inputs never read are released first."""
        names = self.graph.placeholder_names
        out = ["", "def call_boxed(args):"]
        if names:
            out.append(f"    {', '.join(names)}{',' if len(names) == 1 else ''} = args")
        out.append("    args.clear()")
        out += head + [f"    del {n}" for n in names if n in unread]
        at: dict = {}
        for i, n in dels:  # i: len(L) after the reader's lines, L[0] the def line
            at.setdefault(i - 2, []).append(n)
        for i, line in enumerate(body):
            out.append(line)
            out += [f"    del {n}" for n in at.get(i, ())]
        return out
