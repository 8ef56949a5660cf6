"""Map a buffer's loop variables onto a kernel's iteration space.

A kernel iterates ``xindex in [0, numel)`` and, for reductions, ``rindex in [0, rnumel)``
(coil.ir.symbols.XINDEX / RINDEX). :func:`kernel_index` expresses one ComputedBuffer's loop variables in
those two symbols (a reduction, a pointwise buffer once per ``xindex``, or one inside the reduction loop
whose trailing dims come from ``rindex``: docs/scheduler.md, "Iteration spaces"). :func:`kernel_deps`
gives its loads and stores in kernel symbols, canonicalized by :func:`coil.ir.symbols.simplify_index`:
two equal expressions denote the same element, which fusion legality and store→load forwarding rely on."""
from __future__ import annotations

import functools
from typing import Optional

import sympy

from coil.ir.handlers import DependencyRecorder
from coil.ir.symbols import (RINDEX, XINDEX, FloorDiv, Mod, as_size, current_shape_env, hint, product, simplify_index)


def decompose(var: sympy.Symbol, sizes: list) -> list:
    """Row-major per-dim indices of flat index ``var`` over ``sizes`` (all 0 when a
    size is 0: an empty iteration space evaluates no index)."""
    if any(s == 0 for s in sizes):
        return [sympy.Integer(0)] * len(sizes)
    out = []
    for d, s in enumerate(sizes):
        if s == 1:
            out.append(sympy.Integer(0))
            continue
        stride = product(sizes[d + 1:])
        v = FloorDiv(var, stride) if stride != 1 else var
        if d > 0 and any(x != 1 for x in sizes[:d]):
            v = Mod(v, s)
        out.append(v)
    return out


def split_ranges(sizes: list, rnumel) -> Optional[tuple[list, list, Optional[int]]]:
    """Split ``sizes`` into (x_sizes, r_sizes, split_dim) with ``prod(r_sizes) == rnumel``. ``split_dim`` is the dim cut
    in two (its outer part ends x_sizes, inner part starts r_sizes), or None. Returns None when impossible. A dim is cut
    in two only when the quotient is exact (an integer, or an exact expression of symbolic sizes)."""
    rem, r_sizes, d = sympy.sympify(rnumel), [], len(sizes) - 1
    while rem != 1 and d >= 0:
        if (s := sympy.sympify(sizes[d])) == 1:
            r_sizes.insert(0, sympy.Integer(1))
        elif sympy.denom(q := sympy.expand(rem / s)) == 1:
            r_sizes.insert(0, s)
            rem = q
        elif sympy.denom(sympy.expand(s / rem)) == 1:
            return list(sizes[:d]) + [sympy.expand(s / rem)], [rem] + r_sizes, d
        else:
            return None
        d -= 1
    return (list(sizes[: d + 1]), r_sizes, None) if rem == 1 else None


@functools.lru_cache(maxsize=None)
def _kernel_index_cached(ranges: tuple, rranges: tuple, is_red: bool, numel, rnumel):
    numel, rnumel = as_size(numel), as_size(rnumel)
    if is_red:
        if as_size(product(ranges)) != numel or as_size(product(rranges)) != rnumel:
            return None
        return decompose(XINDEX, list(ranges)), decompose(RINDEX, list(rranges)), True
    if (n := as_size(product(ranges))) == numel:
        return decompose(XINDEX, list(ranges)), [], rnumel == 1
    if rnumel != 1 and n == as_size(numel * rnumel):
        if (sp := split_ranges(list(ranges), rnumel)) is None:
            return None
        xs, rs, split = sp
        xv, rv = decompose(XINDEX, xs), decompose(RINDEX, rs)
        if split is None:
            return xv + rv, [], True
        return xv[:-1] + [xv[-1] * rs[0] + rv[0]] + rv[1:], [], True
    return None


def axis_steps(e) -> Optional[tuple[int, int]]:
    """``(dx, dr)``: how far kernel-level index expression ``e`` moves for one step of
    ``xindex`` and of ``rindex`` from (0, 0), or None for an indirect or non-integer
    index. Used to tell which kernel axis a load or store is contiguous along. Cached without a ShapeEnv."""
    return _axis_steps(e) if current_shape_env() is None else _axis_steps.__wrapped__(e)


@functools.lru_cache(maxsize=65536)
def _axis_steps(e) -> Optional[tuple[int, int]]:
    sizes = {s for s in e.free_symbols if s not in (XINDEX, RINDEX) and s.is_positive}
    if sizes and current_shape_env() is not None:
        e = e.subs({s: hint(s) for s in sizes})  # symbolic strides: the example sizes tell the axis (a heuristic)
    if not e.free_symbols <= {XINDEX, RINDEX}:
        return None
    try:
        at = lambda xv, rv: int(e.subs({XINDEX: xv, RINDEX: rv}))
        base = at(0, 0)
        return at(1, 0) - base, at(0, 1) - base
    except (TypeError, ValueError):
        return None


def kernel_index(buf, numel, rnumel):
    """(index, rindex, in_loop) for ``buf`` in a kernel of (numel, rnumel), or None."""
    return _kernel_index_cached(tuple(buf.get_ranges()), tuple(buf.get_reduction_ranges()),
                                buf.is_reduction(), sympy.sympify(numel), sympy.sympify(rnumel))


class KernelDeps:
    """Loads/stores of one buffer in kernel symbols (canonical index expressions)."""

    def __init__(self, loads, stores, in_loop):
        self.loads, self.stores, self.in_loop = loads, stores, in_loop


#: (id(buffer), numel, rnumel) -> (buffer, KernelDeps): one graph's, cleared by each Scheduler
_deps_cache: dict = {}


def kernel_deps(buf, numel, rnumel) -> Optional[KernelDeps]:
    numel, rnumel = as_size(numel), as_size(rnumel)
    key = (id(buf), numel, rnumel)
    if (hit := _deps_cache.get(key)) is not None and hit[0] is buf:
        return hit[1]
    if (ki := kernel_index(buf, numel, rnumel)) is None:
        res = None
    else:
        index, rindex, in_loop = ki
        rec, bounds = DependencyRecorder.record(buf, index, rindex), {XINDEX: numel, RINDEX: rnumel}
        res = KernelDeps([(n, simplify_index(sympy.sympify(e), bounds)) for n, e in rec.loads],
                         [(n, simplify_index(sympy.sympify(e), bounds)) for n, e in rec.stores], in_loop)
    _deps_cache[key] = (buf, res)
    return res
