"""Index arithmetic for the loop IR: sympy symbols, integer division, simplification.

Sizes, strides and index expressions are sympy expressions everywhere in coil's IR
(static shapes make them Integers today; symbolic sizes will be Symbols).

- :class:`FloorDiv` and :class:`ModularIndexing`-style :class:`Mod` are our own sympy
  functions for non-negative integer division (sympy's ``floor``/``Mod`` are slow and
  simplify unpredictably).
- :func:`simplify_index` canonicalizes an index expression so that two expressions for
  the same element compare equal: it folds ``Mod(y, b)*k + FloorDiv(y, b)*b*k -> y*k``
  (the pattern that splitting a flat index into dims and re-linearizing produces) and
  drops divisions of variables by bounds they cannot reach.
- ``XINDEX`` / ``RINDEX`` are the kernel-level iteration symbols every code generator
  sees (see docs/codegen.md).
"""
from __future__ import annotations

import functools
import math
from typing import Iterable, Sequence

import sympy

XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)


def sym(name: str) -> sympy.Symbol:
    """A non-negative integer index symbol (loop variable) called ``name``."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


def as_expr(x) -> sympy.Expr:
    """Convert an int / SymInt-free value to a sympy expression."""
    if isinstance(x, sympy.Basic):
        return x
    return sympy.Integer(int(x))


class FloorDiv(sympy.Function):
    """``a // b`` for a >= 0, b > 0 (integer division of index expressions)."""

    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv):
            return FloorDiv(a.args[0], a.args[1] * b)
        if b.is_Integer:
            # (k*b*y + rest) // b -> k*y + rest // b when rest >= 0 ((rindex + 1024*(xindex
            # // 3072)) // 512 in split bias-gradient reductions became 2*(xindex // 3072)
            # + rindex // 512). Only for a provably non-negative rest: the generated code
            # divides with C's / and Triton's //, which truncate, and a negative rest
            # ((30 - i) // 6 -> 5 + (-i) // 6) gave wrong indices (user report 5)
            if a.is_Add:
                whole, rest = [], []
                for t in a.args:
                    c, _ = t.as_coeff_Mul()
                    (whole if c.is_Integer and int(c) % int(b) == 0 else rest).append(t)
                if whole and (not rest or _is_nonneg(sympy.Add(*rest))):
                    out = sympy.Add(*[t / b for t in whole])
                    return out + FloorDiv(sympy.Add(*rest), b) if rest else out
            c, rest = a.as_coeff_Mul()
            if c.is_Integer and int(c) % int(b) == 0:
                return (c / b) * rest
        return None

    def _sympystr(self, printer):
        return f"({printer._print(self.args[0])} // {printer._print(self.args[1])})"


class Mod(sympy.Function):
    """``a % b`` for a >= 0, b > 0."""

    nargs = (2,)
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a, b):
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        if b.is_Integer and a.is_Add:
            # drop multiples of b, unless what is left may be negative: the generated
            # code's % (C, Triton) keeps the sign of the dividend, so Mod(30 - i, 6) ->
            # Mod(-i, 6) gave negative indices (user report 5)
            kept = [t for t in a.args
                    if not (t.as_coeff_Mul()[0].is_Integer and int(t.as_coeff_Mul()[0]) % int(b) == 0)]
            if len(kept) < len(a.args) and (not kept or _is_nonneg(sympy.Add(*kept))):
                return Mod(sympy.Add(*kept), b)
        if b.is_Integer:
            c, rest = a.as_coeff_Mul()
            if c.is_Integer and int(c) % int(b) == 0:
                return sympy.Integer(0)
        return None

    def _sympystr(self, printer):
        return f"({printer._print(self.args[0])} % {printer._print(self.args[1])})"


def upper_bound(e: sympy.Expr, bounds: dict):
    """An exclusive upper bound of a non-negative index expression, or None.
    ``bounds`` maps loop symbols to their exclusive upper bounds."""
    if e.is_Integer:
        return int(e) + 1
    if e.is_Symbol:
        return bounds.get(e)
    if isinstance(e, Mod):
        b = e.args[1]
        return int(b) if b.is_Integer else None
    if isinstance(e, FloorDiv):
        ub = upper_bound(e.args[0], bounds)
        b = e.args[1]
        if ub is None or not b.is_Integer:
            return None
        return (ub - 1) // int(b) + 1
    if e.is_Mul:
        c, rest = e.as_coeff_Mul()
        if c.is_Integer and int(c) >= 0:
            ub = upper_bound(rest, bounds)
            return None if ub is None else (ub - 1) * int(c) + 1
        return None
    if e.is_Add:
        total = 0
        for t in e.args:
            ub = upper_bound(t, bounds)
            if ub is None:
                return None
            total += ub - 1
        return total + 1
    return None


