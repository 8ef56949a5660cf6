"""Builtins (``len``, ``isinstance``, ``getattr``, ``range``, ``zip``, ``min``...) and
pure C functions (``math.*``, ``operator.*``).

One registry, one small function per builtin (a one-expression handler is a lambda)::

    @builtin(isinstance)
    def _isinstance(tx, args, kwargs): ...
    builtin(len)(lambda tx, args, kwargs: tx.call_dunder(args[0], "__len__", []))

A builtin without a handler is constant-folded when all its arguments are
compile-time constants and it is in ``_FOLDABLE``; otherwise it is a graph break."""
from __future__ import annotations

import builtins
import collections
import copy
import dataclasses
import functools
import inspect
import itertools
import operator
import os
import sys
import threading
import types
from typing import Callable

import torch

from coil.exc import Unsupported
from coil.capture.source import ModuleDictSource, TypeSource
from coil.capture.translator import _ObjectGetattribute, const_value
from coil.capture.variables.base import ConstantVariable, KnownCallableVariable, NumpyArrayVariable, VariableTracker
from coil.capture.variables.builder import wrap, wrap_constant_result
from coil.capture.variables.containers import (DictVariable, GeneratorVariable, LazyIteratorVariable,
                                               ListIteratorVariable, ListVariable, NamedTupleVariable, SetVariable,
                                               SliceVariable, TupleVariable)
from coil.capture.variables.functions import (BaseFunctionVariable, BoundMethodVariable, NestedFunctionVariable,
                                              PartialVariable, UserFunctionVariable, UserMethodVariable)
from coil.capture.variables.hops import call_region
from coil.capture.variables.objects import (AttributeMissing, NNModuleVariable, NewObjectVariable, ObjectVariableBase,
                                            UserDefinedClassVariable, UserDefinedObjectVariable)
from coil.capture.variables.symbolic import SymNodeVariable, call_numeric, sym_minmax
from coil.capture.variables.tensor import TensorVariable, UserCodeError, call_op
from coil.capture.variables.torchfn import LockVariable, TorchFunctionVariable

_HANDLERS: dict[Callable, Callable] = {}
_FOLDABLE = {abs, bool, int, float, str, round, divmod, pow, ord, chr, hex, oct, bin, hash,
             complex, repr, format, ascii, callable}


def builtin(*fns):
    def deco(handler):
        for f in fns:
            _HANDLERS[f] = handler
        return handler
    return deco


def is_builtin(value) -> bool:
    try:
        return value in _HANDLERS or value in _FOLDABLE or value is print or value in _BREAK
    except TypeError:
        return False


_BREAK = {print: "call to print", input: "call to input", open: "call to open", exec: "exec", eval: "eval",
          globals: "globals()", locals: "locals()", vars: "vars()", breakpoint: "breakpoint()"}


def is_pure_builtin_method(value) -> bool:
    self_ = getattr(value, "__self__", None)
    return isinstance(self_, (str, int, float, tuple)) or self_ is None and \
        getattr(value, "__objclass__", None) in (str, int, float, dict, list, tuple)


class BuiltinVariable(KnownCallableVariable):
    """A Python builtin function or type (``len``, ``list``, ``isinstance``...)."""

    def call_function(self, tx, args, kwargs):
        if (fn := self.fn) is vars and len(args) == 1 and not kwargs:
            return args[0].var_getattr(tx, "__dict__")   # (an object made in the frame: its attributes)
        if fn in _BREAK:
            raise Unsupported(_BREAK[fn], hint="it runs outside the graph")
        if (h := _HANDLERS.get(fn)) is not None:
            return h(tx, list(args), dict(kwargs))
        if fn in _FOLDABLE:
            return _fold(tx, fn, args, kwargs)
        raise Unsupported(f"builtin {fn.__name__}")

    def var_getattr(self, tx, name):
        if name == "__name__":
            return ConstantVariable(self.fn.__name__)
        if isinstance(self.fn, type):
            if is_builtin(attr := getattr(self.fn, name, None)):    # dict.fromkeys
                return BuiltinVariable(attr)
            return UserDefinedClassVariable(self.fn).var_getattr(tx, name)
        raise Unsupported(f"attribute {name} of builtin {self.fn}")

    def reconstruct(self, cg):
        if getattr(builtins, self.fn.__name__, None) is self.fn:
            return f"___builtins.{self.fn.__name__}"
        return cg.const_expr(self.fn)   # itertools.chain, functools.reduce...: not a name of builtins


