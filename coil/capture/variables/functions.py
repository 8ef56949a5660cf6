"""Trackers for callables written in Python: functions, closures, bound methods, ``functools.partial``. Calling one
inlines its bytecode into the current graph (:meth:`InstructionTranslator.inline_call`); a graph break inside an inlined
call breaks at the call in the root frame, whose callee is then captured on its own."""
from __future__ import annotations

import functools
import types

from coil.exc import Unsupported
from coil.capture.source import AttrSource, ConstSource, DefaultsSource, GetItemSource
from coil.capture.variables.base import AttributeMissing, ConstantVariable, VariableTracker, is_literal, wrap
from coil.capture.variables.containers import BoundMethodVariable, DictVariable, TupleVariable


class BaseFunctionVariable(VariableTracker):
    """Something with a code object the translator can inline (by default that of the Python function ``self.fn``)."""

    def get_code(self) -> types.CodeType:
        return self.fn.__code__

    def get_globals(self) -> dict:
        return self.fn.__globals__

    def closure_cells(self, tx) -> dict:
        return {}

    def bind_args(self, tx, args: list, kwargs: dict) -> dict:
        raise NotImplementedError

    def fn_name(self) -> str:
        return self.get_code().co_name

    def call_function(self, tx, args, kwargs):
        return tx.inline_call(self, args, kwargs)


def bind_arguments(code: types.CodeType, name: str, args: list, kwargs: dict, defaults: list, kwdefaults: dict) -> dict:
    """Bind trackers to a code object's parameters, as CPython would.

    ``defaults`` are trackers for the trailing positional defaults, ``kwdefaults`` a
    dict name → tracker. Raises Unsupported (TypeError in eager) on a bad call."""
    nargs, nposonly, nkwonly, varnames = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, \
        code.co_varnames
    pos_names, kwonly_names = varnames[:nargs], varnames[nargs:nargs + nkwonly]
    has_varargs, has_varkw = bool(code.co_flags & 0x04), bool(code.co_flags & 0x08)
    out: dict[str, VariableTracker] = dict(zip(pos_names, args[:nargs]))
    if (extra := list(args[nargs:])) and not has_varargs:
        raise TypeErrorInCall(f"{name}() takes {nargs} positional arguments but {len(args)} were given")
    varkw = {}
    for k, v in kwargs.items():
        if k in out:
            raise TypeErrorInCall(f"{name}() got multiple values for argument '{k}'")
        if (k in pos_names and pos_names.index(k) >= nposonly) or k in kwonly_names:
            out[k] = v
        elif has_varkw:
            varkw[k] = v
        else:
            raise TypeErrorInCall(f"{name}() got an unexpected keyword argument '{k}'")
    ndef = len(defaults)
    for i, pname in enumerate(pos_names):
        if pname not in out:
            if (j := i - (nargs - ndef)) < 0:
                raise TypeErrorInCall(f"{name}() missing required positional argument: '{pname}'")
            out[pname] = defaults[j]
    for kname in kwonly_names:
        if kname not in out:
            if kname not in kwdefaults:
                raise TypeErrorInCall(f"{name}() missing required keyword-only argument: '{kname}'")
            out[kname] = kwdefaults[kname]
    idx = nargs + nkwonly
    if has_varargs:
        out[varnames[idx]] = TupleVariable(extra)
        idx += 1
    if has_varkw:
        out[varnames[idx]] = DictVariable(varkw)
    return out


class TypeErrorInCall(Exception):
    """A call's arguments do not fit the signature (eager raises TypeError)."""


class UserFunctionVariable(BaseFunctionVariable):
    """A Python function object that existed before tracing."""

    def __init__(self, fn: types.FunctionType, source=None):
        super().__init__(source)
        self.fn = fn

    def python_type(self):
        return types.FunctionType

    def as_python_constant(self):
        return self.fn

    def closure_cells(self, tx):
        cells = {}
        if self.fn.__closure__:
            for i, (name, cell) in enumerate(zip(self.fn.__code__.co_freevars, self.fn.__closure__)):
                # no source for the function (a method reached through its class, a hook):
                # the cell itself is held, so reads are still guarded and writes replayed
                base = GetItemSource(AttrSource(self.source, "__closure__"), i) if self.source \
                    is not None else ConstSource(tx.output.guards.const(cell))
                cells[name] = tx.output.sourced_cell(cell, AttrSource(base, "cell_contents"))
        return cells

    def bind_args(self, tx, args, kwargs):
        src, defs = self.source, self.fn.__defaults__ or ()
        if src is not None and defs and is_literal(defs):
            # one identity check of the (immutable) tuple instead of one per default used: HF's decorators take ten
            # None defaults each, and a Marian forward read 60 of them per call
            tx.output.guards.add(f"{src.expr()}.__defaults__ is {tx.output.guards.const(defs)}")
            src_of = lambda i: None  # noqa: E731
        else:
            src_of = lambda i: DefaultsSource(src, i) if src else None  # noqa: E731
        defaults = [wrap(tx, d, src_of(i)) for i, d in enumerate(defs)]
        kwdefaults = {k: wrap(tx, d, DefaultsSource(src, k, kw=True) if src else None)
                      for k, d in (self.fn.__kwdefaults__ or {}).items()}
        return bind_arguments(self.fn.__code__, self.fn.__name__, args, kwargs, defaults, kwdefaults)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__code__"):
            return ConstantVariable(getattr(self.fn, name))
        if name in ("__defaults__", "__kwdefaults__") and self.source is not None:
            return wrap(tx, getattr(self.fn, name), AttrSource(self.source, name))
        if name in self.fn.__dict__:
            src = AttrSource(self.source, name) if self.source is not None else None
            return wrap(tx, self.fn.__dict__[name], src)
        if name == "__get__":
            return BoundMethodVariable(self, name)
        if not hasattr(self.fn, name):
            if self.source is not None:   # absent now; guard that it stays absent
                tx.output.guards.add(f"not hasattr({self.source.expr()}, {name!r})")
            raise AttributeMissing(name)
        raise Unsupported(f"function attribute {name}")

    def call_method(self, tx, name, args, kwargs):
        if name == "__get__" and 1 <= len(args) <= 2 and not kwargs:   # func.__get__(obj, cls): a bound method
            none = isinstance(args[0], ConstantVariable) and args[0].value is None
            return self if none else UserMethodVariable(self.fn, args[0])
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        # no source (``obj.method.__func__``): the object itself, which predates the frame
        return cg.source_expr(self.source) if self.source is not None else cg.const_expr(self.fn)

    def __repr__(self):
        return f"UserFunctionVariable({self.fn.__qualname__})"


