"""Symbolic Python numbers: sizes of dynamic tensors and arithmetic on them.

A :class:`SymNodeVariable` holds a ``torch.SymInt`` / ``SymFloat`` / ``SymBool`` of the frame's ShapeEnv
(``x.shape[0]``, ``x.size(1) // 2``); arithmetic and comparisons stay symbolic, and its graph node is made
only when a graph op uses it (a SymInt placeholder for a bare input size, else ``aten.sym_size.int`` or
an ``operator`` call). Python that needs a concrete value evaluates the symbol through the ShapeEnv, which
adds a guard logged with the user's line (:class:`coil.capture.dynamic.SiteRecorder`).
docs/dynamic_shapes.md, "What the backend receives" and "Sizes in user code"."""
from __future__ import annotations

import math
import operator
import re

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._sympy.printers import PythonPrinter

from coil.exc import ZERO_DIVISION_MARK, Unsupported
from coil.capture.variables.base import ConstantVariable, VariableTracker
from coil.capture.variables.containers import SizeVariable, TupleVariable

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)

#: Binary operators evaluated symbolically (in-place ones act like the plain op on ints).
_BINARY = {operator.add: operator.add, operator.iadd: operator.add, operator.sub: operator.sub,
           operator.isub: operator.sub, operator.mul: operator.mul, operator.imul: operator.mul,
           operator.floordiv: operator.floordiv, operator.ifloordiv: operator.floordiv,
           operator.truediv: operator.truediv, operator.itruediv: operator.truediv, operator.mod: operator.mod,
           operator.imod: operator.mod, operator.pow: operator.pow, operator.ipow: operator.pow,
           operator.lt: operator.lt, operator.le: operator.le, operator.gt: operator.gt, operator.ge: operator.ge,
           operator.eq: operator.eq, operator.ne: operator.ne, operator.lshift: operator.lshift,
           operator.ilshift: operator.lshift, operator.rshift: operator.rshift, operator.irshift: operator.rshift,
           operator.and_: operator.and_, operator.iand: operator.and_, operator.or_: operator.or_,
           operator.ior: operator.or_, operator.xor: operator.xor, operator.ixor: operator.xor}
_BITWISE = (operator.and_, operator.or_, operator.xor)


class SymNodeVariable(VariableTracker):
    """A symbolic int/float/bool (see module docstring). ``recipe`` makes its graph node on first use:
    ``("size"|"stride", tensor_vt, dim)``, ``("numel", tensor_vt)``, ``("op", fn, operands)`` or ``("node", node)``."""

    def __init__(self, output, value, recipe):
        super().__init__(None)
        self.output, self.value, self.recipe = output, value, recipe
        self._node = None

    def python_type(self):
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(self.value)]

    # --- concrete values: guards --------------------------------------------------
    def evaluate(self, why: str, truth: bool = False):
        """The concrete value (``truth``: its truth, ``!= 0``, which a size >= 2 decides
        without a guard), guarded in the ShapeEnv (logged with the user's line)."""
        out = self.output
        env = out.shape_env
        start = len(env.guards)
        try:
            value = bool(self.value != 0 if self.python_type() is not bool else self.value) if truth \
                else self.python_type()(self.value)
        except Exception as e:  # noqa: BLE001 - e.g. an unbacked symbol
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise Unsupported(f"{why}: {first} (the value depends on tensor data; torch._check(...) the condition to "
                              f"decide it)", hint="torch._check(...) the condition, or mark the dim static")
        out.sites.note(env, start, out.where(), reason=why)
        return value

    def as_python_constant(self):
        return self.evaluate("Python needs a concrete value")

    def is_python_constant(self):
        return False        # only as_python_constant() specializes, and says why

    def truthy(self, tx):
        return self.evaluate("Python control flow on a symbolic size", truth=True)

    # --- graph ----------------------------------------------------------------------
    def as_node(self):
        """The graph node computing this value (made on first use; made again where a speculative trace that
        first used it, an autograd.Function's probe, erased it)."""
        if self._node is not None and not self._node._erased:
            return self._node
        out, kind = self.output, self.recipe[0]
        graph = out.graph
        if kind == "node":
            node = self.recipe[1]
        elif kind in ("size", "stride"):
            t, d = self.recipe[1], self.recipe[2]
            if (node := out.symbol_input(self.value)) is None:
                op = torch.ops.aten.sym_size.int if kind == "size" else torch.ops.aten.sym_stride.int
                node = graph.create_node("call_function", op, (t.node, d), {})
        elif kind == "numel":
            node = graph.create_node("call_function", torch.ops.aten.sym_numel.default, (self.recipe[1].node,), {})
        else:
            fn, operands = self.recipe[1], self.recipe[2]
            args = tuple(a.as_node() if isinstance(a, SymNodeVariable) else a for a in operands)
            node = graph.create_node("call_function", fn, args, {})
        node.meta.setdefault("example_value", self.value)
        self._node = node
        return node

    def needs_graph_output(self) -> bool:
        """Whether a symbol of the value has no source in the frame's inputs (``.item()``, a ``nonzero``
        size): the entry then reads the value from a 0-d graph output (:attr:`as_tensor`)."""
        env = self.output.shape_env
        return any(not env.var_to_sources.get(s) for s in self.value.node.expr.free_symbols)

    #: the 0-d tensor graph output holding a data-dependent value (set by capture's frame builder)
    as_tensor = None

    def reconstruct(self, cg):
        """Python text over the frame's sources (``(x.size()[0] // 2)``), or, for a data-dependent value,
        the ``.item()`` of its graph output."""
        if self.as_tensor is not None:
            return f"{cg.reconstruct(self.as_tensor)}.item()"
        if self.recipe[0] == "op" and any(isinstance(v, (float, torch.SymFloat)) for v in
                                          [self.value] + [getattr(a, "value", a) for a in self.recipe[2]]):
            # float arithmetic is replayed in the user's order: sympy reassociates the expression
            # (0.05 + (0.002 - 0.05) / 2.0 * c printed as 0.026 - 0.024*c, an ulp off eager's Python float)
            args = ", ".join(cg.reconstruct(a) if isinstance(a, VariableTracker) else cg.const_expr(a)
                             for a in self.recipe[2])
            return f"{cg.const_expr(self.recipe[1])}({args})"
        return python_text(self.output.shape_env, self.value, getattr(cg, "symbol_local", None))

    def __repr__(self):
        return f"SymNodeVariable({self.value})"


