"""TritonKernel: the ops handler that writes one Triton kernel for a KernelPlan.

Pointwise kernels are 1-D (``xindex``, mask ``xmask``); reductions use ``[XBLOCK, RBLOCK]`` tiles, either
*persistent* (a block holds whole rows, one reduce) or *looped* (``for roffset in range(0, <rnumel>,
RBLOCK)`` per loop section, reducing after the loop). Masks that are all true for every launch config are
left out (``x_exact`` / ``r_exact``). Values are CSE'd (``tmpN``), fp16/bf16 loads are upcast to fp32 and
stores round once, and a load of an element stored earlier is served from registers. Numel and strides
are literals (static shapes). docs/codegen.md, "The Triton backend", has the contract."""
from __future__ import annotations

import itertools
import math
import numbers
import os
import re
from typing import Optional

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from coil.config import config
from coil.ir.nodes import current_origin, describe_origin
from coil.ir.symbols import pyexpr as _pyexpr
from coil.ir.virtualized import OpsHandler, compute_dtype
from coil.schedule.indexing import axis_steps
from coil.ir.symbols import (PRECOMPUTED, RINDEX, XINDEX, floor_safe, guard_true, hint, is_static, simplify_index, sym,
                             upper_bound)

TL_DTYPE = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
            torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
            torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}


def pyexpr(e) -> str:
    """An index expression as Triton source; Triton's integer ``//``/``%`` truncate
    (:func:`coil.ir.symbols.floor_safe`); Min/Max as ``tl.minimum``/``tl.maximum`` (the
    interpreter's ``max(3, s0)`` returned the int 3, whose ``.to`` raised)."""
    return _pyexpr(floor_safe(e), ("tl.minimum", "tl.maximum"))


class TVal:
    """A value in the kernel: an expression name, its dtype, which axes it varies on."""

    __slots__ = ("name", "dtype", "dims", "const")

    def __init__(self, name: str, dtype: torch.dtype, dims: frozenset, const=None):
        self.name, self.dtype, self.dims, self.const = name, dtype, dims, const

    def __str__(self):
        return self.name


def _nan(dtype) -> str:
    """The extra argument making ``tl.maximum`` / ``tl.minimum`` return NaN when either side is NaN, as
    torch's max/amax/clamp do (Triton's default returns the other operand on a GPU)."""
    return ", propagate_nan=tl.PropagateNan.ALL" if dtype.is_floating_point else ""


def _convert(value, dtype):
    """A constant (a Python number) as eager converts it to ``dtype``: 2.5 in int64 is 2, 300 in uint8 is 44, 70000.0 in
    fp16 is inf; integers wrap into the dtype's range like eager's scalars (uint8 + 300 adds 44)."""
    if isinstance(value, bool):
        return torch.tensor(value).to(dtype).item()
    if isinstance(value, numbers.Integral):
        return torch.tensor(int(value), dtype=torch.int64).to(dtype).item()
    return torch.tensor(float(value), dtype=torch.float64).to(dtype).item()


