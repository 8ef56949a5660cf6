"""Dynamic shapes in capture: which sizes are symbolic, the marks users put on
tensors, where specializations come from, and the shape guards.

Sizes are symbols of the frame's ``ShapeEnv``, owned by the :class:`~coil.capture.output.OutputGraph`'s FakeTensorMode.
A dim is symbolic when marked (:func:`mark_dynamic`), under ``dynamic=True``, or, by default, when the frame was
compiled before with another size there (``FrameCache.auto_dynamic``); sizes 0 and 1 stay static. After the backend
compiled the graph, :func:`shape_guards` asks the ShapeEnv for the relations the graph relied on, as Python over the
frame's sources. docs/dynamic_shapes.md, "Choosing what is symbolic" and "Shape guards"."""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
from typing import Any, Optional

import sympy
import torch
from torch._guards import GuardSource, Source as _TorchSource
from torch.fx.experimental.symbolic_shapes import (DimDynamic, StatelessSymbolicContext, free_symbols,
                                                   free_unbacked_symbols)
from torch.utils._sympy.printers import PythonPrinter
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from coil import trace
from coil.exc import Unsupported, UserError
from coil.capture.source import LocalSource, Source
from coil.capture.variables.symbolic import SymNodeVariable

# --- marks (stored on the tensor object, like torch's own marks) --------------------------

_DYN, _STATIC, _UNBACKED = "_coil_dynamic_dims", "_coil_static_dims", "_coil_unbacked_dims"


def _dims(t: torch.Tensor, dim) -> list:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    out = []
    for d in dims:
        if not isinstance(d, int) or not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"dim {d!r} out of range for a {t.dim()}-d tensor")
        out.append(d % t.dim())
    return out


def _marks(t: torch.Tensor) -> dict:
    """``{dim: (min, max)}`` of ``t``'s dims marked dynamic: by :func:`mark_dynamic`, or by torch's
    ``torch._dynamo.mark_dynamic`` / ``maybe_mark_dynamic`` (a program written for torch.compile)."""
    marks = {d: (None, None) for d in getattr(t, "_dynamo_weak_dynamic_indices", ())}
    marks.update({r.dim: (r.min, r.max) for r in getattr(t, "_dynamo_dynamic_range", ())})
    marks.update({d: marks.get(d, (None, None)) for d in getattr(t, "_dynamo_dynamic_indices", ())})
    marks.update(getattr(t, _DYN, {}))
    return marks


def mark_dynamic(t: torch.Tensor, dim, min: Optional[int] = None, max: Optional[int] = None):
    """Compile ``t``'s dimension(s) ``dim`` with a symbolic size from the first call.

    ``min``/``max`` bound the size: a call with a size outside raises :class:`coil.exc.UserError`, and so does a program
    that forces the dim to a constant. Sizes 0 and 1 still compile their own entries."""
    for d in _dims(t, dim):
        if min is not None and max is not None and min > max:
            raise ValueError(f"mark_dynamic: min={min} > max={max}")
        getattr(t, _STATIC, set()).discard(d)
        setattr(t, _DYN, {**getattr(t, _DYN, {}), d: (min, max)})
    return t


def mark_static(t: torch.Tensor, dim):
    """Keep ``t``'s dimension(s) ``dim`` static (never symbolic, even under ``dynamic=True`` or after a size change)."""
    for d in _dims(t, dim):
        setattr(t, _DYN, {k: v for k, v in getattr(t, _DYN, {}).items() if k != d})
        setattr(t, _STATIC, set(getattr(t, _STATIC, set())) | {d})
    return t


def mark_unbacked(t: torch.Tensor, dim):
    """Compile ``t``'s dimension(s) ``dim`` as a symbol with no 0/1 specialization (sizes
    0 and 1 share the entry). Branching on such a size raises."""
    for d in _dims(t, dim):
        setattr(t, _UNBACKED, set(getattr(t, _UNBACKED, set())) | {d})
    return t


# --- sources as the ShapeEnv sees them ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShapeSource(_TorchSource):
    """A coil source expression as a ``torch._guards.Source`` (the ShapeEnv names
    symbols after sources: ``x.size()[0]``)."""
    text: str

    @property
    def _name_template(self) -> str:
        return self.text

    @property
    def guard_source(self) -> GuardSource:
        return GuardSource.LOCAL