def python_text(env, value, bind=None) -> str:
    """``value`` (a Sym*) as Python over the sources of its symbols; ``bind`` (source text ->
    expression) replaces each symbol's source read, e.g. by a local read at the entry's start
    (:meth:`~coil.capture.output.EntryCodegen.symbol_local`)."""
    from coil.capture.dynamic import source_name
    expr = value.node.expr
    text = PythonPrinter().doprint(expr)
    names = {}
    for s in expr.free_symbols:
        if not (srcs := env.var_to_sources.get(s)):
            raise Unsupported(f"symbolic value {expr} has no source (data-dependent)")
        names[str(s)] = bind(source_name(srcs[0])) if bind else f"({source_name(srcs[0])})"
    return re.sub(r"\b[a-z]+\d+\b", lambda m: names.get(m.group(0), m.group(0)), text)


def wrap_sym(output, value, recipe) -> VariableTracker:
    """A tracker for ``value``: a SymNodeVariable when it is symbolic, else a constant."""
    if isinstance(value, _SYM):
        if getattr(expr := value.node.expr, "is_number", False):      # simplified to a constant
            return ConstantVariable(value.node.pytype(expr))
        return SymNodeVariable(output, value, recipe)
    return ConstantVariable(value)


def binary(tx, op, a: VariableTracker, b: VariableTracker):
    """``a <op> b`` with at least one symbolic operand and the other a number (or
    symbolic): a symbolic result. None: not ours (tensors, lists...)."""
    if (fn := _BINARY.get(op)) is None:
        return None
    vals = []
    for v in (a, b):
        if isinstance(v, SymNodeVariable) or (isinstance(v, ConstantVariable) and type(v.value) in (int, float, bool)):
            vals.append(v.value)
        else:
            return None
    if fn in (operator.lshift, operator.rshift) and not (isinstance(vals[0], torch.SymInt) and type(vals[1]) is int
                                                         and vals[1] >= 0):
        return None     # (a shift by a constant count is a product or a floor division)
    if fn in _BITWISE and not all(isinstance(v, torch.SymInt) or type(v) is int for v in vals):
        return None     # (`& | ^` of ints only: of bools they are logical)
    if fn in (operator.mod, operator.floordiv) and any(isinstance(v, (float, torch.SymFloat)) for v in vals):
        # Python's float % and // round as CPython's divmod does (-3.5 // 0.7 == -6.0, not
        # floor(-3.5 / 0.7) == -5.0), and the graph's lowering of a float % read a stale value
        raise Unsupported(f"float {'%' if fn is operator.mod else '//'} of a dynamic float",
                          hint="it is computed in Python at a graph break")
    out = a.output if isinstance(a, SymNodeVariable) else b.output
    if fn is operator.pow and isinstance(vals[0], torch.SymFloat) and type(vals[1]) in (int, float) and \
            float(vals[1]).is_integer() and not statically_known_true(vals[0] >= 0) and \
            binary(tx, operator.lt, a, ConstantVariable(0)).evaluate("the sign of a float raised to a power"):
        # torch's symbolic pow requires a base >= 0; a negative base to an integer power is (-a) ** n, negated for
        # an odd n (exactly Python's pow), with the sign guarded
        res = binary(tx, op, unary(tx, operator.neg, a), b)
        return unary(tx, operator.neg, res) if int(vals[1]) % 2 else res
    env = out.shape_env
    start = len(env.guards)
    zero = vals[1] if fn in (operator.truediv, operator.floordiv, operator.mod) else \
        vals[0] if fn is operator.pow and type(vals[1]) in (int, float) and vals[1] < 0 else None
    try:    # a symbolic divisor (or base of a negative power) is guarded nonzero: at 0, Python raises
        if isinstance(zero, _SYM) and zero.node.has_hint() and not statically_known_true(zero != 0) and \
                not bool(zero != 0):
            raise ZeroDivisionError("division by zero")
        if isinstance(zero, _SYM) and not zero.node.has_hint() and not statically_known_true(zero != 0):
            try:    # an unbacked one (``1.0 / n.item()``): a runtime assert, with Python's message for a 0 there
                fn(*(v.node.pytype(v is not zero) if isinstance(v, _SYM) else v for v in vals))
            except ZeroDivisionError as e:
                env.guard_or_defer_runtime_assert((zero != 0).node.expr, f"{ZERO_DIVISION_MARK}{e}")
        res = fn(*vals)
    except ZeroDivisionError as e:
        from coil.capture.variables.tensor import UserCodeError
        raise UserCodeError(f"ZeroDivisionError: {e}") from e
    if fn is operator.mul and isinstance(res, torch.SymFloat) and res.node.expr.is_number and res.node.expr == 0:
        res = _signed_zero_product(vals, res)
    out.sites.note(env, start, out.where(), reason=f"symbolic {fn.__name__}")
    return wrap_sym(out, res, ("op", fn, [v if isinstance(v, SymNodeVariable) else v.value for v in (a, b)]))