def _lit(value, dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        return ('float("inf")' if v > 0 else 'float("-inf")') if math.isinf(v) else repr(v)
    return str(int(value))


def needs_int64(extents) -> bool:
    """Whether indices over ``extents`` (element counts: ints or size expressions) need int64. A symbolic extent whose
    example value is small is indexed in int32 under a ShapeEnv guard that it stays below 2^31 - 1 (a larger call
    recompiles); one whose example is large, or with a data-dependent size (no bound to guard), gets int64."""
    big = False
    for e in extents:
        if is_static(e):
            big = big or int(e) >= 2 ** 31 - 1
        elif free_unbacked_symbols(sympy.sympify(e).xreplace(PRECOMPUTED)) or hint(e) >= 2 ** 31 - 1:
            big = True  # (a precomputed size over a data-dependent one, int(t.item()), is one too)
        else:
            guard_true(sympy.Lt(e, 2 ** 31 - 1))
    return big


def _fits_int32(e: sympy.Expr, bounds: dict) -> bool:
    """Whether every value of the index expression ``e`` (loop symbols below their static
    ``bounds``) is provably within int32; a symbolic bound counts as not (no guard: the
    bound of a padded or sliced size expression may not be one the ShapeEnv can take)."""
    total = 0
    for t in (e.args if e.is_Add else (e,)):
        c, rest = t.as_coeff_Mul()
        ub = 2 if rest == 1 else upper_bound(rest, bounds)
        if not isinstance(ub, int) or not c.is_Integer:
            return False
        total += abs(int(c)) * (ub - 1)
    return total < 2 ** 31 - 1


class TritonKernel(OpsHandler):
    """Generate one kernel (``source()``) from a :class:`KernelPlan`."""

    def __init__(self, plan, name: str, x_exact: bool = False, r_exact: bool = False):
        self.plan, self.name = plan, name
        #: ``xmask`` / ``rmask`` are all true for every launch config the runtime may
        #: choose (backend.mask_exactness): they are left out of loads, stores and guards
        self.x_exact, self.r_exact = x_exact, r_exact
        self.red = plan.rnumel != 1
        self.looped = self.red and not plan.persistent
        extents = [plan.numel * plan.rnumel] + [plan.buffer(n).layout.storage_numel()
                                                for n in plan.input_names + plan.output_names]
        self.index_dtype = "tl.int64" if needs_int64(extents) else "tl.int32"
        #: a looped kernel's persistent twin (codegen/triton/backend.py: symbolic row lengths)
        self.twin: Optional[TritonKernel] = None
        #: a size symbol that is the whole xnumel or rnumel is addressed by that name, which Triton
        #: specializes on divisibility by 16: ``x + rnumel * row`` loads vectorize, ``x + s20 * row`` do not
        self.numel_names = {e: sympy.Symbol(n, integer=True) for e, n in (
            (plan.numel, "xnumel"), (plan.rnumel, "rnumel")) if isinstance(e, sympy.Symbol)}
        self.args: dict[str, str] = {n: f"in_ptr{i}" for i, n in enumerate(plan.input_names)}
        self.args.update({n: f"out_ptr{i}" for i, n in enumerate(plan.arg_output_names)})
        self.args.update({o: self.args[n] for o, n in plan.inplace.items()})   # stored over the input
        self.counter = itertools.count()
        # per section: pre / init / loop / post line lists
        self.sections = [dict(pre=[], init=[], loop=[], post=[]) for _ in range(plan.section_count)]
        self.body: list[str] = []       # persistent / pointwise straight-line code
        self.outer_cse: dict[str, TVal] = {}
        self.loop_cse: dict[str, TVal] = {}
        self.store_cache: dict[tuple, TVal] = {}
        self.loop_store_cache: dict[tuple, TVal] = {}
        self.mask_stack: list[TVal] = []
        #: fp32 value name -> (expression of the value it rounds, fp16/bf16 dtype), for stores
        self.rounded: dict[str, tuple] = {}
        self.indirect_dims: dict[str, frozenset] = {}
        self.cur, self.cur_section = None, -1
        # loads of a reduction whose address steps by 1 along x and by more along r
        # (``x.sum(0)``): the runtime then tries wide-XBLOCK, short-RBLOCK tiles
        self.max_accs: dict[str, tuple] = {}  # acc<N>_res -> (acc, value, section)
        self.x_contiguous_loads, self.r_contiguous_loads = 0, 0

    # ----------------------------------------------------------------- structure
    def begin(self, pn) -> None:
        self.cur = pn
        if self.looped and pn.loop_id != self.cur_section:
            self.cur_section, self.loop_cse, self.loop_store_cache = pn.loop_id, {}, {}

    def _in_loop(self) -> bool:
        return self.looped and self.cur.in_loop

    def _lines(self) -> list[str]:
        if not self.looped:
            return self.body
        sec = self.sections[self.cur.loop_id]
        return sec["loop"] if self.cur.in_loop else sec["pre"]

    def cse(self, expr: str, dtype, dims, lines=None) -> TVal:
        d = self.loop_cse if self._in_loop() else self.outer_cse
        if expr in d:
            return d[expr]
        v = TVal(f"tmp{next(self.counter)}", dtype, frozenset(dims))
        (lines if lines is not None else self._lines()).append(f"{v.name} = {expr}")
        d[expr] = v
        return v

    # ----------------------------------------------------------------- index helpers
    def _dims_of_index(self, e) -> frozenset:
        dims = set()
        for s in sympy.sympify(e).free_symbols:
            dims |= {"x"} if s == XINDEX else {"r"} if s == RINDEX else self.indirect_dims.get(s.name, frozenset())
        return frozenset(dims)

    def _shape(self, dims) -> str:
        if not self.red:
            return "[XBLOCK]" if "x" in dims else "[1]"
        return f"[{'XBLOCK' if 'x' in dims else '1'}, {'RBLOCK' if 'r' in dims else '1'}]"

    def _mask(self, dims) -> tuple[Optional[str], frozenset]:
        axes = [a for a, exact in (("x", self.x_exact), ("r", self.r_exact)) if a in dims and not exact]
        parts = [f"{a}mask" for a in axes] + [m.name for m in self.mask_stack]
        return (" & ".join(parts) if parts else None), frozenset(axes).union(*(m.dims for m in self.mask_stack))

    def _block_guard(self) -> Optional[str]:
        """The mask of a ``[XBLOCK, RBLOCK]`` tile's padded lanes (``xmask & rmask``, less
        the exact ones), or None when every lane is in range."""
        parts = [m for m, exact in (("xmask", self.x_exact), ("rmask", self.r_exact)) if not exact]
        return " & ".join(parts) if self.red and parts else None

    def _guarded(self, acc: str, update: str) -> str:
        """``acc = update`` on the tile's in-range lanes only."""
        g = self._block_guard()
        return f"{acc} = tl.where({g}, {update}, {acc})" if g else f"{acc} = {update}"

    # ----------------------------------------------------------------- memory
    def load(self, name, index):
        e = simplify_index(sympy.sympify(index), {XINDEX: self.plan.numel, RINDEX: self.plan.rnumel})
        key = (name, e)
        if hit := self.store_cache.get(key) or self._in_loop() and self.loop_store_cache.get(key):
            return hit  # (a value stored earlier: served from registers)
        buf_dtype = self.plan.buffer(name).get_dtype()
        dims = self._dims_of_index(e)
        if self.red:
            self._note_strides(e)
        mask, mdims = self._mask(dims)
        ptr = f"{self.args[name]} + ({pyexpr(e.xreplace(self.numel_names))})" if e != 0 else self.args[name]
        if mdims - dims or mask and not dims:
            # a scalar address under a mask that may be a block (``tl.full([1], ...)``)
            ptr = f"tl.broadcast_to({ptr}, {self._shape(dims | mdims)})"
            dims = dims | mdims
        expr = f"tl.load({ptr}{', ' + mask + ', other=0.0' if mask else ''})"
        if buf_dtype == torch.bool:
            expr = f"{expr}.to(tl.int1)"
        if (cdt := compute_dtype(buf_dtype)) != buf_dtype:
            expr = f"{expr}.to({TL_DTYPE[cdt]})"
        return self.cse(expr, cdt, dims)

    def _note_strides(self, e) -> None:
        """Count loads that are contiguous along x (stride 1 in x, > 1 in r) or along r, from the address at (x, r) =
        (0, 0), (1, 0), (0, 1); indirect loads are skipped, and so are loads the same for every x (a per-row vector such
        as LayerNorm's mean, broadcast along x: one short read per block, whatever the tiling)."""
        if (steps := axis_steps(e)) is None:
            return
        dx, dr = steps
        if dx == 1 and abs(dr) > 1:
            self.x_contiguous_loads += 1
        elif dr == 1 and dx != 0:
            self.r_contiguous_loads += 1

    @property
    def outer_reduction(self) -> bool:
        """A reduction over a non-contiguous dim (most loads contiguous along x)."""
        return self.red and self.x_contiguous_loads > self.r_contiguous_loads

    def store(self, name, index, value, mode=None):
        e = simplify_index(sympy.sympify(index), {XINDEX: self.plan.numel, RINDEX: self.plan.rnumel})
        value = self._tensor(value)
        if mode is None:
            (self.loop_store_cache if self._in_loop() else self.store_cache)[(name, e)] = value
        if name not in self.args:
            return  # removed buffer: lives in registers only
        self._emit_store(name, e, value, self._lines(), mode)

    def _emit_store(self, name, e, value, lines, mode=None):
        dims = self._dims_of_index(e)
        full = dims | value.dims
        if mode == "atomic_add":
            # one addition per element of the node's iteration space, also along axes neither address nor value varies
            # on (three updates of one element whose index expression folded to a constant are three adds, not one)
            full = full.union(*(self._dims_of_index(i) for i in [*self.cur.index, *self.cur.rindex]))
        mask, mdims = self._mask(full)
        buf_dtype = self.plan.buffer(name).get_dtype()
        v = value.name if value.dtype == buf_dtype or buf_dtype == torch.bool and value.dtype == torch.bool \
            else f"{value.name}.to({TL_DTYPE[buf_dtype]})"
        if self.rounded.get(value.name, (None, None))[1] == buf_dtype:
            # a value rounded to the buffer's dtype: store the rounding itself
            # (``x.to(bf16)``), not ``x.to(bf16).to(fp32).to(bf16)``
            v = f"{self.rounded[value.name][0]}.to({TL_DTYPE[buf_dtype]})"
        ptr = f"{self.args[name]} + ({pyexpr(e.xreplace(self.numel_names))})"
        if (full | mdims) - dims or not dims:
            # a constant index gives a scalar pointer, but the value may be a [1] block
            # (``tl.full([1], ...)``): store through a block pointer of the value's shape
            ptr = f"tl.broadcast_to({ptr}, {self._shape(full | mdims)})"
        fn = "tl.atomic_add" if mode == "atomic_add" else "tl.store"
        if mode not in (None, "atomic_add"):
            raise NotImplementedError(f"Triton codegen: store mode {mode!r}")
        lines.append(f"{fn}({ptr}, {v}{', ' + mask if mask else ''})")

    def store_reduction(self, name, index, value):
        e = simplify_index(sympy.sympify(index), {XINDEX: self.plan.numel, RINDEX: self.plan.rnumel})
        lines = self.sections[self.cur.loop_id]["post"] if self.looped else self.body
        dt = self.plan.buffer(name).get_dtype()
        if dt in (torch.float16, torch.bfloat16) and isinstance(value, TVal) and value.const is None \
                and value.dtype == torch.float32:
            # eager rounds the result to its dtype: readers later in this kernel see that (s207 #10039)
            r = self.cse(f"{value.name}.to({TL_DTYPE[dt]}).to(tl.float32)", torch.float32, value.dims, lines=lines)
            self.rounded[r.name], value = (value.name, dt), r
        self.store_cache[(name, e)] = value
        if name in self.args:
            self._emit_store(name, e, value, lines)

    # ----------------------------------------------------------------- reductions
    _DEFAULT = {"sum": 0, "prod": 1, "any": 0, "max": "-inf", "min": "inf", "argmax": "-inf", "argmin": "inf"}

    def reduction(self, dtype, src_dtype, reduction_type, value):
        value = self._tensor(value)
        acc_dt = compute_dtype(dtype) if reduction_type not in ("argmax", "argmin") else value.dtype
        if reduction_type == "any":
            acc_dt = torch.int8
        tdt = TL_DTYPE[acc_dt if reduction_type not in ("argmax", "argmin") else value.dtype]
        if (default := self._DEFAULT[reduction_type]) in ("inf", "-inf"):
            default = f'float("{default}")' if value.dtype.is_floating_point else (
                str(torch.iinfo(value.dtype).min) if default == "-inf" else str(torch.iinfo(value.dtype).max))
        v = value.name
        if reduction_type == "any":
            v = f"({v} != 0).to(tl.int8)"
        elif value.dtype != acc_dt and reduction_type not in ("argmax", "argmin"):
            v = f"{v}.to({tdt})"
        full = "[XBLOCK, RBLOCK]"
        if value.dims != frozenset({"x", "r"}):
            v = f"tl.broadcast_to({v}, {full})"
        out_dims = frozenset({"x"})
        if not self.looped:
            lines = self.body
            if g := self._block_guard():  # padded lanes must not pollute the result
                masked = self.cse(f"tl.where({g}, {v}, {default})", acc_dt, {"x", "r"})
            else:
                masked = value if v == value.name else self.cse(v, acc_dt, {"x", "r"})
            if reduction_type in ("argmax", "argmin"):
                best = self.cse(f"{self._final('max' if reduction_type == 'argmax' else 'min', masked.name)}[:, None]",
                                value.dtype, out_dims, lines=lines)
                r = (f"red.min(tl.where({self._arg_match(masked.name, best.name, value.dtype)}, "
                     f"tl.broadcast_to(rindex, {full}), 2147483647), 1)[:, None].to(tl.int64)")
            else:
                r = f"{self._final(reduction_type, masked.name)}[:, None]"
            res = self.cse(r, acc_dt if reduction_type not in ("argmax", "argmin") else torch.int64,
                           out_dims, lines=lines)
            return self._after_reduction(res, reduction_type)
        if reduction_type == "sum" and config.triton_online_softmax:
            if (fused := self._online_sum_exp(value, v, acc_dt, tdt, full)) is not None:
                return self._after_reduction(fused, reduction_type)
        sec = self.sections[self.cur.loop_id]
        acc = f"acc{next(self.counter)}"
        sec["init"].append(f"{acc} = tl.full({full}, {default}, {tdt})")
        if reduction_type == "max" and acc_dt.is_floating_point:
            self.max_accs[f"{acc}_res"] = (acc, v, self.cur.loop_id)
        loop = sec["loop"]
        if reduction_type in ("argmax", "argmin"):
            idx = f"{acc}_idx"
            sec["init"].append(f"{idx} = tl.full({full}, 2147483647, tl.int64)")
            cmp = ">" if reduction_type == "argmax" else "<"
            g = self._block_guard()
            take = f"({v} {cmp} {acc})"
            if value.dtype.is_floating_point:  # the first NaN wins, as in eager
                take = f"({take} | (({v} != {v}) & ({acc} == {acc})))"
            # a lane's first element is always taken: a row equal to the start value
            # (all -inf for argmax, iinfo.min for ints) would never be taken otherwise
            take = f"({take} | ({idx} == 2147483647))"
            loop.append(f"{acc}_take = {g + ' & ' if g else ''}{take}")
            loop.append(f"{acc} = tl.where({acc}_take, {v}, {acc})")
            loop.append(f"{idx} = tl.where({acc}_take, tl.broadcast_to(rindex.to(tl.int64), {full}), {idx})")
            post = sec["post"]
            best = "max" if reduction_type == "argmax" else "min"
            post.append(f"{acc}_best = {self._final(best, acc)}[:, None]")
            post.append(f"{acc}_res = red.min(tl.where({self._arg_match(acc, acc + '_best', value.dtype)}, "
                        f"{idx}, 2147483647), 1)[:, None]")
            return TVal(f"{acc}_res", torch.int64, out_dims)
        combine = {"sum": f"{acc} + {v}", "prod": f"{acc} * {v}", "any": f"{acc} | {v}",
                   "max": f"tl.maximum({acc}, {v}{_nan(acc_dt)})",
                   "min": f"tl.minimum({acc}, {v}{_nan(acc_dt)})"}[reduction_type]
        loop.append(self._guarded(acc, combine))
        sec["post"].append(f"{acc}_res = {self._final(reduction_type, acc)}[:, None]")
        return self._after_reduction(TVal(f"{acc}_res", acc_dt, out_dims), reduction_type)

    @staticmethod
    def _arg_match(vals: str, best: str, dtype) -> str:
        """Lanes of ``vals`` holding the reduced ``best`` (argmax/argmin). ``red.max`` / ``red.min`` return NaN when a
        row holds one, and NaN != NaN: then the NaN lanes match (eager returns the first NaN's index)."""
        if not dtype.is_floating_point:
            return f"({vals} == {best})"
        return f"(({vals} == {best}) | (({best} != {best}) & ({vals} != {vals})))"

    def _online_sum_exp(self, value, v: str, acc_dt, tdt: str, full: str) -> Optional[TVal]:
        """``sum(exp(x - m))`` in the loop after the one computing ``m = max(x)`` (softmax, log_softmax, cross-entropy,
        logsumexp over long rows): compute it in the max's loop instead, with a running max per lane (the "online
        softmax" of Milakov & Gimelshein, 2018): ``s = s * exp(m_old - m_new) + exp(x - m_new)``, written with one exp
        per element (``e = exp(-|x - m_old|)``; ``s*e + 1`` if ``x > m_old`` else ``s + e``), and after the loop ``sum(s
        * exp(m - max(m)))``. Saves one pass over ``x``. Lanes whose max is still -inf contribute 0; a row of only -inf
        sums to NaN, as in two passes. Returns None unless the pattern matches exactly (same load in both loops)."""
        sid = self.cur.loop_id
        if not self.cur.in_loop or sid == 0 or v != value.name \
                or value.dims != frozenset({"x", "r"}) or acc_dt != torch.float32:
            return None
        loop = self.sections[sid]["loop"]
        defs = {l.split(" = ", 1)[0]: (i, l.split(" = ", 1)[1]) for i, l in enumerate(loop) if " = " in l}
        m = re.fullmatch(r"tl\.exp\((tmp\d+)\)", defs.get(value.name, (0, ""))[1])
        sub = m and re.fullmatch(r"\((tmp\d+) - (acc\d+_res)\)", defs.get(m.group(1), (0, ""))[1])
        if not sub or sub.group(2) not in self.max_accs:
            return None
        load_name, mres = sub.group(1), sub.group(2)
        acc_m, v_m, msid = self.max_accs[mres]
        prev = self.sections[msid]
        load_rhs = defs.get(load_name, (0, ""))[1]
        if msid != sid - 1 or not load_rhs.startswith("tl.load("):
            return None
        prev_defs = {l.split(" = ", 1)[0]: l.split(" = ", 1)[1] for l in prev["loop"] if " = " in l}
        if prev_defs.get(v_m) != load_rhs:
            return None
        chain = {value.name, m.group(1), load_name}
        if any(re.search(rf"\b{n}\b", l) for l in loop for n in chain
               if not l.startswith(tuple(f"{c} = " for c in chain))):
            return None  # another value of this loop uses the chain
        if (combine := self._guarded(acc_m, f"tl.maximum({acc_m}, {v_m}{_nan(torch.float32)})")) not in prev["loop"]:
            return None
        # rewrite: drop the chain from this loop, update a running sum in the max's loop
        self.sections[sid]["loop"] = [l for l in loop if not l.startswith(tuple(f"{c} = " for c in chain))]
        for k in [k for k, tv in self.loop_cse.items() if tv.name in chain]:
            del self.loop_cse[k]
        acc = f"acc{next(self.counter)}"
        prev["init"].append(f"{acc} = tl.full({full}, 0, {tdt})")
        i = prev["loop"].index(combine)
        ninf = 'float("-inf")'
        # one exp per element: of (x, m_prev) one is the new max, so the update is s * exp(m_prev - x) + 1 when x >
        # m_prev, else s + exp(x - m_prev); both exponents are -|x - m_prev| (half the exps of the two-exp form)
        prev["loop"][i:i + 1] = [
            f"{acc_m}_prev = {acc_m}",
            combine,
            f"{acc}_e = tl.exp(-tl.abs({v_m} - {acc_m}_prev))",
            self._guarded(acc, f"tl.where({acc_m} == {ninf}, 0.0, "
                               f"tl.where({v_m} > {acc_m}_prev, {acc} * {acc}_e + 1.0, {acc} + {acc}_e))"),
        ]
        # a row of only -inf: eager's exp(-inf - -inf) is NaN in every element
        prev["post"].append(f"{acc}_res = tl.where({mres} == {ninf}, float('nan'), red.sum(tl.where({acc_m} == {ninf}, "
                            f"0.0, {acc} * tl.exp({acc_m} - {mres})), 1)[:, None])")
        return TVal(f"{acc}_res", acc_dt, frozenset({"x"}))

    def _after_reduction(self, res: TVal, reduction_type) -> TVal:
        return TVal(f"({res.name} != 0)", torch.bool, res.dims) if reduction_type == "any" else res

    @staticmethod
    def _final(reduction_type, v) -> str:
        # red.*: NaN-propagating tl.reduce (GPU) / NumPy (interpreter): coil.runtime.triton_reductions, triton_libdevice
        fn = {"sum": "sum", "max": "max", "min": "min", "any": "max", "prod": "prod"}[reduction_type]
        return f"red.{fn}({v}, 1)"

    # ----------------------------------------------------------------- values
    def _tensor(self, v) -> TVal:
        """Make constants real tensors (so ``.to`` and reductions work on them)."""
        if isinstance(v, TVal) and v.const is not None:
            shape = "[1]" if not self.red else "[1, 1]"
            return self.cse(f"tl.full({shape}, {v.name}, {TL_DTYPE[v.dtype]})", v.dtype, frozenset())
        return v

    def constant(self, value, dtype):
        if not dtype.is_floating_point:
            value = _convert(value, dtype)
        dtype = compute_dtype(dtype)
        # const: the dtype's value, for folded casts (full_like(x, 1e30) as float64: s90 #1715)
        v = TVal(_lit(value, dtype), dtype, frozenset(), const=_convert(value, dtype))
        if dtype == torch.float32 and 0 < abs(value) < 2.0 ** -126:
            # Triton types a Python float below fp32's normal range as fp64: where(m,
            # 1e-40, 0.0) became an fp64 value (fuzz s33 #395)
            return self._tensor(v)
        return v

    def index_expr(self, expr, dtype):
        if (e := simplify_index(sympy.sympify(expr), {XINDEX: self.plan.numel, RINDEX: self.plan.rnumel})).is_Integer:
            return self.constant(int(e), dtype)
        dims = self._dims_of_index(e)
        text = pyexpr(e)
        if self.index_dtype == "tl.int32" and not _fits_int32(e, {XINDEX: self.plan.numel, RINDEX: self.plan.rnumel}):
            # a value past int32 (arange(0, 50000**2, 50000), a start of 2**40) in int64
            text = pyexpr(e.subs({s: sym(f"{s.name}.to(tl.int64)") for s in e.free_symbols}))
        return self.cse(f"({text}).to({TL_DTYPE[dtype]})", dtype, dims)

    def to_dtype(self, x, dtype, src_dtype=None):
        if isinstance(x, TVal) and x.const is not None:
            # a cast of a constant folds, rounding as eager's (the cast of 2.5 to int64 in
            # to(int64).to(float64) is 2.0, not 2.5)
            return self.constant(_convert(x.const, dtype), dtype)
        if isinstance(x, TVal) and self.rounded.get(x.name, (None, None))[1] == dtype:
            return x  # rounded to it already
        if compute_dtype(dtype) != dtype and isinstance(x, TVal) and x.const is None \
                and x.dtype != dtype:
            # explicit cast to fp16/bf16: round, then compute in fp32 again. From other types than fp32/fp16 through
            # fp32 first, as eager's conversions do (Triton's CPU interpreter turns bool/int/fp64 -> bf16 into garbage)
            src = x.name if x.dtype in (torch.float32, torch.float16) else f"{x}.to(tl.float32)"
            v = self.cse(f"{src}.to({TL_DTYPE[dtype]}).to({TL_DTYPE[compute_dtype(dtype)]})",
                         compute_dtype(dtype), x.dims)
            self.rounded[v.name] = (src, dtype)
            return v
        dtype = compute_dtype(dtype)
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self.cse(f"({x} != 0)", torch.bool, x.dims)
        return self.cse(f"{x}.to({TL_DTYPE[dtype]})", dtype, x.dims)

    def indirect_indexing(self, x, size, check=True, wrap_neg=True):
        x = self._tensor(x)
        size = pyexpr(sympy.sympify(size))  # a literal, or a size symbol (kernel argument)
        # negative indices always wrap here, ``wrap_neg`` or not: the bounds check below is a tl.device_assert, active
        # only in Triton's debug mode (and always under the interpreter: coil.runtime.triton_libdevice), so an index
        # that eager would reject must at least not address memory before the tensor
        v = self.cse(f"tl.where({x} < 0, {x} + {size}, {x})", x.dtype, x.dims)
        if check:
            mask, _ = self._mask(x.dims)
            w = v if wrap_neg else x    # (gather, index_select, embedding: eager rejects < 0)
            cond = f"(0 <= {w}) & ({w} < {size})"
            if mask:
                cond = f"({cond}) | ~({mask})"
            where = describe_origin(current_origin())  # the user's line, as C++ kernels report it
            msg = "index out of bounds" + (f" for dimension with size {size}" if size.isdigit() else "") + (
                f" -- from {where}" if where else "")
            self._lines().append(f"tl.device_assert({cond}, {msg!r})")
        self.indirect_dims[v.name] = x.dims
        return sym(v.name)

    def masked(self, mask, body, other):
        mask = self._tensor(mask)
        self.mask_stack.append(mask)
        try:
            result = body()
        finally:
            self.mask_stack.pop()
        return self.where(mask, result, self.constant(other, result.dtype) if not isinstance(other, TVal) else other)

    def where(self, c, a, b):
        dt = a.dtype if (isinstance(a, TVal) and a.const is None) else b.dtype
        a, b = self._fold_consts(a, b)  # (two Python literals typed it int32/fp32: s104 #2584)
        return self._op(f"tl.where({c}, {a}, {b})", dt, c, a, b)

    def load_seed(self, name, offset):
        return self.cse(f"tl.load({self.args[name]} + {int(offset)})", torch.int64, frozenset())

    def rand(self, seed, offset, fn="rng.rand"):
        offset = self._tensor(offset)
        return self.cse(f"{fn}({seed}, ({offset}).to(tl.uint32))", torch.float32, offset.dims)

    def randn(self, seed, offset):
        return self.rand(seed, offset, "rng.randn")

    def _fold_consts(self, *args) -> tuple:
        """Operands of an op whose operands are all constants, as ``[1]`` tensors of their dtypes: the op then runs in
        tensor arithmetic (wrapping in uint8, as eager), not on Python ints (``tl.full([1], 2 * 253, tl.uint8)``
        overflowed) or on a helper's block result (``tl.full([1], _pow_int(...))``: "Cannot splat a block tensor")."""
        if all(isinstance(a, TVal) and a.const is not None for a in args):
            return tuple(self._tensor(a) for a in args)
        return args

    def _op(self, expr, dtype, *args) -> TVal:
        return self.cse(expr, dtype, frozenset().union(*[a.dims for a in args if isinstance(a, TVal)]))

    def _small_int_pow(self, a, b) -> Optional[TVal]:
        """``a ** k`` for a constant integer-valued ``k`` with ``1 <= |k| <= 4`` as multiplies (and one
        division for ``k < 0``) instead of ``libdevice.pow``, which costs tens of instructions per element
        (rms_norm's ``x.pow(2)`` ran at 62% of copy bandwidth on an H200). Integer powers ``k >= 1`` of
        integer tensors too. Returns None when the rewrite does not apply."""
        if not (isinstance(a, TVal) and isinstance(b, TVal)) or a.const is not None \
                or b.const is None or isinstance(b.const, bool):
            return None
        try:
            k = float(b.const)
        except (TypeError, ValueError):
            return None
        if not k.is_integer() or not 1 <= abs(k) <= 4:
            return None
        k = int(k)
        if a.dtype == torch.bool or (k < 0 and not a.dtype.is_floating_point):
            return None
        if not a.dtype.is_floating_point and b.dtype.is_floating_point:
            return None  # int ** float promotes to float: leave to libdevice.pow
        n = abs(k)
        v = a if n == 1 else self.mul(a, a)
        v = self.mul(v, a) if n == 3 else self.mul(v, v) if n == 4 else v
        if k < 0:
            v = self._op(f"(1.0 / {v})", a.dtype, v)
        return v

    def __getattr__(self, op):
        if op in _BIN:
            fmt = _BIN[op]
            def f(a, b):
                a, b = self._fold_consts(a, b)
                if op == "pow" and (small := self._small_int_pow(a, b)) is not None:
                    return small
                dt = torch.bool if op in _BOOL_OUT else (a.dtype if a.const is None else b.dtype)
                if op == "pow" and not dt.is_floating_point and dt != torch.bool:
                    # libdevice.pow is for floats (Triton rejects ints; the interpreter raises for negative exponents)
                    return self._op(f"_pow_int({self._tensor(a)}, {self._tensor(b)})", dt, a, b)
                if op == "fmod" and not dt.is_floating_point:
                    # libdevice.fmod is float-only (the GPU compiler rejects int64, the interpreter does not); Triton's
                    # integer % truncates like C's, as torch.fmod does. Tensors on both sides: a Python % would floor.
                    a, b = self._tensor(a), self._tensor(b)
                    return self._op(f"({a} % {b})", dt, a, b)
                if op == "add" and dt == torch.bool:  # bool + bool is logical or in torch
                    return self._op(f"({self._tensor(a)} | {self._tensor(b)})", dt, a, b)
                if op in ("maximum", "minimum") and dt.is_floating_point:  # a -0.0/+0.0 tie: the second operand
                    # under the interpreter (numpy), as eager's CPU vector body (its scalar loop gives the first)
                    return self._op(f"tl.{op}({self._tensor(a)}, {self._tensor(b)}{_nan(dt)})", dt, a, b)
                if op in _FUNC_BIN or (op == "truediv" and b.const is not None and b.const == 0):
                    # (a constant 0 divisor as a tensor: 0.0 / 0.0 in the source is a Python
                    # ZeroDivisionError, a tensor division gives IEEE nan/inf; mean over an empty dim)
                    a, b = self._tensor(a), self._tensor(b)
                return self._op(fmt.format(a=a, b=b, kind="float" if dt.is_floating_point else "int"), dt, a, b)
            return f
        if op in _UN:
            fmt = _UN[op]
            def g(x):
                x, = self._fold_consts(x)
                if op in ("floor", "ceil", "round", "trunc") and not x.dtype.is_floating_point:
                    return x  # identity on integers (libdevice's versions are float-only)
                if op in _INT_UN and not x.dtype.is_floating_point:
                    # libdevice's versions are float-only: the GPU compiler rejects ints
                    return self._op(_INT_UN[op].format(x=self._tensor(x)), torch.bool, x)
                dt = torch.bool if op in _BOOL_OUT else x.dtype
                if op == "ndtr" and dt == torch.float64:  # _ndtr is fp32-accurate
                    return self._op(f"(0.5 * libdevice.erfc({self._tensor(x)} * -0.7071067811865476))", dt, x)
                if op in _FUNC_UN or (op == "reciprocal" and x.const is not None and x.const == 0):
                    x = self._tensor(x)
                return self._op(fmt.format(x=x), dt, x)
            return g
        raise NotImplementedError(f"Triton codegen: ops.{op}")


_BOOL_OUT = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
             "logical_not", "isnan", "isinf", "signbit"}