def _fold(tx, fn, args, kwargs):
    if fn in (int, float, bool, complex) and args and isinstance(args[0], TensorVariable):
        dunder = {int: "__int__", float: "__float__", bool: "__bool__", complex: "__complex__"}[fn]
        return args[0].call_method(tx, dunder, [], {})
    if fn is bool and len(args) == 1:
        return ConstantVariable(tx.truthy(args[0]))
    if (sym := call_numeric(tx, fn, args, kwargs)) is not None:   # int(n), float(n) of a symbolic size
        return sym
    if fn is callable and len(args) == 1 and not args[0].is_python_constant():
        return ConstantVariable(_is_callable(args[0]))
    try:
        c = [a.as_python_constant() for a in args]
        kw = {k: v.as_python_constant() for k, v in kwargs.items()}
    except Unsupported:
        if fn is abs and args:
            return tx.call_dunder(args[0], "__abs__", [])
        if fn is round and args:
            return tx.call_dunder(args[0], "__round__", list(args[1:]))
        if fn is pow:
            return tx.binary_op(operator.pow, args[0], args[1])
        if fn in (str, repr) and len(args) == 1 and hasattr(args[0], "exception_value"):
            return ConstantVariable(fn(args[0].exception_value()))     # str(caught_exc)
        raise
    try:
        return wrap_constant_result(tx, fn(*c, **kw))
    except Exception as e:  # noqa: BLE001
        raise UserCodeError(f"{type(e).__name__}: {e}") from e


def _is_callable(v):
    return isinstance(v, (BaseFunctionVariable, BoundMethodVariable, PartialVariable, NNModuleVariable,
                          UserDefinedClassVariable, TorchFunctionVariable, BuiltinVariable, PureFunctionVariable))


class DisabledFunctionVariable(VariableTracker):
    """A function marked with ``coil.disable``: calling it is a graph break."""

    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def call_function(self, tx, args, kwargs):
        raise Unsupported(f"call to {self.fn.__qualname__}, disabled with coil.disable")

    def reconstruct(self, cg):
        return cg.const_expr(self.fn)


_OPERATOR_BINARY = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
                    operator.pow, operator.matmul, operator.and_, operator.or_, operator.xor, operator.lshift,
                    operator.rshift, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
                    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
                    operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift,
                    operator.irshift, operator.is_, operator.is_not, operator.contains}
_OPERATOR_UNARY = {operator.neg, operator.pos, operator.invert, operator.not_, operator.truth,
                   operator.abs, operator.index}