def _signed_zero_product(vals: list, res):
    """``0.0 * p`` of a symbolic float ``p``: sympy folds it to 0, IEEE gives it the sign of the product of signs
    (``x + 0.0 * p`` is -0.0 for a negative ``p`` and ``x = -0.0``). The sign of ``p`` is guarded (one recompile
    when it flips; a ``p`` of 0 is then a constant with its sign: dynamic.scalar_input)."""
    c = next((v for v in vals if type(v) in (int, float, bool)), None)
    p = next((v for v in vals if isinstance(v, torch.SymFloat)), None)
    if c is None or p is None or c != 0:
        return res
    sign = 1.0 if bool(p > 0) else -1.0 if bool(p < 0) else 0.0
    return math.copysign(0.0, math.copysign(1.0, float(c)) * sign) if sign else res


def sym_minmax(items: list, op):
    """``min``/``max`` (``op``: ``operator.lt``/``gt``) of symbolic and constant numbers as
    ``torch.sym_min``/``sym_max`` where the ShapeEnv cannot decide the order without a
    guard; None when no item is symbolic or an item is not a number."""
    if len(items) < 2 or not any(isinstance(i, SymNodeVariable) for i in items) or not all(
            isinstance(i, SymNodeVariable) and not isinstance(i.value, torch.SymBool) or
            isinstance(i, ConstantVariable) and type(i.value) in (int, float) for i in items):
        return None
    out = next(i for i in items if isinstance(i, SymNodeVariable)).output
    fn = torch.sym_max if op is operator.gt else torch.sym_min
    best = items[0]
    for it in items[1:]:
        a, b = (x.value if isinstance(x, SymNodeVariable) else x.value for x in (it, best))
        if statically_known_true(op(a, b)):
            best = it
        elif not statically_known_true(op(b, a) | (a == b)):
            best = wrap_sym(out, fn(b, a), ("op", fn, [best if isinstance(best, SymNodeVariable) else best.value,
                                                       it if isinstance(it, SymNodeVariable) else it.value]))
    return best


