"""VariableTracker: the symbolic value the translator pushes on its stack.

Every Python value seen while translating a frame is a tracker. Subclasses decide what the operations on it mean: a
:class:`~.tensor.TensorVariable` turns calls into FX nodes, a :class:`ConstantVariable` folds them, containers hold
trackers, and objects we know nothing about raise :class:`coil.exc.Unsupported` (a graph break). The interface
(``python_type``, ``as_python_constant``, ``var_getattr``, ``call_function``, ``call_method``, ``unpack``,
``reconstruct``...; the defaults raise ``Unsupported``) is listed in docs/capture.md, "How to add a VariableTracker".
``source`` says where a value came from (:mod:`coil.capture.source`)."""
from __future__ import annotations

import enum
import inspect
import itertools
import types as _types
from typing import Any, Optional

import torch

from coil.exc import Unsupported

_BIRTHS = itertools.count(1)


class AttributeMissing(Exception):
    """Attribute lookup failed (AttributeError in eager); ``getattr(o, n, default)`` and ``hasattr`` catch it."""


def wrap(tx, value, source, guard: bool = True) -> "VariableTracker":
    """:func:`coil.capture.variables.builder.wrap`, imported per call (builder imports the tracker modules)."""
    from coil.capture.variables.builder import wrap
    return wrap(tx, value, source, guard)


def instance_dict_attr(tx, real, source, name: str):
    """``real.__dict__[name]`` wrapped with its source, or None when ``name`` is not there (guarded to stay absent:
    adding it later recompiles). ``real``: the object a traced tensor or container with ``source`` stands for."""
    if name in real.__dict__:
        from coil.capture.source import AttrSource
        return wrap(tx, real.__dict__[name], AttrSource(source, name))
    e = source.expr()
    tx.output.guards.add(f"{name!r} not in {e}.__dict__", f"{name!r} in {e}.__dict__", False, src=e)
    return None


def wrap_constant_result(tx, value) -> "VariableTracker":
    """:func:`coil.capture.variables.builder.wrap_constant_result`, imported per call (as :func:`wrap`)."""
    from coil.capture.variables.builder import wrap_constant_result
    return wrap_constant_result(tx, value)