class NestedFunctionVariable(BaseFunctionVariable):
    """A function created inside the traced frame (``MAKE_FUNCTION``)."""

    def __init__(self, code, name, globals_, defaults, kwdefaults, closure, annotations=None):
        super().__init__(None)
        self.code, self.name, self.globals = code, name, globals_
        self.defaults, self.kwdefaults = defaults or [], kwdefaults or {}
        self.closure = closure or []  # CellVariable / SourcedCellVariable list

    def python_type(self):
        return types.FunctionType

    def get_code(self):
        return self.code

    def get_globals(self):
        return self.globals

    def closure_cells(self, tx):
        return dict(zip(self.code.co_freevars, self.closure))

    def bind_args(self, tx, args, kwargs):
        return bind_arguments(self.code, self.name, args, kwargs, self.defaults, self.kwdefaults)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__"):
            return ConstantVariable(self.name)
        if name == "__code__":
            return ConstantVariable(self.code)
        raise Unsupported(f"attribute {name} of a nested function")

    def reconstruct(self, cg):
        closure = "(" + ", ".join(cg.reconstruct_cell(c) for c in self.closure) + ",)" if self.closure else "None"
        defaults = "(" + "".join(cg.reconstruct(d) + ", " for d in self.defaults) + ")" if self.defaults else "None"
        fn = (f"___make_function({cg.const_expr(self.code)}, {cg.const_expr(self.globals)}, "
              f"{self.name!r}, {defaults}, {closure})")
        return cg.bind(self, fn)

    def __repr__(self):
        return f"NestedFunctionVariable({self.name})"


class UserMethodVariable(BaseFunctionVariable):
    """A Python function bound to ``obj`` (a tracker): ``obj.method``."""

    def __init__(self, fn: types.FunctionType, obj: VariableTracker, source=None):
        super().__init__(source)
        self.fn, self.obj = fn, obj

    def python_type(self):
        return types.MethodType

    def closure_cells(self, tx):
        return UserFunctionVariable(self.fn).closure_cells(tx)

    def bind_args(self, tx, args, kwargs):
        return UserFunctionVariable(self.fn).bind_args(tx, [self.obj] + list(args), kwargs)

    def var_getattr(self, tx, name):
        if name == "__self__":
            return self.obj
        if name == "__func__":
            return UserFunctionVariable(self.fn)
        if name in ("__name__", "__qualname__"):
            return ConstantVariable(getattr(self.fn, name))
        raise Unsupported(f"method attribute {name}")

    def reconstruct(self, cg):
        return cg.source_expr(self.source) if self.source is not None else \
            f"___MethodType({cg.const_expr(self.fn)}, {cg.reconstruct(self.obj)})"

    def __repr__(self):
        return f"UserMethodVariable({self.fn.__qualname__})"


class PartialVariable(VariableTracker):
    """``functools.partial(fn, *args, **kwargs)``."""

    def __init__(self, fn: VariableTracker, args: list, kwargs: dict, source=None):
        super().__init__(source)
        self.fn, self.args, self.kwargs = fn, list(args), dict(kwargs)

    def python_type(self):
        return functools.partial

    def call_function(self, tx, args, kwargs):
        return tx.call(self.fn, self.args + list(args), {**self.kwargs, **kwargs})

    def var_getattr(self, tx, name):
        if name == "func":
            return self.fn
        if name == "args":
            return TupleVariable(self.args)
        if name == "keywords":
            return DictVariable(self.kwargs)
        raise Unsupported(f"partial attribute {name}")

    def children(self):
        return [self.fn] + self.args + list(self.kwargs.values())

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        parts = [cg.reconstruct(self.fn)] + [cg.reconstruct(a) for a in self.args]
        parts += [f"{k}={cg.reconstruct(v)}" for k, v in self.kwargs.items()]
        return f"___partial({', '.join(parts)})"