class PureFunctionVariable(KnownCallableVariable):
    """``math.*``, ``operator.*`` and other side-effect-free C functions."""

    def call_function(self, tx, args, kwargs):
        if (fn := self.fn) in _OPERATOR_BINARY and len(args) == 2:
            return tx.contains_op(args[0], args[1]) if fn is operator.contains else tx.binary_op(fn, args[0], args[1])
        if fn in _OPERATOR_UNARY and len(args) == 1:
            return tx.unary_op(fn, args[0])
        if fn is operator.getitem:
            return tx.getitem(args[0], args[1])
        if fn is operator.setitem:
            return tx.call_dunder(args[0], "__setitem__", [args[1], args[2]])
        if isinstance(fn, operator.attrgetter):
            raise Unsupported("operator.attrgetter object")
        if (sym := call_numeric(tx, fn, args, kwargs)) is not None:   # math.prod(x.shape), math.sqrt(n)
            return sym
        try:
            c = [const_value(a) for a in args]
            kw = {k: const_value(v) for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported(f"{getattr(fn, '__qualname__', fn)} on non-constant arguments")
        try:
            return wrap_constant_result(tx, fn(*c, **kw))
        except Exception as e:  # noqa: BLE001
            if any(isinstance(a, NumpyArrayVariable) for a in [*args, *kwargs.values()]):   # (``out=a``: read-only)
                raise Unsupported(f"{getattr(fn, '__name__', fn)} on a numpy array raised {type(e).__name__}") from None
            raise UserCodeError(f"{type(e).__name__}: {e}") from e


# --- handlers -----------------------------------------------------------------------------


class IdVariable(VariableTracker):
    """``id(c)`` of a constant: usable only in ``==``/``!=`` with another ``id()`` (folded
    to whether the two trackers are the same object); any other use is a graph break."""

    def __init__(self, target):
        super().__init__(None)
        self.target = target

    def reconstruct(self, cg):
        raise Unsupported("id() of a traced value escapes the frame")


@builtin(id)
def _id(tx, args, kwargs):
    if len(args) == 1 and not kwargs and isinstance(args[0], ConstantVariable):
        return IdVariable(args[0])
    if len(args) == 1 and not kwargs and (obj := known_object(tx, args[0])) is not None:
        # a pre-existing object read from a source: its id is a constant under a guard
        tx.output.guards.add(f"___id({args[0].source.expr()}) == {id(obj)}", f"id({args[0].source.expr()})", id(obj))
        return ConstantVariable(id(obj))
    raise Unsupported("id() of a traced value", hint="it runs outside the graph")


def known_object(tx, vt):
    """The real object ``vt`` stands for, when it existed before the frame and was read from a source (so a guard can
    pin its identity); None for tensors, objects made in the traced region, trackers not built from one real object, and
    bound methods (made afresh by each attribute read, so their id is not stable)."""
    if vt.source is None or isinstance(vt, TensorVariable):
        return None
    return next((None if isinstance(value, types.MethodType) else value
                 for value, w in tx.output.wrapped.values() if w is vt), None)


builtin(len)(lambda tx, args, kwargs: tx.call_dunder(args[0], "__len__", []))


@builtin(isinstance)
def _isinstance(tx, args, kwargs):
    obj, cls = args
    t, classes = obj.python_type(), cls.as_python_constant()
    try:
        return ConstantVariable(issubclass(t, classes))
    except TypeError as e:
        raise UserCodeError(f"TypeError: {e}") from e


@builtin(issubclass)
def _issubclass(tx, args, kwargs):
    return ConstantVariable(issubclass(args[0].as_python_constant(), args[1].as_python_constant()))


@builtin(type)
def _type(tx, args, kwargs):
    if len(args) != 1:
        raise Unsupported("type() with 3 arguments")
    return type_of(tx, args[0])


def type_of(tx, vt):
    """``type(obj)``: a class read through an object with a source keeps one
    (``type(self).X`` guards X; without it X was a constant)."""
    src = vt.source if isinstance(vt, ObjectVariableBase) else None
    return wrap(tx, vt.python_type(), TypeSource(src) if src is not None else None)


@builtin(getattr)
def _getattr(tx, args, kwargs):
    obj, name = args[0], args[1].as_python_constant()
    try:
        return tx.getattr(obj, name)
    except AttributeMissing:
        if len(args) > 2:
            _guard_missing(tx, obj, name)
            return args[2]
        raise


@builtin(hasattr)
def _hasattr(tx, args, kwargs):
    if type(args[0]) is ConstantVariable:  # a number, string, None, dtype: Python's answer (is_tensor_like(3.0))
        return ConstantVariable(hasattr(args[0].value, args[1].as_python_constant()))
    try:
        tx.getattr(args[0], args[1].as_python_constant())
        return ConstantVariable(True)
    except AttributeMissing:
        _guard_missing(tx, args[0], args[1].as_python_constant())
        return ConstantVariable(False)


def _guard_missing(tx, obj, name):
    """An attribute found missing stays missing (``o.flag = 4.0`` later recompiles)."""
    if obj.source is not None:
        e = obj.source.expr()
        tx.output.guards.add(f"not hasattr({e}, {name!r})", f"hasattr({e}, {name!r})", False, src=e)


@builtin(setattr)
def _setattr(tx, args, kwargs):
    tx.store_attr(args[0], args[1].as_python_constant(), args[2])
    return ConstantVariable(None)


builtin(delattr)(lambda tx, args, kwargs: args[0].del_attr(tx, args[1].as_python_constant()) or ConstantVariable(None))
builtin(object.__getattribute__)(   # (in a class's own ``__getattribute__``: the generic lookup)
    lambda tx, args, kwargs: _ObjectGetattribute(args[0]).call_function(tx, args[1:], {}) if isinstance(
        args[0], (ObjectVariableBase, NewObjectVariable)) else tx.getattr(args[0], args[1].as_python_constant()))
builtin(range)(lambda tx, args, kwargs: ConstantVariable(range(*[a.as_python_constant() for a in args])))
builtin(slice)(lambda tx, args, kwargs: SliceVariable(args))
builtin(list)(lambda tx, args, kwargs: ListVariable(tx.unpack(args[0]) if args else []))
builtin(tuple)(lambda tx, args, kwargs: TupleVariable(tx.unpack(args[0]) if args else []))


@builtin(tuple.__new__)
def _tuple_new(tx, args, kwargs):
    """``tuple.__new__(cls, iterable)``, as ``namedtuple._make`` calls it: a tuple of ``cls`` with the items."""
    cls = args[0].as_python_constant()
    items = tx.unpack(args[1]) if len(args) > 1 else []
    if not (isinstance(cls, type) and issubclass(cls, tuple)) or kwargs or len(args) > 2 or \
            len(items) != len(getattr(cls, "_fields", items)):    # (a wrong count: _make's error runs for real)
        raise Unsupported(f"tuple.__new__ of {cls!r} with {len(items)} items")
    return TupleVariable(items) if cls is tuple else NamedTupleVariable(items, cls)


builtin(set)(lambda tx, args, kwargs: SetVariable([a.as_python_constant() for a in tx.unpack(args[0])] if args else []))


@builtin(frozenset)
def _frozenset(tx, args, kwargs):   # a constant: a SetVariable came back as a set
    return ConstantVariable(frozenset(a.as_python_constant() for a in tx.unpack(args[0])) if args else frozenset())


@builtin(dict)
def _dict(tx, args, kwargs):
    d = DictVariable({})
    d.update_items(tx, args, kwargs)
    return d


@builtin(dict.fromkeys)
def _dict_fromkeys(tx, args, kwargs):   # every key maps to the same value (transformers' linear-attention caches)
    d, value = DictVariable({}), args[1] if len(args) > 1 else ConstantVariable(None)
    for k in tx.unpack(args[0]):
        d.items[d.key_of(k)] = value
    return d


builtin(iter)(lambda tx, args, kwargs: tx.get_iter(args[0]))


@builtin(next)
def _next(tx, args, kwargs):
    if not isinstance(it := args[0], ListIteratorVariable):
        it = tx.get_iter(it)
    if (v := it.next(tx)) is None:
        if len(args) > 1:
            return args[1]
        raise Unsupported("StopIteration from next() (raised by user code)")
    return v


@builtin(enumerate)
def _enumerate(tx, args, kwargs):
    start = (args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))).as_python_constant()
    return LazyIteratorVariable(tx, enumerate, [tx.get_iter(args[0])], start=start)