_BIN = {"add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "truediv": "({a} / {b})",
        "eq": "({a} == {b})", "ne": "({a} != {b})", "lt": "({a} < {b})", "le": "({a} <= {b})", "gt": "({a} > {b})",
        "ge": "({a} >= {b})", "logical_and": "({a} & {b})", "logical_or": "({a} | {b})", "logical_xor": "({a} ^ {b})",
        "bitwise_and": "({a} & {b})", "bitwise_or": "({a} | {b})", "bitwise_xor": "({a} ^ {b})",
        "left_shift": "({a} << {b})", "right_shift": "({a} >> {b})", "maximum": "tl.maximum({a}, {b})",
        "minimum": "tl.minimum({a}, {b})", "pow": "libdevice.pow({a}, {b})", "atan2": "libdevice.atan2({a}, {b})",
        "hypot": "libdevice.hypot({a}, {b})", "copysign": "libdevice.copysign({a}, {b})",
        "nextafter": "libdevice.nextafter({a}, {b})", "fmod": "libdevice.fmod({a}, {b})",
        "truncdiv": "_truncdiv({a}, {b})", "floordiv": "_floordiv({a}, {b})",
        "remainder": "_remainder_{kind}({a}, {b})"}
_FUNC_BIN = {k for k, v in _BIN.items() if not v.startswith("(")}
_UN = {"abs": "tl.abs({x})", "neg": "(-{x})", "exp": "tl.exp({x})", "exp2": "libdevice.exp2({x})",
       "expm1": "libdevice.expm1({x})", "log": "tl.log({x})", "log2": "libdevice.log2({x})",
       "log10": "libdevice.log10({x})", "log1p": "libdevice.log1p({x})", "sqrt": "tl.sqrt({x})",
       "rsqrt": "tl.rsqrt({x})", "sin": "tl.sin({x})", "cos": "tl.cos({x})", "tan": "libdevice.tan({x})",
       "asin": "libdevice.asin({x})", "acos": "libdevice.acos({x})", "atan": "libdevice.atan({x})",
       "sinh": "libdevice.sinh({x})", "cosh": "libdevice.cosh({x})", "tanh": "libdevice.tanh({x})",
       "asinh": "libdevice.asinh({x})", "acosh": "libdevice.acosh({x})", "atanh": "libdevice.atanh({x})",
       "erf": "tl.erf({x})", "erfc": "libdevice.erfc({x})", "erfinv": "libdevice.erfinv({x})",
       "sigmoid": "_sigmoid({x})", "floor": "tl.floor({x})", "ceil": "tl.ceil({x})",
       "round": "libdevice.nearbyint({x})", "trunc": "libdevice.trunc({x})", "sign": "_sign({x})",
       "reciprocal": "(1.0 / {x})", "bitwise_not": "(~{x})", "logical_not": "({x} == 0)", "isnan": "({x} != {x})",
       "isinf": "libdevice.isinf({x})", "lgamma": "libdevice.lgamma({x})", "signbit": "libdevice.signbit({x})",
       "ndtr": "_ndtr({x})"}
_FUNC_UN = {k for k, v in _UN.items() if not v.startswith("(")}
#: Integer and bool spellings of float-only libdevice predicates.
_INT_UN = {"isinf": "({x} != {x})", "signbit": "({x} < 0)"}

#: Helpers every kernel module defines (integer division with Python semantics etc.): the Triton
#: source in ``prelude.txt``, as the C++ backend's helpers are ``cpp/prelude.h``.
with open(os.path.join(os.path.dirname(__file__), "prelude.txt")) as _f:
    PRELUDE = _f.read()
