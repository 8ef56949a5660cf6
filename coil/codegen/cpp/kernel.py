"""The C++ ops handler and kernel assembler: one C++ function per fused group.

``CppKernel(plan, name).source()`` runs every planned node's define-by-run body with this module's handler installed.
Each op appends one C++ statement ``T tmpN = ...;`` to the current *block* and returns a :class:`CppVar` (CSE per
scope). Index expressions are recorded as tokens and printed at the end, once :mod:`coil.codegen.cpp.indexing` has
chosen how to split ``xindex``/``rindex`` into nested loops without per-element division. Pointwise kernels are an
OpenMP-parallel outer loop with an ``omp simd`` inner loop; reductions keep ``LANES`` partial accumulators combined in a
fixed order (deterministic for any thread count). Index arithmetic is ``int64_t``; fp16/bf16 are computed in float;
indirect indices are bounds-checked (``coil_ind_checked``; the launcher raises ``IndexError``). docs/cpp_backend.md
draws each kernel shape."""
from __future__ import annotations

import itertools
import math
import re
from typing import Any, Optional

import sympy
import torch

from coil import trace
from coil.exc import refuse_fallback
from coil.codegen.cpp import ops as cops
from coil.codegen.cpp.indexing import Split, _quo, canonicalize, cexpr, split_plan
from coil.ir.nodes import current_origin, describe_origin
from coil.ir.symbols import RINDEX, XINDEX, as_size, hint, is_static, simplify_index
from coil.ir.virtualized import OpsHandler
from coil.schedule.indexing import axis_steps

SUM_BLOCK = 1024  # elements per blocked-sum partial (see _section)
X_LANES_BLOCK = 32  # rows per block partial of an outer sum (see _reduction_x_lanes)
_DECL = re.compile(r"^([A-Za-z_][\w:<>]*) ([A-Za-z_]\w*) = ([^;]*);$")  # one declared value (see _outer_sum)
_STORE = re.compile(r"^p_\w+\[[^;]*\] = [^;]*;$")  # one plain store
LANES = 8
PARALLEL_MIN = 32768  # elements of work before a kernel uses OpenMP threads


class CppVar:
    """A C++ variable holding an op's value of compute dtype ``dtype`` (``rounded``: to fp16/bf16)."""

    __slots__ = ("name", "dtype", "rounded")

    def __init__(self, name: str, dtype: torch.dtype):
        self.name, self.dtype, self.rounded = name, dtype, None

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"CppVar({self.name}, {self.dtype})"


class _Section:
    """One loop over rindex inside the x loop."""

    def __init__(self, loop_id):
        self.loop_id = loop_id
        self.body: list[str] = []
        self.pre: list[str] = []  # loop-invariant statements, hoisted before the loop
        self.post: list[str] = []
        self.accs: list[tuple[str, str, list]] = []  # (name, reduction_type, fields)
        self.cse: dict = {}
        self.r_store = False  # a store contiguous along r (see _reduction_x_lanes)


def _c(e) -> str:
    """A loop bound in C++: an int literal, or a size expression over the function's size arguments."""
    return str(e) if isinstance(e, int) else cexpr(sympy.sympify(e))


def _cp(e) -> str:
    """:func:`_c` parenthesized unless it is one literal or symbol (a divisor or modulus:
    ``xo / (4 * s50)``; printed bare, C++ divides by 4 and multiplies by s50)."""
    t = _c(e)
    return t if isinstance(e, int) or sympy.sympify(e).is_Atom else f"({t})"


def _cast(x: "CppVar", dtype: torch.dtype) -> str:
    """C++ conversion of ``x`` to ``dtype``; float to int through ``coil_ftoi`` (defined for
    NaN and out-of-range values, as eager's x86 kernels give them)."""
    ints = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
    f = "coil_ftoi" if x.dtype.is_floating_point and dtype in ints else "static_cast"
    return f"{f}<{cops.ctype(dtype)}>({x})"


#: C++ conversions between a 16-bit float's storage and its float compute value
_TO_FLOAT = {torch.bfloat16: "coil_bf16_to_float", torch.float16: "coil_f16_to_float"}
_FROM_FLOAT = {torch.bfloat16: "coil_float_to_bf16", torch.float16: "coil_float_to_f16"}


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _float_literal(v: float, dtype: torch.dtype) -> str:
    ct = cops.compute_ctype(dtype)
    if math.isnan(v):
        return f"coil_lim<{ct}>::nan()"
    if math.isinf(v):
        return f"{'-' if v < 0 else ''}coil_lim<{ct}>::inf()"
    if "e" not in (s := repr(float(v))) and "." not in s:
        s += ".0"
    return s + ("f" if ct == "float" else "")