class VariableTracker:
    """Base class of all trackers (see module docstring)."""

    source = None
    birth = 0   # creation order (a higher-order operator's body may mutate what it made)

    def __init__(self, source=None):
        self.source, self.birth = source, next(_BIRTHS)

    # --- introspection -------------------------------------------------------------
    def python_type(self) -> type:
        raise Unsupported(f"type of {self} is unknown")

    def del_attr(self, tx, name: str):
        raise Unsupported("del of an attribute")

    def as_python_constant(self) -> Any:
        raise Unsupported(f"{self} is not a compile-time constant")

    def as_python_constant_or_none(self):
        try:
            return self.as_python_constant()
        except Unsupported:
            return None

    def is_python_constant(self) -> bool:
        """Known at compile time *without* a guard: a container holding a symbolic size
        is not (asking ``as_python_constant`` of it would specialize the size)."""
        if not all(c.is_python_constant() for c in self.children()):
            return False
        try:
            self.as_python_constant()
            return True
        except Unsupported:
            return False

    def truthy(self, tx) -> bool:
        """``bool(value)`` known at compile time, or Unsupported."""
        return bool(self.as_python_constant())

    # --- operations ----------------------------------------------------------------
    def var_getattr(self, tx, name: str) -> "VariableTracker":
        raise Unsupported(f"attribute {name!r} of {self}")

    def call_function(self, tx, args: list, kwargs: dict) -> "VariableTracker":
        raise Unsupported(f"call to {self}")

    def call_method(self, tx, name: str, args: list, kwargs: dict) -> "VariableTracker":
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def unpack(self, tx) -> list:
        raise Unsupported(f"iteration over {self}")

    # --- output --------------------------------------------------------------------
    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return cg.source_expr(self.source)
        raise Unsupported(f"cannot rebuild {self} outside the graph")

    def children(self) -> list:
        """Trackers held inside this one (for collecting graph outputs)."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source})" if self.source else type(self).__name__


#: Values a ConstantVariable may hold: immutable, printable or namespace-held.
CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                  torch.layout, torch.memory_format, type(Ellipsis), type(NotImplemented),
                  torch.finfo, torch.iinfo, torch.Size, range, slice, frozenset)


def is_literal(value: Any) -> bool:
    if isinstance(value, (tuple, frozenset)) and type(value) in (tuple, frozenset):
        return all(is_literal(v) for v in value)
    return True if isinstance(value, enum.Enum) else type(value) in CONSTANT_TYPES


class ConstantVariable(VariableTracker):
    """A value known at compile time (int, str, dtype, None, Size, enum member...)."""

    def __init__(self, value: Any, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        return self.value

    def var_getattr(self, tx, name):
        if name.startswith("__") and name not in ("__name__", "__class__", "__doc__"):
            raise Unsupported(f"attribute {name} of constant {self.value!r}")
        try:
            value = getattr(self.value, name)
        except AttributeError:
            raise AttributeMissing(name)
        return wrap_constant_result(tx, value)

    def call_method(self, tx, name, args, kwargs):
        from coil.capture.translator import const_value
        # (a non-constant argument, e.g. int * tensor, raises: the other side decides)
        cargs, ckw = [const_value(a) for a in args], {k: const_value(v) for k, v in kwargs.items()}
        if name == "__len__":
            return wrap_constant_result(tx, len(self.value))
        if name == "__getitem__":
            return wrap_constant_result(tx, self.value[cargs[0]])
        if name == "__contains__":
            return wrap_constant_result(tx, cargs[0] in self.value)
        method = getattr(self.value, name)
        if isinstance(self.value, (str, bytes, int, float, complex, bool, type(None), torch.Size, torch.dtype,
                                   torch.device, range, slice, tuple, frozenset, inspect.Signature, inspect.Parameter,
                                   _types.MappingProxyType, _types.CodeType, __import__("dataclasses").Field)):
            return wrap_constant_result(tx, method(*cargs, **ckw))
        raise Unsupported(f"method {name} of {type(self.value).__name__} constant")

    def unpack(self, tx):
        if isinstance(self.value, (str, tuple, range, torch.Size, frozenset, bytes, _types.MappingProxyType)):
            return [wrap_constant_result(tx, v) for v in self.value]
        raise Unsupported(f"iteration over {self.value!r}")

    def reconstruct(self, cg):
        if self.source is not None and type(self.value) not in (int, float, bool, str, type(None)):
            return cg.source_expr(self.source)  # keeps the object's identity
        return cg.const_expr(self.value)

    def __repr__(self):
        return f"Const({self.value!r})"


class NumpyArrayVariable(ConstantVariable):
    """A numpy array computed at compile time from constants (``np.array(plan) // block``): ``value`` is a read-only
    view of it, so reads, arithmetic and pure numpy calls fold at trace time, and anything that would write into it
    (``a[i] = v``, ``a += 1``, ``out=``, ``a.sort()``) raises and becomes a graph break, after which eager runs on a
    fresh copy. Handed to torch it is a graph break too (``torch.from_numpy`` would share it across calls). Where it
    leaves the graph it is rebuilt as a new array holding the same data (two that share memory are not: eager's
    aliasing between them would be lost, so the frame runs eagerly)."""

    _WRITES = {"fill", "sort", "partition", "put", "itemset", "resize", "setflags", "setfield", "byteswap",
               "tofile", "dump", "__setitem__", "__delitem__"}

    def __init__(self, value):
        value = value.view()
        value.setflags(write=False)
        super().__init__(value)

    def _fold(self, what, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - (a write into the read-only view raises too): eager runs it
            raise Unsupported(f"numpy array {what} raised {type(e).__name__}") from None

    def var_getattr(self, tx, name):
        if name in ("base", "flags", "flat", "ctypes", "data", "__array_interface__"):  # (views of its memory)
            raise Unsupported(f"attribute {name} of a numpy array")
        if callable(getattr(self.value, name, None)):      # ``a.reshape(2, 3)``: call_method
            from coil.capture.variables.containers import BoundMethodVariable
            return BoundMethodVariable(self, name)
        return super().var_getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        from coil.capture.translator import const_value
        if name == "__iter__":
            from coil.capture.variables.containers import ListIteratorVariable
            return ListIteratorVariable(self.unpack(tx))
        if name in self._WRITES or name.startswith("__i") and name not in ("__invert__", "__index__", "__int__"):
            raise Unsupported(f"ndarray.{name} writes into a numpy array")
        cargs = [const_value(a) for a in args]
        if "out" in (ckw := {k: const_value(v) for k, v in kwargs.items()}):
            raise Unsupported("a numpy call with out=")
        return wrap_constant_result(tx, self._fold(name, lambda: getattr(self.value, name)(*cargs, **ckw)))

    def unpack(self, tx):
        return [wrap_constant_result(tx, v) for v in self._fold("iteration", lambda: list(self.value))]

    def truthy(self, tx):
        return self._fold("truth", lambda: bool(self.value))

    def reconstruct(self, cg):
        rebuilt = cg.__dict__.setdefault("numpy_arrays", [])
        if any(__import__("numpy").may_share_memory(self.value, a) for a in rebuilt):
            raise Unsupported("two numpy arrays computed in traced code, one a view of the other, escape the frame",
                              hint="the frame runs eagerly")
        rebuilt.append(self.value)
        return cg.bind(self, f"{cg.const_expr(self.value)}.copy(order='K')")

    def __repr__(self):
        return f"NumpyArray({self.value!r})"


class RealValueVariable(VariableTracker):
    """Base of trackers for a real object ``value`` that exists outside the trace: its type is the value's, and the
    entry reads it from its source, or holds it as a constant when it has none."""

    def __init__(self, value, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def reconstruct(self, cg):
        return cg.source_expr(self.source) if self.source is not None else cg.const_expr(self.value)


class KnownCallableVariable(VariableTracker):
    """Base of trackers that stand for one known Python callable ``fn`` (a builtin, a ``math``/``operator`` function, a
    torch function, a higher-order operator): the callable is its constant, and the entry holds it as one."""

    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def python_type(self):
        return type(self.fn)

    def as_python_constant(self):
        return self.fn

    def reconstruct(self, cg):
        return cg.const_expr(self.fn)

    def __repr__(self):
        return f"{type(self).__name__}({getattr(self.fn, '__name__', self.fn)})"


class NullVariable(VariableTracker):
    """The NULL CPython pushes below a callable (``PUSH_NULL``, ``LOAD_GLOBAL`` bit 0)."""

    def reconstruct(self, cg):
        raise Unsupported("NULL on the stack cannot be rebuilt as a value")


class _CellBase(VariableTracker):
    """A closure cell as a value (a resume function gets its frame's cells as arguments:
    ``cell.cell_contents`` reads and writes, resume.py)."""

    def python_type(self):
        return type((lambda: self).__closure__[0])

    def var_getattr(self, tx, name):
        if name != "cell_contents":
            raise Unsupported(f"cell attribute {name}")
        return tx.read_cell(self, "cell_contents")

    def reconstruct(self, cg):
        return cg.reconstruct_cell(self)


class CellVariable(_CellBase):
    """A closure cell created inside the traced frame (``MAKE_CELL``)."""

    def __init__(self, content: Optional[VariableTracker] = None):
        super().__init__(None)
        self.content = content


class SourcedCellVariable(_CellBase):
    """A real closure cell of a function that existed before tracing: reads are guarded values; writes are side
    effects replayed on the real cell."""

    def __init__(self, cell, source):
        super().__init__(source)
        self.cell = cell
