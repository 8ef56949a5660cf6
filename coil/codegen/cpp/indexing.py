"""Index expressions → C++ for the C++ backend, with loop splitting.

A kernel iterates a flat ``xindex`` (and ``rindex``); index expressions reach it as sympy expressions in those symbols,
using :class:`coil.ir.symbols.FloorDiv` and :class:`coil.ir.symbols.Mod` to recover tensor dims. Printed literally that
is one division and one modulo per element per dim — the main cost of naive CPU kernels.

:func:`split_plan` looks at every expression of a kernel and, when each use of the flat symbol is ``s // p``, ``s % p``
or ``(s // a) % b`` with split points that form a divisibility chain ``1 < p1 | p2 | ... | pk | numel``, replaces the
flat symbol by nested loop variables ``v0`` (innermost, extent ``p1``), ``v1`` (``p2/p1``) ... so ``s // pj`` becomes
``sum_{i>=j} v_i * (p_i/p_j)`` and ``s % pj`` becomes ``sum_{i<j} v_i * p_i``: no division left in the inner loop.
Anything else (an unrecognized use of the symbol) keeps the flat loop."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import sympy

from coil.ir.symbols import FloorDiv, IndexPrinter, Mod, floor_safe, hint, simplify_index


def canonicalize(e: sympy.Expr, bounds: dict) -> sympy.Expr:
    """Simplify ``e`` bottom-up so split analysis sees plain ``s // p`` / ``s % p``.

    Applies :func:`coil.ir.symbols.simplify_index` inside every FloorDiv/Mod argument (it folds ``128*(x//128) + x%128
    -> x`` only at the top of an expression) and ``(a % m) // d -> (a // d) % (m/d)`` when ``d | m``, ``(a % m1) % m2 ->
    a % m2`` when ``m2 | m1``. ``bounds`` maps symbols to exclusive upper bounds."""
    if not isinstance(e, sympy.Basic) or e.is_Atom:
        return e
    args = [canonicalize(a, bounds) for a in e.args]
    if isinstance(e, (FloorDiv, Mod)):
        a, b = simplify_index(args[0], bounds), args[1]
        if b.is_Integer and isinstance(a, Mod) and a.args[1].is_Integer:
            m = int(a.args[1])
            if isinstance(e, FloorDiv) and m % int(b) == 0:
                return simplify_index(Mod(FloorDiv(a.args[0], b), m // int(b)), bounds)
            if isinstance(e, Mod) and m % int(b) == 0:
                return simplify_index(Mod(a.args[0], b), bounds)
        return simplify_index(type(e)(a, b), bounds)
    return e.func(*args) if args != list(e.args) else e


@dataclass
class Split:
    """Loop split of one flat symbol: ``points`` = [1, p1, ..., pk], extents of the vars."""

    symbol: sympy.Symbol
    numel: int
    points: list = field(default_factory=lambda: [1])
    prefix: str = "x"
    _num = staticmethod(int)  # a split point as :meth:`div` / :meth:`mod` / :meth:`divmod` take it

    @property
    def vars(self) -> list:
        return [sympy.Symbol(f"{self.prefix}{i}", integer=True, nonnegative=True) for i in range(len(self.points))]

    @property
    def extents(self) -> list[int]:
        if self.points == [1]:
            return [self.numel]
        pts = self.points + [self.numel]
        return [pts[i + 1] // pts[i] for i in range(len(self.points))]

    def flat(self) -> sympy.Expr:
        return sum((v * p for v, p in zip(self.vars, self.points)), sympy.Integer(0))

    def div(self, p: int) -> sympy.Expr:
        return sum((v * (q // p) for v, q in zip(self.vars, self.points) if q >= p), sympy.Integer(0))

    def mod(self, p: int) -> sympy.Expr:
        return sum((v * q for v, q in zip(self.vars, self.points) if q < p), sympy.Integer(0))

    def divmod(self, a: int, b: int) -> sympy.Expr:
        return sum((v * (q // a) for v, q in zip(self.vars, self.points) if a <= q < a * b), sympy.Integer(0))

    def substitute(self, e: sympy.Expr) -> sympy.Expr:
        s = self.symbol
        if not e.has(s):
            return e
        if len(self.points) == 1:
            return e.xreplace({s: self.vars[0]})
        n = self._num
        e = e.replace(lambda t: isinstance(t, Mod) and isinstance(t.args[0], FloorDiv) and t.args[0].args[0] == s,
                      lambda t: self.divmod(n(t.args[0].args[1]), n(t.args[1])))
        e = e.replace(lambda t: isinstance(t, FloorDiv) and t.args[0] == s, lambda t: self.div(n(t.args[1])))
        e = e.replace(lambda t: isinstance(t, Mod) and t.args[0] == s, lambda t: self.mod(n(t.args[1])))
        return e.xreplace({s: self.flat()})


def _collect(e: sympy.Expr, s: sympy.Symbol, points: list, divisor=lambda b: b.is_Integer) -> bool:
    """Add the split points used by ``e`` to ``points``; False if ``s`` is used in another way, or
    divided by what ``divisor`` refuses (integers only, or :func:`_size_divisor` for symbolic splits)."""
    if not e.has(s) or e == s:
        return True
    if isinstance(e, Mod) and isinstance(e.args[0], FloorDiv) and e.args[0].args[0] == s:
        a, b = e.args[0].args[1], e.args[1]
        if not (divisor(a) and divisor(b)):
            return False
        points += [a, sympy.expand(a * b)]
        return True
    if isinstance(e, (FloorDiv, Mod)):
        if e.args[0] == s and divisor(e.args[1]):
            points.append(e.args[1])
            return True
        return False
    return all(_collect(a, s, points, divisor) for a in e.args) if e.is_Add or e.is_Mul else False


def split_plan(exprs: Iterable[sympy.Expr], symbol: sympy.Symbol, numel: int, prefix: str) -> Split:
    """The finest loop split of ``symbol`` (extent ``numel``) valid for all ``exprs``."""
    if not isinstance(numel, int) and not getattr(numel, "is_Integer", False):
        return _symbolic_split(exprs, symbol, numel, prefix)
    points: list = []
    if not all(_collect(e, symbol, points) for e in exprs):
        return Split(symbol, numel, [1], prefix)
    chain = [1] + sorted({int(p) for p in points if 1 < p < numel})
    if any(chain[i + 1] % chain[i] for i in range(len(chain) - 1)) or numel % chain[-1]:
        return Split(symbol, numel, [1], prefix)
    return Split(symbol, numel, chain, prefix)


class SymbolicSplit(Split):
    """A :class:`Split` whose points are size expressions (dynamic shapes): ``points`` is a divisibility chain ``1 | p1
    | ... | pk | numel``, so comparisons between points are positions in the chain and quotients are exact."""

    _num = staticmethod(lambda p: p)  # (size expressions: :meth:`Split.substitute` keeps them)

    @property
    def extents(self) -> list:
        pts = self.points + [self.numel]
        return [_quo(pts[i + 1], pts[i]) for i in range(len(self.points))]

    def _pos(self, p) -> int:
        """Position of point ``p`` in the chain (``len(points)`` for ``numel``)."""
        for i, q in enumerate(self.points):
            if sympy.expand(q - p) == 0:
                return i
        if sympy.expand(self.numel - p) == 0:
            return len(self.points)
        raise ValueError(f"{p} is not a split point of {self.points} (numel {self.numel})")

    def div(self, p) -> sympy.Expr:
        k = self._pos(p)
        return sum((v * _quo(q, p) for v, q in list(zip(self.vars, self.points))[k:]), sympy.Integer(0))

    def mod(self, p) -> sympy.Expr:
        k = self._pos(p)
        return sum((v * q for v, q in list(zip(self.vars, self.points))[:k]), sympy.Integer(0))

    def divmod(self, a, b) -> sympy.Expr:
        lo, hi = self._pos(a), self._pos(sympy.expand(a * b))
        return sum((v * _quo(q, a) for v, q in list(zip(self.vars, self.points))[lo:hi]), sympy.Integer(0))


def _quo(q, p) -> sympy.Expr:
    """``q / p`` of split points as a polynomial (exact where ``p | q``: ``((s0 - 1) // 2 + 1) * ((s1 - 1) // 2 + 1)``
    expanded, over ``(s1 - 1) // 2 + 1``, is ``(s0 - 1) // 2 + 1``; :func:`sympy.cancel` treats the ``//`` as atoms)."""
    return sympy.expand(sympy.cancel(q / p))


def _size_divisor(b) -> bool:
    """A divisor a symbolic split can cut at: an integer or a polynomial in size symbols (``4 * s0 * s1``, a strided
    convolution's ``(s0 - 1) // 2 + 1``; the chain keeps those whose quotients are exact)."""
    return b.is_Integer or bool(b.free_symbols) and all(v.is_positive for v in b.free_symbols)


def _symbolic_split(exprs, symbol, numel, prefix: str) -> Split:
    """The loop split of a symbolic extent: nested loops at the (symbolic) divisors the indices use when they
    form a divisibility chain dividing ``numel`` (``x % s1`` and ``x // s1`` become a loop over ``s1`` inside
    one over ``s0``: no run-time division or modulo per element), else one flat loop."""
    flat = Split(symbol, numel, [1], prefix)
    points: list = []
    if not all(_collect(e, symbol, points, _size_divisor) for e in exprs):
        return flat
    uniq: list = []
    for p in points:
        if (p := sympy.expand(p)) != 1 and sympy.expand(p - numel) != 0 and all(sympy.expand(p - q) != 0 for q in uniq):
            uniq.append(p)
    if not uniq:
        return flat
    try:
        chain = [sympy.Integer(1)] + sorted(uniq, key=hint)
    except TypeError:
        return flat
    divides = lambda p, q: sympy.denom(sympy.cancel(q / p)) == 1
    if not all(divides(chain[i], chain[i + 1]) for i in range(len(chain) - 1)) or not divides(chain[-1], numel):
        return flat
    return SymbolicSplit(symbol, numel, chain, prefix)


class _CppPrinter(IndexPrinter):
    """:class:`~coil.ir.symbols.IndexPrinter` for C++ (int64_t arithmetic): ``/`` and ``%`` over non-negative
    numerators only (:func:`~coil.ir.symbols.floor_safe`: C's truncate), literals past int32 as ``LL``, products and
    powers parenthesized as operands, Min/Max as ``coil_imin``/``coil_imax``."""

    div = "/"

    def literal(self, v: int) -> str:
        return f"{v}LL" if abs(v) >= 2 ** 31 else str(v)

    def paren(self, e: sympy.Expr, divisor: bool = False) -> str:
        s = self.print(e)
        return f"({s})" if e.is_Add or e.is_Pow or e.is_Mul else s

    def print(self, e: sympy.Expr) -> str:
        if isinstance(e, (FloorDiv, Mod)) and e != (safe := floor_safe(e)):
            return f"({self.print(safe)})"
        if e.is_Mul and not e.as_coeff_Mul()[0].is_Integer:
            raise NotImplementedError(f"C++ backend cannot print index expression {e!r}")
        return super().print(e)


_CPP_PRINTER = _CppPrinter(("coil_imin", "coil_imax"))


def cexpr(e: sympy.Expr) -> str:
    """Print an integer index expression as C++ (int64_t arithmetic)."""
    return _CPP_PRINTER.print(e)