def _nonneg_below(e: sympy.Expr, b, bounds: dict) -> bool:
    ub = upper_bound(e, bounds)
    return ub is not None and b.is_Integer and ub <= int(b) and _is_nonneg(e)


def _is_nonneg(e: sympy.Expr) -> bool:
    if e.is_Integer:
        return int(e) >= 0
    if e.is_Symbol or isinstance(e, (Mod, FloorDiv)):
        return True
    if e.is_Mul:
        return all(_is_nonneg(t) for t in e.args)
    if e.is_Add:
        return all(_is_nonneg(t) for t in e.args)
    return False


def _split_small(a: sympy.Expr, b, bounds: dict):
    """Write ``a = g*w + r`` with ``g`` dividing ``b``, ``w >= 0`` and ``0 <= r < g``
    (``r`` from terms whose loop bounds keep them small): returns ``(g, w, r)`` with the
    largest such ``g``, or None."""
    if not (b.is_Integer and a.is_Add):
        return None
    terms = sympy.Add.make_args(a)
    gs = set()
    for t in terms:
        c, _ = t.as_coeff_Mul()
        if c.is_Integer and math.gcd(int(c), int(b)) > 1:
            gs.add(math.gcd(int(c), int(b)))
    for g in sorted(gs, reverse=True):
        whole, rest = [], []
        for t in terms:
            c, _ = t.as_coeff_Mul()
            (whole if c.is_Integer and int(c) % g == 0 else rest).append(t)
        if whole and rest:
            w, r = sympy.Add(*[t / g for t in whole]), sympy.Add(*rest)
            if _is_nonneg(w) and _nonneg_below(r, sympy.Integer(g), bounds):
                return g, w, r
    return None