def source_name(src) -> str:
    """The Python text of a torch ``Source`` (``name`` is a property in recent torch, a method in older ones)."""
    n = src.name
    return n() if callable(n) else n


# --- which dims are symbolic --------------------------------------------------------------


class DynamicPolicy:
    """Decides the symbolic dims of one translation's inputs (see module docstring).

    ``mode`` is ``coil.compile``'s ``dynamic``; ``auto`` maps a source expression to the
    dims that changed size between calls (automatic dynamic)."""

    def __init__(self, mode: Optional[bool], auto: Optional[dict] = None):
        self.mode, self.auto = mode, auto or {}
        self.marked: dict = {}      # symbol -> (source expr, dim, (min, max))
        self.logged: set = set()
        self.scalars: dict = {}     # source expr -> int/float value read (automatic dynamic)

    def scalar_input(self, tx, value, source):
        """The tracker for a Python int/float read from ``source`` when it is a graph
        input (a symbol of the ShapeEnv), else None (a guarded constant).

        Symbolic when the source's value changed between calls (``automatic``) or, under ``dynamic=True``, for the
        frame's own arguments (:func:`symbolic_input`)."""
        expr = source.expr()
        self.scalars[expr] = value
        if type(value) not in (int, float) or value != value or value in (math.inf, -math.inf):
            return None  # NaN and inf stay guarded constants (a symbol's graph assumes finite)
        if type(value) is float and value == 0.0:
            # a float zero stays a constant too, guarded with its sign: a symbol's hint is a sympy Float, which has
            # no -0.0 (math.copysign(1.0, p) of p = -0.0 read +0.0 and guarded p == 0, which -0.0 passes)
            return None
        if not ("value" in self.auto.get(expr, ()) and self.mode is not False) and not (
                self.mode is True and isinstance(source, LocalSource)):
            return None
        if type(value) is int:   # a SymInt input is an int64: a bigger int stays a constant (torch raises on it)
            if not -2**63 <= value < 2**63:
                return None
            tx.output.guards.add(f"-2**63 <= {expr} < 2**63", expr, "an int64", src=expr)
        sym, node = symbolic_input(tx.output, value, expr, source)
        if type(value) is float:
            tx.output.scalar_floats.append((expr, sym))
        trace.log("dynamic_scalar", stage="capture", source=expr, type=type(value).__name__,
                  reason="automatic" if self.mode is None else "dynamic=True")
        return SymNodeVariable(tx.output, sym, ("node", node))

    def dims_for(self, expr: str, t: torch.Tensor, is_param: bool) -> dict:
        """``{dim: reason}`` of ``t``'s symbolic dims, read from source ``expr``."""
        static = set(getattr(t, _STATIC, ())) | set(getattr(t, "_dynamo_static_indices", ()))
        out = {d: "marked" for d in _marks(t) if d < t.dim()}
        unbacked = set(getattr(t, _UNBACKED, ())) | set(getattr(t, "_dynamo_unbacked_indices", ()))
        out.update({d: "unbacked" for d in unbacked if d < t.dim()})
        if self.mode is True and not is_param:
            for d in range(t.dim()):
                out.setdefault(d, "dynamic=True")
        if self.mode is not False:   # (a buffer's size that changed: automatic under dynamic=True too)
            for d in self.auto.get(expr, ()):
                if isinstance(d, int) and d < t.dim():     # ("value": a number's change)
                    out.setdefault(d, "automatic")
        for d in static:
            out.pop(d, None)
        return out

    def fake_input(self, fake_mode, expr: str, value: torch.Tensor, is_param: bool, loc):
        """The FakeTensor for input ``value`` (symbolic in the dims :meth:`dims_for` picks), after checking
        ``mark_dynamic`` ranges (:class:`UserError` naming the dim and the call)."""
        if _is_wrapper(value) or not (dyn := self.dims_for(expr, value, is_param)):
            return fake_mode.from_tensor(value, static_shapes=True)
        marks = _marks(value)
        for d, (lo, hi) in marks.items():
            n = value.shape[d]
            if (lo is not None and n < lo) or (hi is not None and n > hi):
                raise UserError(f"size {n} of dim {d} of {expr} is outside the range [{lo if lo is not None else 0}, "
                                f"{hi if hi is not None else 'inf'}] given to mark_dynamic", loc,
                                hint=f"pass a tensor whose dim {d} is in range, or widen the range in "
                                     f"coil.mark_dynamic({expr}, {d}, min=..., max=...)")
        unbacked = getattr(DimDynamic, "UNBACKED", None) or getattr(DimDynamic, "SIZE_LIKE_UNBACKED")
        kinds = [DimDynamic.STATIC if d not in dyn else unbacked if dyn[d] == "unbacked" else DimDynamic.DYNAMIC
                 for d in range(value.dim())]
        # strides follow from the sizes where the input is contiguous (INFER_STRIDE)
        ctx = StatelessSymbolicContext(dynamic_sizes=kinds, dynamic_strides=[DimDynamic.INFER_STRIDE] * value.dim())
        fake = fake_mode.from_tensor(value, symbolic_context=ctx, source=ShapeSource(expr))
        env = fake_mode.shape_env
        for d, reason in dyn.items():
            sym = _symbol(fake.shape[d])
            if (expr, d) not in self.logged:
                self.logged.add((expr, d))
                trace.log("dynamic_dim", stage="capture", source=expr, dim=d, reason=reason, size=int(value.shape[d]),
                          symbol=str(sym) if sym is not None else None, specialized=sym is None)
            if sym is None:
                continue
            if d in marks:
                lo, hi = marks[d]
                if lo is not None or hi is not None:
                    env.constrain_symbol_range(sym, max(lo if lo is not None else 2, 2),
                                               hi if hi is not None else env.var_to_range[sym].upper)
                if d in getattr(value, _DYN, {}) or d in getattr(value, "_dynamo_dynamic_indices", ()):
                    self.marked[sym] = (expr, d, marks[d])      # (not maybe_mark_dynamic's: it may specialize)
        return fake