@builtin(zip)
def _zip(tx, args, kwargs):
    if kwargs.get("strict") is None or not kwargs["strict"].as_python_constant():
        return LazyIteratorVariable(tx, zip, [tx.get_iter(a) for a in args])
    seqs = [tx.unpack(a) for a in args]
    if len({len(s) for s in seqs}) > 1:     # zip(strict=True)
        raise Unsupported("zip(strict=True) length mismatch (raised by user code)")
    return ListIteratorVariable([TupleVariable(list(t)) for t in zip(*seqs)])


def _invoke_subgraph_placeholder():
    import torch._higher_order_ops.invoke_subgraph  # noqa: F401
    # (the package attribute of that name is the operator, not the module)
    m = sys.modules["torch._higher_order_ops.invoke_subgraph"]
    return getattr(m, "invoke_subgraph_placeholder", None) or _invoke_subgraph_placeholder


@builtin(_invoke_subgraph_placeholder())
def _nested_compile_region_call(tx, args, kwargs):
    """A ``torch.compiler.nested_compile_region`` function's call: a region subgraph
    compiled once and reused (:func:`coil.capture.variables.hops.call_region`)."""
    return call_region(tx, args[0], list(args[1:]), kwargs)


@builtin(itertools.chain)
def _chain(tx, args, kwargs):
    """``itertools.chain(*iterables)`` of known-item iterables (optimizers: global and per-instance step hooks)."""
    if kwargs:
        raise Unsupported("itertools.chain with keyword arguments")
    return ListIteratorVariable([v for a in args for v in tx.unpack(a)])