def unary(tx, op, a: "SymNodeVariable"):
    """``-a``, ``+a``, ``abs(a)`` of a symbolic number; ``~a`` of a symbolic int (``-a - 1``)."""
    if op is operator.invert:
        return binary(tx, operator.sub, unary(tx, operator.neg, a), ConstantVariable(1))
    fn = operator.abs if op is abs else op
    return wrap_sym(a.output, fn(a.value), ("op", fn, [a]))


#: Python functions of numbers evaluated symbolically (no guard), as torch's capture
#: does: the node calls the torch.sym_* form.
_NUMERIC = {int: torch.sym_int, float: torch.sym_float, math.sqrt: torch._sym_sqrt,
            math.floor: math.floor, math.ceil: math.ceil, abs: operator.abs,
            **{getattr(math, n): getattr(torch, f"_sym_{n}") for n in ("cos", "sin", "tan", "cosh", "sinh", "tanh",
                                                                       "acos", "asin", "atan", "log2")}}

#: (low, high) bounds of the math functions above whose domain Python checks (log2's low bound is excluded)
_DOMAINS = {math.sqrt: (0, None), math.log2: (0, None), math.acos: (-1, 1), math.asin: (-1, 1)}


def call_numeric(tx, fn, args: list, kwargs: dict):
    """``int(n)``, ``float(n)``, ``math.sqrt/floor/ceil(n)``, ``math.prod(sizes)`` with symbolic operands,
    kept symbolic; None when no operand is symbolic (or ``fn`` is not one of these)."""
    if kwargs:
        return None
    if fn is math.prod and len(args) == 1 and not isinstance(args[0], SymNodeVariable):
        try:
            items = tx.unpack(args[0])
        except Unsupported:
            return None
        if not any(isinstance(i, SymNodeVariable) for i in items):
            return None
        total = ConstantVariable(1)
        for i in items:
            total = tx.binary_op(operator.mul, total, i)
        return total
    if fn is divmod and len(args) == 2 and any(isinstance(a, SymNodeVariable) for a in args):
        return TupleVariable([tx.binary_op(operator.floordiv, *args), tx.binary_op(operator.mod, *args)])
    if len(args) != 1 or not isinstance(args[0], SymNodeVariable):
        return None
    a = args[0]
    if fn is int and isinstance(a.value, torch.SymInt) or fn is float and isinstance(a.value, torch.SymFloat):
        return a
    if (sym_fn := _NUMERIC.get(fn)) is None or isinstance(a.value, torch.SymBool):
        return None
    v = a.value     # the domain of math.sqrt / log2 / acos / asin is guarded: outside it Python raises ValueError
    lo, hi = _DOMAINS.get(fn, (None, None))
    if lo is not None and not (bool(v > lo) if fn is math.log2 else bool(v >= lo) and (hi is None or bool(v <= hi))):
        from coil.capture.variables.tensor import UserCodeError
        raise UserCodeError("ValueError: math domain error")
    return wrap_sym(a.output, sym_fn(v), ("op", sym_fn, [a]))


def tensor_meta(tx, t, name: str, result):
    """The tracker for metadata ``name`` (``size``, ``stride``, ``numel``, ``shape``) of tensor tracker ``t``
    whose fake value is ``result``: constants when static, symbolic items otherwise."""
    out = tx.output
    if name in ("size", "shape", "stride") and isinstance(result, (tuple, torch.Size)):
        if not any(isinstance(s, torch.SymInt) for s in result):
            return ConstantVariable(result)
        kind = "stride" if name == "stride" else "size"
        items = [wrap_sym(out, s, (kind, t, i)) for i, s in enumerate(result)]
        return SizeVariable(items) if kind == "size" else TupleVariable(items)
    if isinstance(result, _SYM):
        return wrap_sym(out, result, ("numel", t) if name in ("numel", "nelement") else
                        ("node", out.graph.create_node("call_method", name, (t.node,), {})))
    return ConstantVariable(result)