def _is_wrapper(t) -> bool:
    """Non-Parameter/Buffer tensor subclass: faked with static sizes (its ``__torch_dispatch__`` may refuse SymInts)."""
    return type(t) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(t, torch.nn.parameter.Buffer)


def _symbol(s):
    """The sympy symbol of a SymInt that is a bare symbol, else None."""
    e = s.node.expr if isinstance(s, torch.SymInt) else None
    return e if isinstance(e, sympy.Symbol) else None


def changed_dims(old_shapes: dict, values: dict) -> dict:
    """Automatic dynamic: ``{source expr: {dims}}`` of tensor inputs whose sizes differ from the ones a cache entry was
    compiled for (same rank only). ``values`` maps a source expression to this call's value (missing: unreadable)."""
    out: dict = {}
    for expr, shape in old_shapes.items():
        if isinstance(v := values.get(expr), torch.Tensor) and v.dim() == len(shape):
            if dims := {i for i, (a, b) in enumerate(zip(shape, v.shape)) if a != b}:
                out[expr] = dims
    return out


# --- where a guard came from --------------------------------------------------------------


class SiteRecorder:
    """Remembers the user location that added each ShapeEnv guard (the line of the op or
    Python expression that was being traced), for specialization messages."""

    def __init__(self):
        self.sites: list = []       # (guard index, "file:line")
        self.specializations: list = []
        self.drawn: set = set()     # symbols of values drawn from Python's random (random_draw)
        self.draw_at: dict = {}     # drawn symbol -> (root frame offset, user stack) of its draw

    def note(self, env, start: int, where: str, reason: Optional[str] = None) -> None:
        """Attribute the ShapeEnv guards added since index ``start`` to user line ``where``; log each
        (``specialization`` when it pins a symbol to a value, else ``shape_guard``) with ``reason``. A guard on a
        value drawn from ``random`` is a graph break instead (Python decides there, for each value)."""
        for i in range(start, len(env.guards)):
            self.sites.append((i, where))
            expr = env.guards[i].expr
            if self.drawn & expr.free_symbols:
                raise Unsupported(f"{reason}, over a value drawn from Python's random ({expr}: a guard on it "
                                  "would recompile for each value)", hint="Python decides it at a graph break")
            if (pinned := _pinned_symbol(expr)) is not None:
                self.specializations.append((pinned, str(expr), where))
                trace.log("specialization", stage="capture", symbol=str(pinned[0]),
                          value=pinned[1], guard=str(expr), user_line=where, reason=reason)
            else:
                trace.log("shape_guard", stage="capture", guard=str(expr), user_line=where, reason=reason)


def _pinned_symbol(expr):
    """``(symbol, value)`` when guard ``expr`` is ``Eq(symbol, integer)``."""
    for a, b in (expr.args, expr.args[::-1]) if isinstance(expr, sympy.Eq) else ():
        if isinstance(a, sympy.Symbol) and isinstance(b, sympy.Integer):
            return a, int(b)
    return None