@builtin(itertools.repeat)
def _repeat(tx, args, kwargs):
    """``itertools.repeat(obj, times)`` with a constant count (``torch.nn.modules.utils._single(0)``, which
    convolutions with ``padding_mode="circular"`` call): ``obj`` ``times`` times. Without a count it is endless."""
    bound = dict(zip(("object", "times"), args), **kwargs)
    if len(args) > 2 or set(bound) - {"object", "times"} or "times" not in bound:
        raise Unsupported("itertools.repeat without a count")
    return ListIteratorVariable([bound["object"]] * max(int(bound["times"].as_python_constant()), 0))


@builtin(torch.jit.annotate)
def _annotate(tx, args, kwargs):
    """``torch.jit.annotate(type, value)`` is ``value`` in Python (recorded as a graph call, its type argument made
    the graph's code a SyntaxError and the whole frame ran eagerly)."""
    return dict(zip(("the_type", "the_value"), args), **kwargs)["the_value"]


def _sequence_items(tx, v, what: str) -> list:
    """The items of a list, tuple or range given to a lazy itertool; an iterator is a graph break (reading all of it
    here would consume what eager leaves for later ``next`` calls)."""
    if isinstance(v, ListIteratorVariable) and (v.kind == "iterator" or isinstance(v, GeneratorVariable)):
        raise Unsupported(f"itertools.{what} over an iterator")
    return tx.unpack(v)


@builtin(itertools.accumulate)
def _accumulate(tx, args, kwargs):
    """``itertools.accumulate(iterable, func=operator.add, *, initial=None)`` over a sequence, each step traced
    (``func`` an operator or torch function: the steps run before the loop over them, not between its bodies)."""
    b = dict(zip(("iterable", "func"), args), **kwargs)
    none = lambda v: v is None or v.is_python_constant() and v.as_python_constant() is None  # noqa: E731
    func = tx.wrap(operator.add, None) if none(b.get("func")) else b["func"]
    home = str(getattr(func.as_python_constant_or_none(), "__module__", ""))
    if home not in ("_operator", "operator") and home.split(".")[0] != "torch":
        raise Unsupported("itertools.accumulate with a Python function (its calls would run before the loop body)")
    acc = None if none(b.get("initial")) else b["initial"]
    out = [] if acc is None else [acc]
    for v in _sequence_items(tx, b["iterable"], "accumulate"):
        acc = v if acc is None else tx.call(func, [acc, v], {})
        out.append(acc)
    return ListIteratorVariable(out)


@builtin(itertools.islice)
def _islice(tx, args, kwargs):
    """``itertools.islice(sequence, [start,] stop[, step])`` with constant bounds (a negative one raises, as eager)."""
    bounds = [a.as_python_constant() for a in args[1:]]
    if any(b is not None and (not isinstance(b, int) or b < 0) for b in bounds) or 0 in bounds[2:]:
        raise UserCodeError("ValueError: Indices for islice() must be None or an integer: 0 <= x <= sys.maxsize.")
    return ListIteratorVariable(_sequence_items(tx, args[0], "islice")[slice(*bounds)])


@builtin(itertools.zip_longest)
def _zip_longest(tx, args, kwargs):
    fill = kwargs.get("fillvalue", ConstantVariable(None))
    seqs = [_sequence_items(tx, a, "zip_longest") for a in args]
    return ListIteratorVariable([TupleVariable([s[i] if i < len(s) else fill for s in seqs])
                                 for i in range(max(map(len, seqs), default=0))])