def _range_rules(e: sympy.Expr, bounds: dict) -> sympy.Expr:
    """``a // b -> 0`` and ``a % b -> a`` when ``0 <= a < b``; for ``a = g*w + r`` with
    ``g | b`` and ``0 <= r < g`` (from the loop bounds), ``a // b -> w // (b/g)`` and
    ``a % b -> g*(w % (b/g)) + r`` (e.g. ``(rindex + 128*xindex) // 8192 -> xindex // 64``
    for ``rindex < 128``)."""
    def fd(a, b):
        if _nonneg_below(a, b, bounds):
            return sympy.Integer(0)
        sp = _split_small(a, b, bounds)
        if sp is not None:
            g, w, _ = sp
            return FloorDiv(w, sympy.Integer(int(b) // g))
        return FloorDiv(a, b)

    def md(a, b):
        if _nonneg_below(a, b, bounds):
            return a
        sp = _split_small(a, b, bounds)
        if sp is not None:
            g, w, r = sp
            return g * Mod(w, sympy.Integer(int(b) // g)) + r
        return Mod(a, b)

    return e.replace(lambda x: isinstance(x, FloorDiv), lambda x: fd(*x.args)).replace(
        lambda x: isinstance(x, Mod), lambda x: md(*x.args))


def _fold_pairs(e: sympy.Expr) -> sympy.Expr:
    """Fold split-and-relinearize patterns until nothing changes:
    ``Mod(y,b)*k + FloorDiv(y,b)*b*k -> y*k`` and
    ``Mod(y,b)*k + Mod(FloorDiv(y,b),c)*b*k -> Mod(y,b*c)*k``."""
    changed = True
    while changed:
        changed = False
        terms: dict = {}
        for t in sympy.Add.make_args(sympy.expand(e)):
            c, a = t.as_coeff_Mul()
            terms[a] = terms.get(a, 0) + c
        for atom, k in list(terms.items()):
            if not isinstance(atom, Mod):
                continue
            y, b = atom.args
            partner = FloorDiv(y, b)
            if terms.get(partner) == k * b:
                del terms[atom], terms[partner]
                terms[y] = terms.get(y, 0) + k
                changed = True
                break
            for other, ok in terms.items():
                if (isinstance(other, Mod) and other.args[0] == partner and ok == k * b):
                    del terms[atom], terms[other]
                    new = Mod(y, b * other.args[1])
                    terms[new] = terms.get(new, 0) + k
                    changed = True
                    break
            if changed:
                break
        e = sympy.Add(*[c * a for a, c in terms.items()])
    return e


def simplify_index(e: sympy.Expr, bounds: dict | None = None) -> sympy.Expr:
    """Canonical form of an index expression (see module docstring); ``bounds`` maps
    loop symbols to exclusive upper bounds (enables ``x // b -> 0`` for ``x < b``)."""
    if e.is_Integer or e.is_Symbol:
        return e
    return _simplify(e, tuple(sorted(((k, int(v)) for k, v in (bounds or {}).items()), key=str)))


@functools.lru_cache(maxsize=65536)
def _simplify(e: sympy.Expr, bounds: tuple) -> sympy.Expr:
    b = dict(bounds)
    e = sympy.expand(e)
    e = _range_rules(e, b)
    e = _fold_pairs(e)
    return sympy.expand(_range_rules(e, b))


def product(xs: Iterable) -> sympy.Expr:
    out = sympy.Integer(1)
    for x in xs:
        out = out * x
    return out


def contiguous_strides(size: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """Row-major strides for ``size`` (sizes of 1 get the stride of the next dim)."""
    strides = []
    acc = sympy.Integer(1)
    for s in reversed(list(size)):
        strides.append(acc)
        acc = acc * s
    return list(reversed(strides))


def linear_index(index: Sequence[sympy.Expr], size: Sequence[sympy.Expr]) -> sympy.Expr:
    """Row-major flat position of ``index`` in a tensor of ``size``."""
    return sum((i * s for i, s in zip(index, contiguous_strides(size))), sympy.Integer(0))


def unflatten(flat: sympy.Expr, size: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """Inverse of :func:`linear_index`: per-dim indices of flat position ``flat``.

    A ``size`` with a zero extent has no elements, so no index is ever evaluated:
    every dim gets 0 (instead of a division by zero)."""
    if any(s == 0 for s in size):
        return [sympy.Integer(0)] * len(size)
    out = []
    stride = product(size)
    for i, s in enumerate(size):
        stride = stride / s if s != 0 else stride
        v = FloorDiv(flat, stride)
        if i > 0:
            v = Mod(v, s)
        out.append(v if s != 1 else sympy.Integer(0))
    return out


def pyexpr(e: sympy.Expr) -> str:
    """Print an index expression as Python/Triton source (``//`` and ``%`` for FloorDiv
    and Mod; integer-only arithmetic). Deterministic: same expression, same text."""
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, FloorDiv):
        return f"({_paren(e.args[0])} // {_paren(e.args[1])})"
    if isinstance(e, Mod):
        return f"({_paren(e.args[0])} % {_paren(e.args[1])})"
    if e.is_Add:
        terms = sorted(e.args, key=lambda t: (t.is_Integer, sympy.default_sort_key(t)))
        out = pyexpr(terms[0])
        for t in terms[1:]:
            c, rest = t.as_coeff_Mul()
            if c.is_Integer and int(c) < 0:
                out += f" - {pyexpr(-t)}"
            else:
                out += f" + {pyexpr(t)}"
        return out
    if e.is_Mul:
        c, rest = e.as_coeff_Mul()
        parts = [_paren(a) for a in sorted(sympy.Mul.make_args(rest), key=sympy.default_sort_key)]
        if c == -1:
            return "-" + " * ".join(parts)
        if c != 1:
            parts = [str(int(c)) if c.is_Integer else str(c)] + parts
        return " * ".join(parts)
    if e.is_Pow and e.args[1].is_Integer and int(e.args[1]) > 0:
        return " * ".join([_paren(e.args[0])] * int(e.args[1]))
    if isinstance(e, sympy.Min):
        return _nest("min", e.args)
    if isinstance(e, sympy.Max):
        return _nest("max", e.args)
    raise NotImplementedError(f"cannot print index expression {e!r}")


def _nest(fn, args):
    out = pyexpr(args[0])
    for a in args[1:]:
        out = f"{fn}({out}, {pyexpr(a)})"
    return out


def _paren(e: sympy.Expr) -> str:
    s = pyexpr(e)
    return f"({s})" if e.is_Add else s