def check_marked(env, policy: DynamicPolicy, sites: SiteRecorder) -> None:
    """Raise :class:`UserError` when the program forced a ``mark_dynamic`` dim to a
    constant (naming the dim, the user line and what to do)."""
    for sym, (expr, d, _rng) in policy.marked.items():
        rep, vr = env.replacements.get(sym), env.var_to_range.get(sym)
        if not (isinstance(rep, sympy.Integer) or vr is not None and vr.is_singleton()):
            continue
        value = int(rep if isinstance(rep, sympy.Integer) else vr.lower)
        first_site = dict(reversed(sites.sites))  # guard index -> the first site recorded for it
        where = next((w for (s, _g, w) in sites.specializations if s[0] == sym), None) or next(
            (w for i, g in enumerate(env.guards) if sym in g.expr.free_symbols and (w := first_site.get(i))), None)
        raise UserError(
            f"dim {d} of {expr} was marked dynamic (coil.mark_dynamic), but the program forces it to the constant "
            f"{value}" + (f" at {where}" if where else ""),
            hint=f"remove the mark (coil.mark_dynamic({expr}, {d})) or change the code at "
                 f"that line so the size is not required to be {value}")


# --- shape guards -------------------------------------------------------------------------


_LOCAL = re.compile(r"___z\d+")


def shape_guards(env, inputs: list, contiguous: set = frozenset(), at_call: Optional[dict] = None) -> tuple:
    """The ShapeEnv's guards over ``inputs`` (``[(source expr, fake)]``: tensors with symbolic sizes or strides, SymInt
    scalars) as ``(prelude, exprs, names, checks)`` (``contiguous``: sources whose tensor check asks
    ``is_contiguous()``): ``prelude`` reads each size the guards use into a local (``___z0 = x.size()[0]``), ``exprs``
    are Python conditions over those locals, ``names`` maps a local back to its source text (for recompile messages);
    ``checks``: lines that raise where a dim marked unbacked breaks a fact the graph relied on (eager may broadcast it;
    torch.compile raises too), which the frame's entry runs on every call. ``at_call``: id(fake) -> (sizes, strides)
    as the capture made them (SymInts), for inputs whose metadata the program changed in place (``x.t_()``): their
    fakes got these back as ints where a symbol was pinned to a constant, so only this names the constant's dim."""
    if not inputs:
        return [], [], {}, []
    prelude: list = []
    names: dict = {}
    by_text: dict = {}

    def ref(src) -> str:
        return ref_text(source_name(src))

    def ref_text(text: str) -> str:
        if (name := by_text.get(text)) is None:
            name = by_text[text] = f"___z{len(by_text)}"
            prelude.append(f"{name} = {text}")
            names[name] = text
        return name
    # a view input's fake views a fake of its base, whose sizes are symbols of their own (``x._base.size()[0]``); a
    # guard over the storage names them (``x.squeeze_(1)`` checks its bounds): then the base is an input here too, else
    # no source holds them (produce_guards raised "sources must not be empty" or not, by the hash order of a set)
    if views := [(t, f) for t, f in inputs if isinstance(f, torch.Tensor) and f._is_view()]:
        need = {s for g in env.guards for s in env.simplify(g.expr).free_symbols} - free_symbols([f for _, f in inputs])
        inputs = inputs + [(f"{t}._base", f._base) for t, f in views if free_symbols(f._base) & need]
    ranks = {text: fake.dim() for text, fake in inputs if isinstance(fake, torch.Tensor)}
    fakes = [f for _, f in inputs]
    helpers = env.produce_guards_verbose(fakes, [ShapeSource(e) for e, _ in inputs], source_ref=ref, langs=("python",))
    exprs = list(helpers[0].exprs)
    # sizes the program pinned to a constant (``range(x.size(0))``): the ShapeEnv leaves
    # static values to the caller (``ignore_static``); a symbolic dim's is checked here
    # (of a dim marked unbacked, a runtime assert instead: no guard reads its size)
    asserts: list = []
    for text, fake in inputs:
        if not isinstance(fake, torch.Tensor):
            continue
        size, stride = (at_call or {}).get(id(fake), (fake.shape, fake.stride()))
        for kind, vals in (("size", size), ("stride", stride)):
            for i, v in enumerate(vals):
                if isinstance(v, torch.SymInt) and getattr(c := env.simplify(v.node.expr), "is_number", False):
                    (asserts if free_unbacked_symbols(v.node._expr) else exprs).append(
                        f"{ref_text(f'{text}.{kind}()[{i}]')} == {int(c)}")
    # facts the program asserted about sizes of dims marked unbacked (``torch._check``, a view's inferred -1 dividing
    # them): the ShapeEnv defers them to runtime, and no graph node reads an input's size to check them there
    syms = {v.node.expr: f"{text}.size()[{i}]" for text, fake in inputs if isinstance(fake, torch.Tensor)
            for i, v in enumerate(fake.shape) if isinstance(v, torch.SymInt) and v.node.expr.is_symbol}
    for ra in (ra for ras in env.deferred_runtime_asserts.values() for ra in ras):
        if ra.expr.free_symbols <= syms.keys() and bound_sympy(ra.expr, env.var_to_range).lower is not sympy.true:
            asserts.append(PythonPrinter().doprint(ra.expr.xreplace(
                {s: sympy.Symbol(ref_text(syms[s])) for s in ra.expr.free_symbols})))
    # a symbolic float is finite (inf stays a constant: scalar_input); sympy drops `a != inf`
    exprs += [f"math.isfinite({ref_text(t)})" for t, f in inputs if isinstance(f, torch.SymFloat)]
    # a storage offset's 0/1 bound only: graphs never read offsets, so an input that is
    # a slice at offset 0 and one at offset 24 share the entry
    exprs = [e for e in exprs
             if not (re.fullmatch(r"2 <= ___z\d+", e) and names[e.split()[-1]].endswith(".storage_offset()"))]
    # a stride symbol of a contiguous input equals the product of the later sizes: the
    # tensor check's is_contiguous() (sizes >= 2) already says so
    exprs = [e for e in exprs if not _implied_by_contiguity(e, names, contiguous)]
    used = set(_LOCAL.findall(" ".join(exprs)))      # sizes no guard reads are not read
    checks = _unpacked_prelude(set(_LOCAL.findall(" ".join(asserts))), names, ranks) + [
        f"if not ({e}): raise RuntimeError({'coil: runtime assertion failed: ' + readable(e, names)!r} "
        "'; the compiled graph assumed it of a dim marked unbacked (broadcasting or a torch._check "
        "decided it), as torch.compile does')" for e in asserts]
    return _unpacked_prelude(used, names, ranks), exprs, names, checks