def _indexed_itertool(fn, single: bool):
    """``fn`` (``itertools.product``, ``combinations``...) over iterables with known items: CPython's own function run on
    their indices, each index then mapped back to its item's tracker (a tuple position of ``product(a, b, repeat=2)``
    indexes ``(a, b)[pos % 2]``)."""
    def handler(tx, args, kwargs):
        k = 1 if single else len(args)
        seqs, rest = [tx.unpack(a) for a in args[:k]], [a.as_python_constant() for a in args[k:]]
        kw = {n: v.as_python_constant() for n, v in kwargs.items()}
        try:
            out = list(fn(*[range(len(s)) for s in seqs], *rest, **kw))
        except (TypeError, ValueError) as e:
            raise UserCodeError(f"{type(e).__name__}: {e}") from e
        return ListIteratorVariable([TupleVariable([seqs[p % k][i] for p, i in enumerate(t)]) for t in out])
    return handler


for _fn, _single in ((itertools.product, False), (itertools.combinations, True), (itertools.permutations, True),
                     (itertools.combinations_with_replacement, True), (itertools.pairwise, True)):
    builtin(_fn)(_indexed_itertool(_fn, _single))


builtin(reversed)(lambda tx, args, kwargs: ListIteratorVariable(list(reversed(tx.unpack(args[0])))))


@builtin(sorted)
def _sorted(tx, args, kwargs):
    rev = kwargs.get("reverse", ConstantVariable(False)).as_python_constant()
    return ListVariable(tx.sorted_items(tx.unpack(args[0]), kwargs.get("key"), rev))


builtin(map)(lambda tx, args, kwargs: LazyIteratorVariable(tx, map, [tx.get_iter(a) for a in args[1:]], fn=args[0]))
builtin(filter)(lambda tx, args, kwargs: LazyIteratorVariable(tx, filter, [tx.get_iter(args[1])], fn=args[0]))


def _minmax(tx, args, kwargs, op):
    items = tx.unpack(args[0]) if len(args) == 1 else list(args)
    key = kwargs.get("key")
    if not items:
        if "default" in kwargs:
            return kwargs["default"]
        raise Unsupported("min/max of an empty sequence (raised by user code)")
    if key is None:
        if (sym := sym_minmax(items, op)) is not None:   # max(n - 1, 2) of sizes: torch.sym_max, no guard
            return sym
    best = items[0]
    bestk = tx.call(key, [best], {}) if key is not None else best
    for it in items[1:]:
        k = tx.call(key, [it], {}) if key is not None else it
        if tx.truthy(tx.binary_op(op, k, bestk)):
            best, bestk = it, k
    return best


builtin(min)(functools.partial(_minmax, op=operator.lt))
builtin(max)(functools.partial(_minmax, op=operator.gt))


@builtin(sum)
def _sum(tx, args, kwargs):
    items = tx.unpack(args[0])
    total = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
    for it in items:
        total = tx.binary_op(operator.add, total, it)
    return total


builtin(any)(lambda tx, args, kwargs: ConstantVariable(any(tx.truthy(it) for it in tx.unpack(args[0]))))
builtin(all)(lambda tx, args, kwargs: ConstantVariable(all(tx.truthy(it) for it in tx.unpack(args[0]))))
builtin(super)(lambda tx, args, kwargs: tx.make_super(args))
builtin(object)(lambda tx, args, kwargs: NewObjectVariable(object))
builtin(functools.partial)(lambda tx, args, kwargs: PartialVariable(args[0], args[1:], kwargs))


@builtin(functools.reduce)
def _reduce(tx, args, kwargs):
    items = tx.unpack(args[1])
    acc, items = (args[2], items) if len(args) > 2 else (items[0], items[1:])
    for it in items:
        acc = tx.call(args[0], [acc, it], {})
    return acc


@builtin(functools.wraps, functools.update_wrapper)
def _wraps(tx, args, kwargs):
    return _WrapsDecorator() if len(args) == 1 else args[0]