class CppKernel(OpsHandler):
    """Generate the C++ source of one fused group (see module docstring)."""

    def __init__(self, plan, name: str, num_threads: int = 1):
        self.plan, self.name, self.num_threads = plan, name, num_threads
        # ints, or size expressions (dynamic shapes: the symbols are function arguments)
        self.numel = as_size(plan.numel)
        self.rnumel = as_size(plan.rnumel)
        self.is_reduction = self.rnumel != 1
        self.bounds = {XINDEX: self.numel, RINDEX: max(self.rnumel, 1) if isinstance(self.rnumel, int) else self.rnumel}
        sizes = getattr(plan, "size_symbols", None)  # (test plans may not have it)
        self.size_symbols = list(sizes()) if sizes is not None else []
        self.counter = itertools.count()
        self.indices, self.index_of = [], {}
        self.items: list = []  # str lines (per x) and _Section objects
        self.cur: list[str] = self.items  # where statements go
        self.section: Optional[_Section] = None
        self.outer_cse: dict = {}
        self.scopes: list[dict] = [self.outer_cse]
        self.has_checks = False
        self.no_if_convert = False  # see _section
        self.check_sites = 0
        #: per check site: the user's line behind it (``nodes.describe_origin``) or None
        self.check_origins: list[Optional[str]] = []
        self.removed = set(getattr(plan, "removed_names", ()) or ())
        self.read, self.written = [], []
        self.needs_rindex = False
        self.rdep: set[str] = {"rindex", "r0"}
        self.const_val: dict[str, Any] = {}  # variables known to hold a constant
        self.locals: set[str] = set()  # variables assigned by raw statements (never hoisted)
        self.index_vars: dict[str, int] = {}  # integer index_expr variable -> its index's id
        #: comparison of two index/constant operands -> (operand, operand, op); see _segments
        self.range_masks: dict[str, tuple] = {}
        self.x_contiguous_loads = self.r_contiguous_loads = 0  # see _outer_sum

    # ------------------------------------------------------------------ plumbing
    def _new(self, prefix: str = "tmp") -> str:
        return f"{prefix}{next(self.counter)}"

    def _lookup(self, key):
        return next((scope[key] for scope in reversed(self.scopes) if key in scope), None)

    def _emit(self, expr: str, dtype: torch.dtype, key=None) -> CppVar:
        key = expr if key is None else key
        if (hit := self._lookup(key)) is not None:
            return hit
        var = CppVar(self._new(), dtype)
        line = f"{cops.compute_ctype(dtype)} {var.name} = {expr};"
        if (sec := self.section) is not None and self.cur is sec.body:
            if self._depends_on_r(expr):
                self.rdep.add(var.name)
            else:  # loop-invariant: compute once per x, before the section's loop
                sec.pre.append(line)
                self.outer_cse[key] = var
                return var
        self.cur.append(line)
        self.scopes[-1][key] = var
        return var

    def _depends_on_r(self, expr: str) -> bool:
        for m in re.finditer(r"@I(\d+)@", expr):
            e = self.indices[int(m.group(1))]
            if e.has(RINDEX) or any(s.name in self.rdep for s in e.free_symbols):
                return True
        return any(w in self.rdep for w in re.findall(r"[A-Za-z_]\w*", expr))

    def _mark_local(self, name: str) -> None:
        """A variable a raw statement defines: in a section body, treat as loop-dependent (never hoist what uses it)."""
        self.locals.add(name)
        if self.section is not None:
            self.rdep.add(name)

    def _idx(self, expr) -> str:
        # canonical at record time: CSE keys and the loop-invariance test (``has(RINDEX)``)
        # must see ``(128*xindex + rindex) // 128`` as ``xindex``
        if (expr := simplify_index(sympy.sympify(expr), self.bounds)) not in self.index_of:
            self.index_of[expr] = len(self.indices)
            self.indices.append(expr)
        if expr.has(RINDEX):
            self.needs_rindex = True
        return f"@I{self.index_of[expr]}@"

    def _val(self, v, dtype=None) -> CppVar:
        if isinstance(v, CppVar):
            return v
        if isinstance(v, bool):
            return self.constant(v, torch.bool)
        if isinstance(v, int):
            return self.constant(v, dtype if dtype is not None and not dtype.is_floating_point else torch.int64)
        if isinstance(v, float):
            return self.constant(v, dtype if dtype is not None and dtype.is_floating_point else torch.float32)
        if isinstance(v, sympy.Basic):
            return self.index_expr(v, torch.int64)
        raise NotImplementedError(f"C++ backend: unexpected value {v!r}")

    def _arg(self, name: str, write: bool) -> str:
        name = getattr(self.plan, "inplace", {}).get(name, name)   # stored over an input: its pointer
        lst = self.written if write else self.read
        if name not in lst:
            lst.append(name)
        return f"p_{name}"

    # ------------------------------------------------------------------ memory
    def _key_index(self, index) -> sympy.Expr:
        """``index`` simplified with the kernel's loop bounds, so a load written as
        ``(rindex + 128*xindex) // 128`` finds the value stored at ``xindex``."""
        return simplify_index(sympy.sympify(index), self.bounds)

    def _empty(self, name) -> bool:
        """A buffer with a size-0 dim: code reaches it only through an index whose check failed (reported; the access
        itself would fault: a gather from an empty tensor, fuzz_calls s100 #33), so it reads 0 and writes nothing."""
        return any(n == 0 for n in getattr(self.plan.buffer(name), "get_size", tuple)())

    def load(self, name, index):
        index = self._key_index(index)
        if (cached := self._lookup(("store", name, index))) is not None:
            return cached
        if name in self.removed:
            raise NotImplementedError(f"C++ backend: load of removed buffer {name} not served "
                                      "by an earlier store in the same loop")
        dtype = self.plan.buffer(name).get_dtype()
        if self._empty(name):
            return self.constant(0, dtype)
        ptr = self._arg(name, write=False)
        if self.is_reduction and (steps := axis_steps(index)) is not None:
            self.x_contiguous_loads += steps[0] == 1 and abs(steps[1]) > 1
            self.r_contiguous_loads += steps[1] == 1
        raw = f"{ptr}[{self._idx(index)}]"
        if dtype in _TO_FLOAT:
            raw = f"{_TO_FLOAT[dtype]}({raw})"
        return self._emit(raw, _compute_dtype(dtype), key=("load", name, sympy.sympify(index)))

    def _convert_store(self, dtype, value: CppVar) -> str:
        if dtype in _FROM_FLOAT:
            return f"{_FROM_FLOAT[dtype]}({value})"
        if dtype == torch.bool:
            return f"({value} != 0)" if value.dtype != torch.bool else value.name
        return value.name if value.dtype == dtype else _cast(value, dtype)

    def store(self, name, index, value, mode=None):
        buf_dtype = self.plan.buffer(name).get_dtype()
        value = self._val(value, _compute_dtype(buf_dtype))
        index = self._key_index(index)
        if mode is None:
            self.scopes[-1][("store", name, index)] = value
        if name in self.removed or self._empty(name):
            return
        target = f"{self._arg(name, write=True)}[{self._idx(index)}]"
        if mode in ("atomic_add", "add"):
            if buf_dtype in (torch.float16, torch.bfloat16):
                # no 16-bit float atomics: read-add-round-write under a critical section
                up = _TO_FLOAT[buf_dtype]
                self.cur.append("#pragma omp critical(coil_atomic16)")
                self.cur.append(f"{{ {target} = {self._convert_store(buf_dtype, CppVar(f'({up}({target}) + {value})', torch.float32))}; }}")
            else:
                self.cur += ["#pragma omp atomic", f"{target} += {self._convert_store(buf_dtype, value)};"]
        elif mode is None:
            self.cur.append(f"{target} = {self._convert_store(buf_dtype, value)};")
            if self.section is not None and (steps := axis_steps(index)) is not None and steps[1] == 1:
                self.section.r_store = True
        else:
            raise NotImplementedError(f"C++ backend: store mode {mode!r}")

    def store_reduction(self, name, index, value):
        if (dt := self.plan.buffer(name).get_dtype()) in (torch.float16, torch.bfloat16) and isinstance(value, CppVar):
            # eager rounds the result to its dtype: readers later in this kernel see that (s207 #10039)
            value = self.to_dtype(value, dt)
        return self.store(name, index, value)

    # ------------------------------------------------------------------ values
    def constant(self, value, dtype):
        if (cd := _compute_dtype(dtype)) == torch.bool:
            lit = "true" if value else "false"
        elif cd.is_floating_point:
            lit = _float_literal(float(value), cd)
        else:
            v = int(value)
            lit = f"static_cast<{cops.ctype(cd)}>({v}{'LL' if abs(v) >= 2 ** 31 else ''})"
        var = self._emit(lit, cd)
        self.const_val[var.name] = value
        return var

    def index_expr(self, expr, dtype):
        cd = _compute_dtype(dtype)
        tok = self._idx(expr)
        var = self._emit(f"static_cast<{cops.compute_ctype(cd)}>({tok})", cd)
        if not cd.is_floating_point:
            self.index_vars[var.name] = int(tok[2:-1])
        return var

    def to_dtype(self, x, dtype, src_dtype=None, use_compute_types=True):
        x = self._val(x, src_dtype)
        if dtype == torch.bool:
            return x if x.dtype == torch.bool else self._emit(f"({x} != 0)", torch.bool)
        if dtype in (torch.bfloat16, torch.float16):  # round; a value rounded already stays
            if x.rounded == dtype:
                return x
            x = self._emit(f"coil_round_bf16(static_cast<float>({x}))" if dtype == torch.bfloat16 else
                           f"coil_round_f16(static_cast<float>({x}))", torch.float32)
            x.rounded = dtype
            return x
        return x if x.dtype == dtype else self._emit(_cast(x, dtype), dtype)

    def indirect_indexing(self, x, size, check=True, wrap_neg=True):
        """An index read from a tensor, as one CSE'd expression (so a gather whose index does not depend on the loop
        variable is computed, and checked, once per row before the loop, and the loop stays ``omp simd``)."""
        x = self._val(x)
        s = cexpr(sympy.sympify(size))
        key = ("ind", x.name, s, bool(check), bool(wrap_neg))
        if (hit := self._lookup(key)) is not None:
            return sympy.Symbol(hit.name, integer=True)
        i = f"static_cast<int64_t>({x})"
        if check:
            self.has_checks, site = True, self.check_sites
            self.check_sites += 1
            self.check_origins.append(describe_origin(current_origin()))
            expr = f"coil_ind_checked({i}, {s}, {int(bool(wrap_neg))}, coil_err, {site})"
        else:
            expr = f"coil_ind_wrap({i}, {s})" if wrap_neg else i
        return sympy.Symbol(self._emit(expr, torch.int64, key=key).name, integer=True)

    def masked(self, mask, body, other):
        mask = self._val(mask)
        outer, inner = self.cur, []
        self.cur = inner
        self.scopes.append({})
        try:
            result = self._val(body())
        finally:
            self.scopes.pop()
            self.cur = outer
        other_v = self._literal(other, result.dtype)
        key = self._masked_key(mask, inner, result, other_v)
        hit = self._lookup(key) if key is not None else None
        if hit is not None:  # the same guarded computation again (torch.cat/pad bodies)
            return hit
        var = self._new()
        self._mark_local(var)
        self.cur += [f"{cops.compute_ctype(result.dtype)} {var} = {other_v};", f"if ({mask}) {{",
                     *("    " + l for l in inner), f"    {var} = {result};", "}"]
        out = CppVar(var, result.dtype)
        if key is not None:
            self.scopes[-1][key] = out
        return out

    def _masked_key(self, mask, inner: list[str], result, other_v: str):
        """A CSE key for a masked block: its text with the variables it defines renamed in order ($0, $1, ...), so two
        identical guarded computations share one variable. None (no CSE) if the block stores or has side effects."""
        if any("p_" in l.split("=")[0] or "#pragma" in l for l in inner):
            return None
        names = {}
        for l in inner:
            if m := re.match(r"^\s*[A-Za-z_][\w:<>]* ([A-Za-z_]\w*) = ", l):
                names[m.group(1)] = f"${len(names)}"
        canon = re.sub(r"[A-Za-z_]\w*", lambda m: names.get(m.group(0), m.group(0)),
                       "\n".join(inner) + "\n" + result.name)
        return ("masked", mask.name, canon, other_v, result.dtype)

    def _literal(self, v, dtype: torch.dtype) -> str:
        """A C++ literal of Python scalar (or CppVar) ``v`` in compute dtype ``dtype``."""
        if isinstance(v, CppVar):
            return v.name
        if dtype == torch.bool:
            return "true" if v else "false"
        if dtype.is_floating_point:
            return _float_literal(float(v), dtype)
        if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
            return f"coil_lim<{cops.ctype(dtype)}>::{'lowest' if v < 0 else 'max'}()" if not math.isnan(v) else "0"
        return f"static_cast<{cops.ctype(dtype)}>({int(v)}LL)"

    def where(self, c, a, b):
        a_dt = a.dtype if isinstance(a, CppVar) else (b.dtype if isinstance(b, CppVar) else None)
        c, a, b = self._val(c), self._val(a, a_dt), self._val(b, a_dt)
        if cops.compute_ctype(a.dtype) != cops.compute_ctype(b.dtype):
            return self._emit(f"({c} ? {a} : {b})", a.dtype)
        return self._emit(f"coil_sel<{cops.compute_ctype(a.dtype)}>({c}, {a}, {b})", a.dtype)  # (vectorizes)

    def load_seed(self, name, offset):
        ptr = self._arg(name, write=False)
        return self._emit(f"{ptr}[{self._idx(offset)}]", torch.int64, key=("load", name, sympy.sympify(offset)))

    def rand(self, seed, offset, fn="coil_rand"):
        return self._emit(f"{fn}(static_cast<uint64_t>({seed}), static_cast<uint64_t>({self._val(offset)}))",
                          torch.float32)

    def randn(self, seed, offset):
        return self.rand(seed, offset, "coil_randn")

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)
        if op in cops.UNARY:
            def unary(x):
                x = self._val(x)
                out_dt = torch.bool if op in cops.BOOL_RESULT else x.dtype
                e = cops.UNARY[op]([x.name], x.dtype)
                if op in cops.INT_WRAP and not x.dtype.is_floating_point and x.dtype != torch.int64:
                    e = f"static_cast<{cops.compute_ctype(x.dtype)}>({e})"
                return self._emit(e, out_dt)
            return unary
        if op in cops.BINARY:
            def binary(a, b):
                dt = a.dtype if isinstance(a, CppVar) else (b.dtype if isinstance(b, CppVar) else None)
                a, b = self._val(a, dt), self._val(b, dt)
                out_dt = torch.bool if op in cops.BOOL_RESULT else a.dtype
                if op == "pow" and a.dtype.is_floating_point:
                    k = self.const_val.get(b.name)
                    if isinstance(k, (int, float)) and float(k).is_integer() and 1 <= abs(k) <= 4:
                        # x ** 3 as multiplies: pow() is a scalar libm call in the loop
                        prod = " * ".join([a.name] * int(abs(k)))
                        one = "1.0f" if cops.compute_ctype(a.dtype) == "float" else "1.0"
                        return self._emit(f"({prod})" if k > 0 else f"({one} / ({prod}))", out_dt)
                e = cops.BINARY[op]([a.name, b.name], a.dtype)
                if op in cops.INT_WRAP and not a.dtype.is_floating_point and a.dtype not in (torch.int64, torch.bool):
                    e = f"static_cast<{cops.compute_ctype(a.dtype)}>({e})"
                if a.dtype == torch.bool and op in ("add", "mul", "maximum", "minimum"):
                    e = {"add": f"({a} || {b})", "mul": f"({a} && {b})",
                         "maximum": f"({a} || {b})", "minimum": f"({a} && {b})"}[op]
                out = self._emit(e, out_dt)
                if op in ("lt", "le", "gt", "ge") and (a.name in self.index_vars or b.name in self.index_vars):
                    ab = [self.index_vars.get(v.name, self.const_val.get(v.name)) for v in (a, b)]
                    if all(type(v) is int for v in ab):
                        self.range_masks[out.name] = (a.name in self.index_vars, ab[0],
                                                      b.name in self.index_vars, ab[1], op)
                return out
            return binary
        raise NotImplementedError(f"C++ backend does not implement ops.{op}")

    # ------------------------------------------------------------------ reductions
    def reduction(self, dtype, src_dtype, reduction_type, value):
        if self.section is None:
            return self._reduce_one(dtype, src_dtype, reduction_type, value)
        sec = self.section
        value = self._val(value, _compute_dtype(src_dtype))
        acc = self._new("acc")
        vt = cops.compute_ctype(value.dtype)
        at = cops.compute_ctype(_compute_dtype(dtype))
        rt = reduction_type
        fp = value.dtype.is_floating_point
        if rt in ("sum", "prod"):
            fields = [("", at, "0" if rt == "sum" else "1")]
            upd = [f"{acc}@ = {acc}@ {'+' if rt == 'sum' else '*'} static_cast<{at}>({value});"]
        elif rt in ("max", "min"):
            lim = ("-" if rt == "max" else "") + f"coil_lim<{at}>::inf()" if fp else \
                (f"coil_lim<{at}>::lowest()" if rt == "max" else f"coil_lim<{at}>::max()")
            fields = [("", at, lim)]
            if fp:
                upd = [f"{acc}@ = coil_{rt}_prop_({acc}@, static_cast<{at}>({value}));"]
            else:
                op = ">" if rt == "max" else "<"
                upd = [f"{acc}@ = coil_sel<{at}>({value} {op} {acc}@, static_cast<{at}>({value}), {acc}@);"]
        elif rt == "any":
            fields = [("", "bool", "false")]
            upd = [f"{acc}@ = {acc}@ || ({value} != 0);"]
        elif rt in ("argmax", "argmin"):
            lim = ("-" if rt == "argmax" else "") + f"coil_lim<{vt}>::inf()" if fp else \
                (f"coil_lim<{vt}>::lowest()" if rt == "argmax" else f"coil_lim<{vt}>::max()")
            fields = [("_v", vt, lim), ("_i", "int64_t", "INT64_MAX")]
            self.needs_rindex = True
            upd = [f"{{ bool b_ = coil_{rt}_better({value}, rindex, {acc}_v@, {acc}_i@);",
                   f"  {acc}_v@ = coil_sel<{vt}>(b_, {value}, {acc}_v@); {acc}_i@ = coil_sel<int64_t>(b_, rindex, "
                   f"{acc}_i@); }}"]
        else:
            raise NotImplementedError(f"C++ backend: reduction {rt!r}")
        sec.accs.append((acc, rt, fields))
        self.cur.extend(upd)
        self.cur = sec.post  # code after the reduction (store_reduction, epilogue math) runs once per x
        self.scopes = [self.outer_cse]
        if rt in ("argmax", "argmin"):
            return CppVar(f"{acc}_i", torch.int64)
        return CppVar(acc, _compute_dtype(dtype) if rt != "any" else torch.bool)

    def _reduce_one(self, dtype, src_dtype, rt, value):
        """A reduction over one element (``rnumel == 1``: a pointwise kernel)."""
        value = self._val(value, _compute_dtype(src_dtype))
        if rt in ("argmax", "argmin"):
            return self.constant(0, torch.int64)
        if rt == "any":
            return self.to_dtype(value, torch.bool)
        if rt in ("sum", "prod", "max", "min"):
            return self.to_dtype(value, _compute_dtype(dtype))
        raise NotImplementedError(f"C++ backend: reduction {rt!r}")

    # ------------------------------------------------------------------ driving
    def run_nodes(self) -> None:
        for node in self.plan.nodes:
            self.section, self.cur, self.scopes = None, self.items, [self.outer_cse]
            if self.is_reduction and node.in_loop:
                last = self.items[-1] if self.items else None
                if not (isinstance(last, _Section) and last.loop_id == node.loop_id):
                    last = _Section(node.loop_id)
                    self.items.append(last)
                self.section, self.cur, self.scopes = last, last.body, [self.outer_cse, last.cse]
            node.run(self)
        self.section, self.cur, self.scopes = None, self.items, [self.outer_cse]

    # ------------------------------------------------------------------ assembly
    def source(self) -> str:
        """Run the bodies and return the kernel's C++ function (without the prelude)."""
        self.run_nodes()
        bounds = self.bounds
        self.indices = [simplify_index(canonicalize(e, bounds), bounds) for e in self.indices]
        xs = split_plan(self.indices, XINDEX, self.numel, "x")
        rs = split_plan(self.indices, RINDEX, self.rnumel, "r") if self.is_reduction else None
        self._rendered = [cexpr(xs.substitute(e) if rs is None else rs.substitute(xs.substitute(e)))
                          for e in self.indices]
        body = self._pointwise(xs) if not self.is_reduction else self._reduction(xs, rs)
        out = [self._signature() + " {", *("  " + l if l else l for l in body),
               "  return coil_err ? coil_err[0] : 0;" if self.has_checks else "  return 0;", "}"]
        return "\n".join(l for l in out if l.strip() != "" or l == "")

    def arg_names(self) -> list[str]:
        """Buffer names in the order the C++ function takes them."""
        return self.read + [n for n in self.written if n not in self.read]

    def _signature(self) -> str:
        params = []
        for n in self.arg_names():
            t, w = cops.ctype(self.plan.buffer(n).get_dtype()), n in self.written
            params.append(f"{'' if w else 'const '}{t}*{'' if w and n in self.read else ' __restrict__'} p_{n}")
        params += [f"int64_t {s.name}" for s in self.size_symbols]  # dynamic sizes
        params.append("int64_t* coil_err")
        attr = '__attribute__((optimize("no-tree-loop-if-convert"))) ' if self.no_if_convert else ""
        return f'extern "C" {attr}int64_t {self.name}({", ".join(params)})'

    def _fix(self, line: str) -> str:
        return re.sub(r"@I(\d+)@", lambda m: self._rendered[int(m.group(1))], line)

    def _omp(self, work, extra: str = "") -> str:
        if self.num_threads <= 1 or (is_static(work) and int(work) < PARALLEL_MIN):
            return ""
        # a symbolic amount of work decides at run time (OpenMP's if clause)
        cond = "" if is_static(work) else f" if({_c(work)} >= {PARALLEL_MIN})"
        return f"#pragma omp parallel for{extra} num_threads({self.num_threads}) schedule(static){cond}"

    @staticmethod
    def _simd_for(lines: list[str]) -> str:
        """``#pragma omp simd`` unless the loop body has a bounds check or atomic store (hoisted checks don't count)."""
        return "" if any("coil_ind_checked(" in l or "omp atomic" in l or "omp critical" in l for l in lines) \
            else "#pragma omp simd"

    def _hoist(self, lines: list[str], inner_var: str) -> tuple[list[str], list[str]]:
        """Split a pointwise body into (per-row, per-element) statements: declarations that depend neither on
        ``inner_var`` nor on a per-element value (a row's gather index and its bounds check, a broadcast load) move out
        of the inner loop. Loads of buffers this kernel writes stay inside (a store may precede them)."""
        outer, inner, depth = [], [], 0
        inner_names, written = {inner_var}, {f"p_{n}" for n in self.written}
        for l in lines:
            m = re.match(r"^([A-Za-z_][\w:<>]*) ([A-Za-z_]\w*) = (.*);$", l)
            toks = set(re.findall(r"[A-Za-z_]\w*", l))
            if (depth == 0 and m is not None and m.group(2) not in self.locals
                    and not (toks & inner_names) and not (toks & written)):
                outer.append(l)
            else:
                inner.append(l)
                if m is not None:
                    inner_names.add(m.group(2))
            depth += l.count("{") - l.count("}")
        return outer, inner

    def _segments(self, xs: Split, lines: list[str], extent) -> list[tuple]:
        """The inner loop ``[0, extent)`` as ``(lo, hi, lines)`` pieces in which every comparison of ``x0 + k`` with a
        constant (``torch.cat``'s and ``pad``'s masks along the inner dim) has one value, written into the piece's
        copy of the body: its ``if (mask)`` blocks fold away and each piece vectorizes (a masked block in the
        loop kept it scalar). One piece, the whole loop, when there is no such mask, the extent is symbolic or
        there would be more than four pieces."""
        if not self.range_masks or not isinstance(extent, int):
            return [(0, extent, lines)]
        try:
            cuts, masks = self._mask_cuts(xs, extent)
        except Exception as e:  # an optional optimisation: the loop stays one piece (logged; a bug to fix)
            refuse_fallback("cpp_pieces_fallback", e)   # config.strict_codegen: an error instead
            trace.log("cpp_pieces_fallback", stage="codegen", kernel=self.name, error=f"{type(e).__name__}: {e}")
            return [(0, extent, lines)]
        pts = sorted(cuts | {0, extent})
        if not masks or len(pts) > 5:
            return [(0, extent, lines)]
        out = []
        for lo, hi in zip(pts, pts[1:]):
            val = {n: "true" if (hi <= cut) == below else "false" for n, (cut, below) in masks.items()}
            out.append((lo, hi, [re.sub(r"^(\s*bool (\w+) = ).*;$", lambda m: m.group(1) + val[m.group(2)] + ";"
                                        if m.group(2) in val else m.group(0), l) for l in lines]))
        return out

    def _mask_cuts(self, xs: Split, extent: int) -> tuple[set, dict]:
        """(points in ``[0, extent]`` where a range mask changes, mask variable -> (cut, true below the cut))."""
        x0 = sympy.Symbol("x0", integer=True, nonnegative=True)
        cuts, masks = set(), {}
        for name, (a_ix, a, b_ix, b, op) in self.range_masks.items():
            d = sum(sign * (xs.substitute(self.indices[v]) if ix else sympy.Integer(v))
                    for sign, ix, v in ((1, a_ix, a), (-1, b_ix, b)))
            c = d.coeff(x0) if d.is_polynomial(x0) else 0
            if c not in (1, -1) or not (k := sympy.expand(c * d - x0)).is_Integer:
                continue
            op = op if c == 1 else {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}[op]
            cut = int(-k) + (op in ("le", "gt"))  # the mask is (x0 < cut) for lt/le, (x0 >= cut) for gt/ge
            masks[name] = (cut, op in ("lt", "le"))
            cuts.add(min(max(cut, 0), extent))
        return cuts, masks

    def _pointwise(self, xs: Split) -> list[str]:
        lines = [self._fix(l) for l in self.items]
        if self.numel == 0:
            return []
        ext = xs.extents
        if len(ext) == 1:
            out = []
            for lo, hi, seg in self._segments(xs, lines, ext[0]):
                simd = self._simd_for(seg)
                out += [self._omp(self.numel, " simd" if simd else "") or simd,
                        f"for (int64_t x0 = {lo}; x0 < {_c(hi)}; ++x0) {{", *("  " + l for l in seg), "}"]
            return out
        hoisted, lines = self._hoist(lines, "x0")
        outer = self.numel // ext[0] if isinstance(self.numel, int) else _quo(self.numel, ext[0])
        decl, q = [], 1
        for i in range(1, len(ext)):
            e = f"(xo / {_cp(q)})" if q != 1 else "xo"
            decl.append(f"int64_t x{i} = {e}" + (f" % {_cp(ext[i])};" if i < len(ext) - 1 else ";"))
            q = q * ext[i]
        par_outer = hint(outer) >= 2 * self.num_threads
        loops = []
        for lo, hi, seg in self._segments(xs, lines, ext[0]):
            simd = self._simd_for(seg)
            loops += ["  " + ((self._omp(self.numel, " simd" if simd else "") or simd) if not par_outer else simd),
                      f"  for (int64_t x0 = {lo}; x0 < {_c(hi)}; ++x0) {{", *("    " + l for l in seg), "  }"]
        return [self._omp(self.numel) if par_outer else "", f"for (int64_t xo = 0; xo < {_c(outer)}; ++xo) {{",
                *("  " + d for d in decl), *("  " + l for l in hoisted), *loops, "}"]

    def _xdecls(self, xs: Split) -> list[str]:
        ext = xs.extents
        if len(ext) == 1:
            return ["int64_t x0 = xindex;"]
        out = []
        for i, p in enumerate(xs.points):
            e = f"(xindex / {_cp(p)})" if p != 1 else "xindex"
            out.append(f"int64_t x{i} = {e}" + (f" % {_cp(ext[i])};" if i < len(ext) - 1 else ";"))
        return out

    def _reduction(self, xs: Split, rs: Split) -> list[str]:
        if self.numel == 0:
            return []
        if (w := self._outer_sum(xs)) is not None:
            return self._reduction_x_lanes(xs, rs, w)
        body = [l for item in self.items
                for l in (self._section(item, rs) if isinstance(item, _Section) else [self._fix(item)])]
        return [self._omp(self.numel * self.bounds[RINDEX]) if not is_static(self.numel) or self.numel >= 2 else "",
                f"for (int64_t xindex = 0; xindex < {_c(self.numel)}; ++xindex) {{",
                *("  " + d for d in self._xdecls(xs)), *("  " + l for l in body), "}"]

    def _outer_sum(self, xs: Split) -> Optional[int]:
        """The lane width ``W`` when this reduction's loads are contiguous along x, not r (a bias gradient ``g.sum(0)``
        of a row-major ``g``, ``x.mean((2, 3))`` or ``instance_norm`` of a channels-last ``x``), written as
        :meth:`_reduction_x_lanes`, else None. ``W`` consecutive x of the innermost x run share each r step: a multiple
        of ``LANES`` up to 64 (fewer when that leaves threads idle), or a whole run of up to 256 that is not one. The
        per-x code only declares and stores values (each declared value becomes an array of ``W``)."""
        e0 = xs.extents[0]
        if (not isinstance(self.numel, int) or self.x_contiguous_loads <= self.r_contiguous_loads
                or not isinstance(e0, int) or e0 < LANES or (e0 % LANES and e0 > 256)
                or any(rt not in ("sum", "prod", "max", "min", "any") for item in self.items
                       if isinstance(item, _Section) for _, rt, _ in item.accs)
                or not all(_DECL.match(l) or _STORE.match(l) for item in self.items
                           for l in ([item] if isinstance(item, str) else item.pre + item.post))):
            return None
        w = e0 if e0 % LANES else next(w for w in (64, 32, 16, 8) if e0 % w == 0)
        while w % (2 * LANES) == 0 and self.numel // w < 2 * self.num_threads:
            w //= 2
        return w

    def _reduction_x_lanes(self, xs: Split, rs: Split, w: int) -> list[str]:
        """The "outer reduction" form: blocks of ``w`` consecutive x (parallel over blocks); each r step runs an ``omp
        simd`` loop over the block's lanes, one vector load per input, with one accumulator per lane, where one x at a
        time read a column of stride-apart loads (channels-last ``x.mean((2, 3))`` ran 5-20x slower than eager). Per-x
        values (the code before, between and after the loops over r) are arrays over the lanes. A loop over r without
        a reduction whose store is contiguous along r (``instance_norm``'s NCHW output) keeps r innermost. Floating
        sums add blocks of ``X_LANES_BLOCK`` rows per lane with Kahan's compensation (deterministic for any thread
        count; as accurate as the lanes along r, which :meth:`_section` blocks)."""
        ext, names, decls, code = rs.extents, set(), [], []
        opens = [f"for (int64_t r{i} = 0; r{i} < {_c(ext[i])}; ++r{i}) {{" for i in range(len(ext) - 1, 0, -1)]
        closes = ["}"] * len(opens)

        def ren(l: str) -> str:  # a per-x value read inside a lane loop: its lane's element
            return re.sub(r"\b(" + "|".join(sorted(names)) + r")\b(?!@)", r"\1_xl[l]", l) if names else l

        def lanes(body: list[str], simd: bool = True) -> list[str]:
            return [self._simd_for(body) if simd else "", f"for (int64_t l = 0; l < {w}; ++l) {{",
                    "  int64_t x0 = x0b + l;", *("  " + b for b in body), "}"]

        def per_x(lines: list[str]) -> list[str]:
            out = []
            for l in (ren(self._fix(l)) for l in lines):
                if (m := _DECL.match(l)) and not re.search(r"\bx0\b|\bp_|_xl\[l\]", m[3]):
                    decls.append(l)  # the same for every lane (a constant)
                    continue
                if m:
                    decls.append(f"{m[1]} {m[2]}_xl[{w}];")
                    names.add(m[2])
                    l = f"{m[2]}_xl[l] = {m[3]};"
                out.append(l)
            return lanes(out) if out else []

        pending: list[str] = []  # per-x lines: one lane loop between loops over r
        for item in self.items:
            if isinstance(item, str):
                pending.append(item)
                continue
            code += per_x(pending + item.pre)
            body = [self._fix(l) for l in item.body]
            self.no_if_convert |= any(l.lstrip().startswith("if (") for l in body)  # see _section
            blocked = [a for a, rt, f in item.accs if rt == "sum" and f[0][1] in ("float", "double")]
            for acc, _, ((_, t, init),) in item.accs:
                decls.append(f"{t} {acc}_xl[{w}]" + (f", {acc}_blk[{w}], {acc}_c[{w}];" if acc in blocked else ";"))
                code.append(f"for (int l = 0; l < {w}; ++l) {{ {acc}_xl[l] = {init};"
                            + (f" {acc}_c[l] = 0; }}" if acc in blocked else " }"))
            for acc in blocked:
                body = [l.replace(f"{acc}@", f"{acc}_blk[l]") for l in body]
            body = self._rindex_decl(rs) + [ren(l).replace("@", "_xl[l]") for l in body]
            code += [*opens, f"for (int64_t rb0 = 0; rb0 < {_c(ext[0])}; rb0 += {X_LANES_BLOCK}) {{"]
            code += [f"  for (int l = 0; l < {w}; ++l) {acc}_blk[l] = 0;" for acc in blocked]
            code += [f"  int64_t re0 = rb0 + {X_LANES_BLOCK} < {_c(ext[0])} ? rb0 + {X_LANES_BLOCK} : {_c(ext[0])};"]
            r_loop = "for (int64_t r0 = rb0; r0 < re0; ++r0) {"
            if not item.accs and item.r_store:  # a tile, r innermost; no omp simd: its gathers of strided loads
                tile = lanes([r_loop, *("  " + l for l in body), "}"], simd=False)  # made pool+instance_norm 20x slower
            else:
                tile = [r_loop, *("  " + l for l in lanes(body)), "}"]
            code += ["  " + l for l in tile]
            code += [f"  for (int l = 0; l < {w}; ++l) {{ {t} y = {acc}_blk[l] - {acc}_c[l], s = {acc}_xl[l] + y; "
                     f"{acc}_c[l] = __builtin_isfinite(s) ? (s - {acc}_xl[l]) - y : 0; {acc}_xl[l] = s; }}"  # inf - inf
                     for acc, _, ((_, t, _),) in item.accs if acc in blocked]
            code += ["}", *closes]
            names.update(acc for acc, _, _ in item.accs)
            pending = list(item.post)
        code += per_x(pending)
        head = ["int64_t xindex = xb;", *(d.replace("int64_t x0 ", "int64_t x0b ") for d in self._xdecls(xs))]
        return [self._omp(self.numel * self.bounds[RINDEX]) if self.numel > w else "",
                f"for (int64_t xb = 0; xb < {self.numel}; xb += {w}) {{", *("  " + l for l in head + decls + code), "}"]

    def _rindex_decl(self, rs: Split) -> list[str]:
        return [f"int64_t rindex = {cexpr(rs.flat())};"] if self.needs_rindex else []

    def _section(self, sec: _Section, rs: Split) -> list[str]:
        body = [self._fix(l) for l in sec.body]
        post = [self._fix(l) for l in sec.post]
        ext = rs.extents
        opens = [f"for (int64_t r{i} = 0; r{i} < {_c(ext[i])}; ++r{i}) {{" for i in range(len(ext) - 1, 0, -1)]
        closes = ["}"] * len(opens)
        ind = "  " * len(opens)
        pre = [self._fix(l) for l in sec.pre]
        if not sec.accs:
            out = pre + ["{"] + ["  " + o for o in opens]
            out += [f"  {ind}{self._simd_for(body)}", f"  {ind}for (int64_t r0 = 0; r0 < {_c(ext[0])}; ++r0) {{"]
            out += [f"  {ind}  {l}" for l in self._rindex_decl(rs) + body]
            out += [f"  {ind}}}"] + ["  " + c for c in closes] + ["}"]
            return out + post
        out = list(pre)
        for acc, rt, fields in sec.accs:
            for suf, t, init in fields:
                out += [f"{t} {acc}{suf}_lane[{LANES}];",
                        f"for (int l = 0; l < {LANES}; ++l) {acc}{suf}_lane[l] = {init};"]
        # Floating-point sums over long rows accumulate in blocks of SUM_BLOCK elements (per-lane block
        # partials added to the lane totals after each block): one running sum per lane over 12500 elements
        # was 25x less accurate than eager's cascade sum on x[100003, 3].sum(0).
        blocked = [acc for acc, rt, fields in sec.accs if rt == "sum" and fields[0][1] in ("float", "double")]
        if is_static(ext[0]) and int(ext[0]) <= SUM_BLOCK:
            blocked = []
        out += [f"{fields[0][1]} {acc}_blk[{LANES}];" for acc, rt, fields in sec.accs if acc in blocked]
        out += ["{"] + ["  " + o for o in opens]
        lane_body = []
        for l in body:
            for acc in blocked:
                l = l.replace(f"{acc}@", f"{acc}_blk[l]")
            lane_body.append(l.replace("@", "_lane[l]"))
        # The scalar tail (the last ext0 % LANES elements of each row, from tail0 = ext0 - ext0 % LANES, where the lane
        # loop leaves rb) is a partial lane chunk: element tail0 + l goes to lane l (constant bounds: it unrolls). No
        # separate in-order tail accumulator: g++ 12.2 -O3 miscompiles the loop vectorization of an in-order float sum
        # over reversed accesses (x.flip(-1).sum() on (17, 2), where the lane loop never runs and the whole row is tail;
        # docs/cpp_backend.md), and with independent lanes a row shorter than LANES vectorizes without reassociation.
        if is_static(ext[0]):
            n_tail = int(ext[0]) % LANES
            tail0 = int(ext[0]) - n_tail
        else:  # a symbolic row: the tail's length is known at run time only
            n_tail = f"({_cp(ext[0])} % {LANES})"
            tail0 = f"({_c(ext[0])} - {n_tail})"
        tail_body = [l.replace("@", "_lane[l]") for l in body]
        # A static row shorter than LANES is all tail, which g++ unrolls into the enclosing loop and SLP-vectorizes
        # there; g++ 12.2 with AVX-512 gives every vector of an SLP group of masked loads the first one's mask
        # (docs/cpp_backend.md), so guarded loads there stay branches (a guard on r0 alone folds once unrolled).
        if tail0 == 0 and any(l.lstrip().startswith("if (") for l in body):
            self.no_if_convert = True
            trace.log("cpp_no_if_convert", stage="codegen", kernel=self.name,
                      reason="guarded loads in a static row shorter than LANES (g++ 12 SLP masks)")
        out += [f"  {ind}int64_t rb = 0;"]
        lane = ind + "  " * bool(blocked)  # the lane loop: inside the loop over blocks of sums
        if blocked:
            out += [f"  {ind}for (int64_t rb0 = 0; rb0 + {LANES} <= {_c(ext[0])}; rb0 += {SUM_BLOCK}) {{"]
            out += [f"  {ind}  for (int l = 0; l < {LANES}; ++l) {acc}_blk[l] = 0;" for acc in blocked]
            out += [f"  {lane}for (rb = rb0; rb + {LANES} <= {_c(ext[0])} && rb < rb0 + {SUM_BLOCK}; rb += {LANES}) {{"]
        else:
            out += [f"  {lane}for (; rb + {LANES} <= {_c(ext[0])}; rb += {LANES}) {{"]
        out += [f"  {lane}  {self._simd_for(body)}", f"  {lane}  for (int64_t l = 0; l < {LANES}; ++l) {{",
                f"  {lane}    int64_t r0 = rb + l;"]
        out += [f"  {lane}    {l}" for l in self._rindex_decl(rs) + lane_body]
        out += [f"  {lane}  }}", f"  {lane}}}"]
        if blocked:
            out += [f"  {ind}  for (int l = 0; l < {LANES}; ++l) {acc}_lane[l] = {acc}_lane[l] + {acc}_blk[l];"
                    for acc in blocked]
            out += [f"  {ind}}}"]
        if n_tail:
            out += [f"  {ind}for (int64_t l = 0; l < {n_tail}; ++l) {{", f"  {ind}  int64_t r0 = {tail0} + l;"]
            out += [f"  {ind}  {l}" for l in self._rindex_decl(rs) + tail_body]
            out += [f"  {ind}}}"]
        out += ["  " + c for c in closes] + ["}"]
        # combine the lanes in a fixed order
        for acc, rt, fields in sec.accs:
            out += [f"{t} {acc}{suf} = {init};" for suf, t, init in fields]
            out += self._combine(acc, rt, fields)
        return out + post

    def _combine(self, acc: str, rt: str, fields) -> list[str]:
        s, loop = "_lane[l]", f"for (int l = 0; l < {LANES}; ++l) "
        out = []
        if rt in ("sum", "prod", "any"):
            out.append(f"{loop}{acc} = {acc} {dict(sum='+', prod='*', any='||')[rt]} {acc}{s};")
        elif rt in ("max", "min"):
            if fields[0][1] in ("float", "double"):
                out.append(f"{loop}{acc} = coil_{rt}_prop_({acc}, {acc}{s});")
            else:
                out.append(f"{loop}{acc} = ({acc}{s} {'>' if rt == 'max' else '<'} {acc}) ? {acc}{s} : {acc};")
        elif rt in ("argmax", "argmin"):
            out.append(f"{loop}{{ if (coil_{rt}_better({acc}_v{s}, {acc}_i{s}, {acc}_v, {acc}_i)) "
                       f"{{ {acc}_v = {acc}_v{s}; {acc}_i = {acc}_i{s}; }} }}")
        if rt in ("argmax", "argmin"):
            out.append(f"if ({acc}_i == INT64_MAX) {acc}_i = 0;")
        return out