_PROP = re.compile(r"^(.*)\.(size|stride)\(\)\[(\d+)\]$")


def _implied_by_contiguity(expr: str, names: dict, contiguous: set) -> bool:
    if (m := re.fullmatch(r"(___z\d+) == (___z\d+)|2 <= (___z\d+)", expr)) is None:
        return False
    return any((p := _PROP.match(names[local])) and p.group(2) == "stride" and p.group(1) in contiguous
               for local in filter(None, m.groups()))


def _unpacked_prelude(used: set, names: dict, ranks: dict) -> list:
    """Lines reading the used sizes: one ``a, _, b = x.shape`` per tensor (one Size object
    instead of one ``x.size()[i]`` call per dim), other sources one by one."""
    groups: dict = {}
    lines = []
    for local in sorted(used, key=lambda n: int(n[4:])):
        if (p := _PROP.match(names[local])) is None:
            lines.append(f"{local} = {names[local]}")
            continue
        groups.setdefault((p.group(1), p.group(2)), {})[int(p.group(3))] = local
    for (base, kind), dims in groups.items():
        if (rank := ranks.get(base)) is None or kind == "stride" and len(dims) == 1:
            lines += [f"{loc} = {base}.{kind}()[{d}]" for d, loc in dims.items()]
            continue
        targets = ", ".join(dims.get(d, "_") for d in range(rank))
        read = f"{base}.shape" if kind == "size" else f"{base}.stride()"
        lines.append(f"{targets}{',' if rank == 1 else ''} = {read}")
    return lines


def readable(expr: str, names: dict) -> str:
    """A shape guard with its locals replaced by the source text they read."""
    return _LOCAL.sub(lambda m: names.get(m.group(0), m.group(0)), expr)