class _WrapsDecorator(VariableTracker):
    """``functools.wraps(wrapped)``: the decorated function, unchanged (its metadata is not copied in the trace)."""

    def call_function(self, tx, args, kwargs):
        return args[0]


@builtin(inspect.signature)
def _signature(tx, args, kwargs):
    if isinstance(f := args[0], UserFunctionVariable):
        return ConstantVariable(inspect.signature(f.fn))
    if isinstance(f, UserMethodVariable):
        return ConstantVariable(inspect.signature(types.MethodType(f.fn, object())))
    if isinstance(f, NestedFunctionVariable):
        cells = tuple(types.CellType(None) for _ in f.code.co_freevars) or None
        return ConstantVariable(inspect.signature(types.FunctionType(f.code, {}, f.name, None, cells)))
    if isinstance(f, NNModuleVariable):
        return ConstantVariable(inspect.signature(f.value))
    raise Unsupported(f"inspect.signature of {f}")


@builtin(os.getenv)
def _getenv(tx, args, kwargs):  # os.environ.get: the value read is guarded (transformers' torch_compilable_check)
    from coil.capture.variables.builder import EnvironVariable
    return EnvironVariable().call_method(tx, "get", args, kwargs)


@builtin(sys.exc_info)
def _exc_info(tx, args, kwargs):  # ``ExitStack.__exit__``: no exception handled here, and none by the caller (guarded)
    t = tx
    while t is not None:
        if t.exc_stack or t.parent is None and sys.exc_info()[1] is not None:   # (the caller's, at this call)
            raise Unsupported("sys.exc_info() while an exception is handled (tracebacks are not modelled)")
        t = t.parent
    gs = tx.output.guards
    gs.add(f"{gs.const(sys.exc_info)}()[1] is None", note="sys.exc_info() in the frame: no exception handled")
    return ConstantVariable((None, None, None))


@builtin(object.__setattr__)
def _object_setattr(tx, args, kwargs):
    tx.store_attr(args[0], args[1].as_python_constant(), args[2], plain=True)
    return ConstantVariable(None)


@builtin(dataclasses.fields)
def _dc_fields(tx, args, kwargs):
    cls = args[0].python_type() if not isinstance(args[0].as_python_constant_or_none(), type) \
        else args[0].as_python_constant()
    return ConstantVariable(dataclasses.fields(cls))


@builtin(dataclasses.asdict)
def _dc_asdict(tx, args, kwargs):
    def conv(v):
        if dataclasses.is_dataclass(t := v.python_type()) and not isinstance(t, type(None)):
            return DictVariable({f.name: conv(tx.getattr(v, f.name)) for f in dataclasses.fields(t)})
        if isinstance(v, TensorVariable):
            return call_op(tx, "call_method", "clone", [v], {})
        if isinstance(v, (ListVariable, TupleVariable)):
            return type(v)([conv(i) for i in v.items])
        if isinstance(v, DictVariable):
            return DictVariable({k: conv(x) for k, x in v.items.items()})
        v.as_python_constant()
        return v
    return conv(args[0])


@builtin(dataclasses.replace)
def _dc_replace(tx, args, kwargs):
    obj = args[0]
    cls = obj.python_type()
    values = {f.name: kwargs[f.name] if f.name in kwargs else tx.getattr(obj, f.name)
              for f in dataclasses.fields(cls) if f.init}
    return tx.construct_object(UserDefinedClassVariable(cls), [], values)


for _f in (threading.Lock, threading.RLock):    # (a lock made in the frame)
    builtin(_f)(lambda tx, args, kwargs, _f=_f: LockVariable(factory=_f))
for _f in (copy.copy, copy.deepcopy):   # copies made of trackers as eager makes them (docs/capture.md, "Copies")
    builtin(_f)(lambda tx, args, kwargs, _f=_f: copy_value(tx, args[0] if len(args) == 1 and not kwargs else None,
                                                           _f is copy.deepcopy, {}))


def copy_value(tx, vt, deep: bool, memo: dict):
    if id(vt) in memo or type(vt) in (ConstantVariable, SymNodeVariable, UserFunctionVariable, NestedFunctionVariable,
                                      UserDefinedClassVariable, BuiltinVariable):
        return memo.get(id(vt), vt)     # (immutable or atomic: copy returns the object itself)
    sub, what = (lambda v: copy_value(tx, v, deep, memo) if deep else v), f"copy.{'deep' * deep}copy of {vt}"
    if isinstance(vt, TensorVariable):
        key = ("storage", (f := vt.fake).untyped_storage()._cdata)
        if not deep or vt.cls is not torch.Tensor or f.requires_grad or key in memo or \
                not torch._prims_common.is_non_overlapping_and_dense_or_false(f):
            raise Unsupported(what + " (shared storage, not dense, or requiring grad: eager makes a new leaf)")
        out = memo[key] = call_op(tx, "call_method", "clone", [vt], {})
    elif type(vt) in (TupleVariable, NamedTupleVariable):
        items = [sub(i) for i in vt.items]
        out = vt if all(a is b for a, b in zip(items, vt.items)) else type(vt)(items, getattr(vt, "tuple_cls", None))
    elif type(vt) in (ListVariable, SetVariable):
        out = memo[id(vt)] = type(vt)([])
        out.items = [sub(i) for i in vt.items] if type(vt) is ListVariable else set(vt.items)   # (of constants)
    elif type(vt) is DictVariable and vt.user_cls in (dict, collections.OrderedDict, collections.defaultdict):
        out = memo[id(vt)] = DictVariable({}, vt.user_cls)
        out.default_factory, out.items = vt.default_factory, {k: sub(v) for k, v in vt.items.items()}
    elif type(vt) is NewObjectVariable or type(vt) is UserDefinedObjectVariable and vt.source is not None and \
            type(getattr(vt.value, "__dict__", None)) is dict:
        cls = vt.python_type()
        if any("__slots__" in k.__dict__ for k in cls.__mro__) or any(getattr(
                cls, n, None) is not getattr(object, n, None) for n in ("__new__", "__reduce_ex__", "__reduce__",
                                                                        "__getstate__", "__setstate__")) or \
                _hasattr(tx, [vt, ConstantVariable(f"__{'deep' * deep}copy__")], {}).value:
            raise Unsupported(what + " (its class has its own copy protocol)")
        if type(vt) is NewObjectVariable:
            state = vt.attrs
        else:       # an object from outside the frame (with the frame's writes): its values and key list guarded
            obj, e, se, keys = vt.value, vt.source.expr(), tx.output.side_effects, list(vt.value.__dict__)
            tx.output.guards.add(f"list({e}.__dict__) == {keys!r}", f"list({e}.__dict__)", keys, src=e)
            state = {n: wrap(tx, obj.__dict__[n], ModuleDictSource(vt.source, "__dict__", n)) if (
                p := se.pending_attr(obj, n)) is None else p for n in [*keys, *(n for i, n in se.attrs
                                                                                      if i == id(obj))]}
        out = memo[id(vt)] = NewObjectVariable(cls)
        out.attrs = {k: sub(v) for k, v in state.items()}
    else:
        raise Unsupported(what + " (not traced)", hint="it runs outside the graph")
    return memo.setdefault(id(vt), out)


class GetterVariable(VariableTracker):
    """``operator.itemgetter(*keys)`` / ``operator.attrgetter(*names)``."""

    def __init__(self, kind, keys):
        super().__init__(None)
        self.kind, self.keys = kind, keys

    def python_type(self):
        return operator.itemgetter if self.kind == "item" else operator.attrgetter

    def call_function(self, tx, args, kwargs):
        obj, out = args[0], []
        for k in self.keys:
            if self.kind == "item":
                out.append(tx.getitem(obj, k))
            else:
                v = obj
                for part in k.as_python_constant().split("."):
                    v = tx.getattr(v, part)
                out.append(v)
        return out[0] if len(out) == 1 else TupleVariable(out)


builtin(operator.itemgetter)(lambda tx, args, kwargs: GetterVariable("item", list(args)))
builtin(operator.attrgetter)(lambda tx, args, kwargs: GetterVariable("attr", list(args)))