def is_symbolic_value(v: Any) -> bool:
    """Does a fake tensor (sizes, strides, offset) or scalar hold a symbol?"""
    if isinstance(v, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset()))
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def symbolic_input(out, value, text: str, source=None) -> tuple:
    """A graph input for the Python int/float the entry reads as ``text`` (``source``: its coil source), a new symbol
    of the ShapeEnv: an int is a SymInt placeholder, a float a 0-d float64 tensor input read with ``.item()`` (its
    fake's ``item_memo`` is the SymFloat: coil/aot/scalars.py), as in torch's capture. Returns (symbol, node)."""
    env, src = out.shape_env, ShapeSource(text)
    s = env.create_unspecified_symbol(value, src, dynamic_dim=DimDynamic.DYNAMIC)
    node = out._placeholder(text)
    if type(value) is int:
        sym = env.create_symintnode(s, hint=value, source=src)
        out.inputs.append((source or SymbolSource(text), value, node))
    else:
        sym = env.create_symfloatnode(s, hint=value, source=src)
        with torch.inference_mode(False):  # a fake of an inference tensor keeps no item_memo
            real = torch.tensor(value, dtype=torch.float64)
        node.meta["example_value"] = fake = out.fake_mode.from_tensor(real, static_shapes=True)
        fake.item_memo = sym
        out.guards.ns["___scalar_tensor"] = functools.partial(torch.tensor, dtype=torch.float64)
        out.inputs.append((ScalarTensorSource(text), real, node))
        node = out.graph.create_node("call_method", "item", (node,), {})
    node.meta["example_value"] = sym
    return sym, node


#: ``random.Random`` methods the entry draws from (:func:`random_draw`); others (``seed``, ``shuffle``) are breaks
RANDOM_DRAWS = frozenset(("random", "uniform", "triangular", "gauss", "normalvariate", "lognormvariate",
                          "expovariate", "vonmisesvariate", "gammavariate", "betavariate", "paretovariate",
                          "weibullvariate", "randint", "randrange", "getrandbits"))


def random_draw(tx, method: str, rng, name: str, args: list, kwargs: dict) -> SymNodeVariable:
    """``rng.<name>(*args)`` of a ``random.Random`` (``random.uniform(0, 1)``: the module's), read as ``method``: the
    entry draws it before the graph, in program order, into a new symbol, a graph input that nothing may guard on
    (control flow on it is a break: :class:`SiteRecorder`). The trace reads the value from a copy of ``rng``."""
    out = tx.output
    try:
        if not all(v.is_python_constant() for v in [*args, *kwargs.values()]):
            raise TypeError("arguments that are not constants")
        a = tuple(v.as_python_constant() for v in args)
        kw = {k: v.as_python_constant() for k, v in kwargs.items()}
        value = getattr(copy.copy(rng), name)(*a, **kw)
    except Exception as e:  # noqa: BLE001 - eager calls it at the break (and raises there)
        raise Unsupported(f"random.{name} ({type(e).__name__}: {e})", hint="it runs outside the graph") from None
    text = f"___rnd{len(out.draws)}"
    out.draws.append((method, a, kw))
    sym, node = symbolic_input(out, value, text)
    out.sites.drawn.add(sym.node.expr)
    out.sites.draw_at[sym.node.expr] = tx.root_site()
    if not kw and (name == "random" and not a or name in ("uniform", "randint") and len(a) == 2 and a[0] <= a[1]):
        # its range decides ``p < 0.0`` (LayerDrop off) with no guard (uniform may round up past b)
        lo, hi = a or (0.0, 1.0)
        out.shape_env.var_to_range[sym.node.expr] = ValueRanges(sympy.sympify(lo), sympy.oo if name == "uniform"
                                                                else sympy.sympify(hi))
    trace.log("random_draw", stage="capture", call=f"{method}{a}", input=text, user_line=out.where())
    return SymNodeVariable(out, sym, ("node", node))


@dataclasses.dataclass(frozen=True)
class SymbolSource(Source):
    """The entry's expression for a SymInt graph input (``x.size()[0]``): a coil source."""
    text: str
    template = "{text}"


@dataclasses.dataclass(frozen=True)
class ScalarTensorSource(Source):
    """The entry's 0-d float64 tensor for a symbolic Python float read from ``text``."""
    text: str
    template = "___scalar_tensor({text})"


__all__ = ["mark_dynamic", "mark_static", "mark_unbacked", "DynamicPolicy", "ShapeSource",
           "shape_guards", "changed_dims", "check_marked", "SiteRecorder"]
