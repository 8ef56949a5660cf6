"""Trackers for tuples, lists, dicts (incl. OrderedDict), sets, slices and iterators.

Containers hold trackers. Lists, dicts and sets are mutable: a mutation inside the frame changes the tracker in place
(so aliases see it), and when the container existed before the frame (it has a ``source``) the mutation is recorded as a
side effect; the entry function then writes the final contents back into the real object (``src[:] = [...]``,
``src.clear(); src.update(...)``)."""
from __future__ import annotations

import collections
import operator
import types
from typing import Any

import torch

from coil.exc import Unsupported
from coil.capture.source import GetItemSource, IterRestSource, iter_rest
from coil.capture.variables.base import (AttributeMissing, ConstantVariable, VariableTracker, instance_dict_attr, wrap,
                                         wrap_constant_result)


def _const_index(tx, v: VariableTracker):
    if isinstance(v, SliceVariable):
        return slice(*[p.as_python_constant() for p in v.parts])
    if isinstance(c := v.as_python_constant(), bool) or not isinstance(c, (int, slice)):
        if hasattr(c, "__index__"):
            return operator.index(c)
        raise Unsupported(f"sequence index {c!r}")
    return c


class BoundMethodVariable(VariableTracker):
    """``obj.name`` where ``obj``'s tracker implements the method itself
    (tensor, list, dict methods): calling it is ``obj.call_method(name, ...)``."""

    def __init__(self, obj: VariableTracker, name: str):
        super().__init__(None)
        self.obj, self.name = obj, name

    def python_type(self):
        return types.BuiltinMethodType

    def call_function(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, list(args), dict(kwargs))

    def var_getattr(self, tx, name):
        if name == "__self__":
            return self.obj
        if name == "__name__":
            return ConstantVariable(self.name)
        raise Unsupported(f"attribute {name} of a bound method")

    def reconstruct(self, cg):
        return cg.source_expr(self.source) if self.source is not None else f"{cg.reconstruct(self.obj)}.{self.name}"

    def __repr__(self):
        return f"BoundMethodVariable({self.obj!r}.{self.name})"


def method_getattr(self, tx, name):
    """``var_getattr`` of trackers whose attributes are all methods: ``self.name`` bound. A name the type lacks is
    missing, as in eager (``hasattr(model_output, "vision_hidden_states")`` was True, and reading it then failed)."""
    try:
        cls = self.python_type()
    except Unsupported:
        cls = None
    real = next((v for v, vt in tx.output.wrapped.values() if vt is self), None) if self.source is not None and \
        getattr(cls, "__dictoffset__", 0) else None   # (instances of a subclass without __slots__ have a __dict__)
    if getattr(real, "__dict__", None) is not None and \
            (found := instance_dict_attr(tx, real, self.source, name)) is not None:  # ``batch.extra = 9``
        return found
    if cls is not None and not hasattr(cls, name):
        raise AttributeMissing(name)
    return BoundMethodVariable(self, name)


class BaseListVariable(VariableTracker):
    """Shared code of tuples and lists (``items`` is a Python list of trackers)."""

    mutable = False

    def __init__(self, items, source=None):
        super().__init__(source)
        self.items = list(items)

    def children(self):
        return list(self.items)

    def unpack(self, tx):
        return list(self.items)

    def as_python_constant(self):
        return self.python_type()(i.as_python_constant() for i in self.items)

    def truthy(self, tx):
        return bool(self.items)

    def getitem(self, tx, index: VariableTracker):
        if isinstance(idx := _const_index(tx, index), slice):
            return type(self)(self.items[idx]) if not isinstance(self, NamedTupleVariable) \
                else TupleVariable(self.items[idx])
        try:
            return self.items[idx]
        except IndexError:
            raise Unsupported("index out of range (raised by user code)")

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__contains__":
            return ConstantVariable(tx.contains(self.items, args[0]))
        if name == "index":    # (start and stop clamp as a slice's bounds do)
            lo, hi, _ = slice(*([a.as_python_constant() for a in args[1:3]] + [None] * 2)[:2]).indices(len(self.items))
            for i, it in zip(range(lo, hi), self.items[lo:hi]):
                if tx.values_equal(it, args[0]):
                    return ConstantVariable(i)
            raise Unsupported("list.index: value not found")
        if name == "count":
            return ConstantVariable(sum(tx.values_equal(it, args[0]) for it in self.items))
        if name in ("__add__",) and isinstance(args[0], BaseListVariable):
            return type(self)(self.items + args[0].items)
        if name == "__mul__":
            return type(self)(self.items * args[0].as_python_constant())
        if name == "__iter__":
            return ListIteratorVariable(self.items, container=self if self.mutable else None)
        raise Unsupported(f"{self.python_type().__name__}.{name}")

    def reconstruct(self, cg):
        if self.source is not None and not self.mutable:
            return cg.source_expr(self.source)
        return cg.reconstruct_container(self)


class TupleVariable(BaseListVariable):
    def python_type(self):
        return tuple

    var_getattr = method_getattr

    def build_expr(self, cg):
        parts = [cg.reconstruct(i) for i in self.items]
        return "(" + "".join(p + ", " for p in parts) + ")"


class SizeVariable(TupleVariable):
    """``torch.Size`` whose items may be non-constant (kept for ``x.shape`` results)."""

    def python_type(self):
        return torch.Size

    def build_expr(self, cg):
        return f"{cg.const_expr(torch.Size)}({TupleVariable.build_expr(self, cg)})"

    def var_getattr(self, tx, name):
        return BoundMethodVariable(self, name) if name in ("numel", "index", "count") else super().var_getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "numel" and not args and not kwargs:     # symbolic product, no guard
            total = ConstantVariable(1)
            for i in self.items:
                total = tx.binary_op(operator.mul, total, i)
            return total
        return super().call_method(tx, name, args, kwargs)


class NamedTupleVariable(TupleVariable):
    """An instance of a ``collections.namedtuple`` / ``typing.NamedTuple`` class."""

    def __init__(self, items, tuple_cls, source=None):
        super().__init__(items, source)
        self.tuple_cls = tuple_cls

    def python_type(self):
        return self.tuple_cls

    def as_python_constant(self):
        return self.tuple_cls(*[i.as_python_constant() for i in self.items])

    def var_getattr(self, tx, name):
        if name in (fields := getattr(self.tuple_cls, "_fields", ())):
            return self.items[fields.index(name)]
        if name in ("_replace", "_asdict"):
            return BoundMethodVariable(self, name)
        if name == "_fields":
            return ConstantVariable(tuple(fields))
        if not fields and hasattr(self.tuple_cls, "n_fields") and not name.startswith("_"):
            # torch.return_types structseq: find the field's position with a probe instance
            probe = self.tuple_cls(tuple(range(len(self.items))))
            if isinstance(idx := getattr(probe, name, None), int):
                return self.items[idx]
        from coil.capture.variables.objects import wrap_class_attr
        return wrap_class_attr(tx, self, self.tuple_cls, name)

    def call_method(self, tx, name, args, kwargs):
        fields = getattr(self.tuple_cls, "_fields", ())
        if name == "_replace":
            items = list(self.items)
            for k, v in kwargs.items():
                items[fields.index(k)] = v
            return NamedTupleVariable(items, self.tuple_cls)
        if name == "_asdict":
            return DictVariable(dict(zip(fields, self.items)))
        return super().call_method(tx, name, args, kwargs)

    def build_expr(self, cg):
        star = "*" if hasattr(self.tuple_cls, "_fields") else ""   # (a torch.return_types structseq takes one tuple)
        return f"{cg.const_expr(self.tuple_cls)}({star}{TupleVariable.build_expr(self, cg)})"


class ListVariable(BaseListVariable):
    mutable = True

    def python_type(self):
        return list

    def as_python_constant(self):
        raise Unsupported("a list is not a compile-time constant")

    var_getattr = method_getattr

    def _mutated(self, tx):
        tx.output.side_effects.mutated(self)

    def call_method(self, tx, name, args, kwargs):
        items = self.items
        in_place = {"append": lambda: items.append(args[0]), "extend": lambda: items.extend(tx.unpack(args[0])),
                    "insert": lambda: items.insert(args[0].as_python_constant(), args[1]), "clear": items.clear,
                    "reverse": items.reverse}  # methods returning None
        if name in in_place:
            self._mutated(tx)
            in_place[name]()
            return ConstantVariable(None)
        if name == "pop":
            self._mutated(tx)
            return items.pop(args[0].as_python_constant() if args else -1)
        if name == "remove":
            for i, it in enumerate(items):
                if tx.values_equal(it, args[0]):
                    self._mutated(tx)
                    del items[i]
                    return ConstantVariable(None)
            raise Unsupported("list.remove: value not found")
        if name == "copy":
            return ListVariable(list(items))
        if name == "sort":
            key = kwargs.get("key")
            new = tx.sorted_items(items, key, kwargs.get("reverse", ConstantVariable(False)).as_python_constant())
            self._mutated(tx)
            items[:] = new
            return ConstantVariable(None)
        if name == "__setitem__":
            self._mutated(tx)
            idx = _const_index(tx, args[0])
            items[idx] = tx.unpack(args[1]) if isinstance(idx, slice) else args[1]
            return ConstantVariable(None)
        if name == "__delitem__":
            self._mutated(tx)
            del items[_const_index(tx, args[0])]
            return ConstantVariable(None)
        if name in ("__iadd__", "__imul__"):
            new = items + tx.unpack(args[0]) if name == "__iadd__" else items * args[0].as_python_constant()
            self._mutated(tx)
            items[:] = new
            return self
        return super().call_method(tx, name, args, kwargs)

    def build_expr(self, cg):
        return "[" + ", ".join(cg.reconstruct(i) for i in self.items) + "]"


class DequeVariable(ListVariable):
    """A ``collections.deque`` built in the frame (``ExitStack``'s callbacks, a ``deque(maxlen=n)`` rolling buffer):
    a list of items whose appends past ``maxlen`` drop from the other end. Deques read from outside the frame stay
    opaque."""

    _METHODS = ("append", "appendleft", "pop", "popleft", "extend", "extendleft", "clear", "copy", "count", "index",
                "remove", "reverse", "rotate", "__len__", "__contains__", "__getitem__", "__iter__", "__bool__")

    def __init__(self, items, maxlen=None):
        super().__init__(items[len(items) - maxlen:] if maxlen is not None and len(items) > maxlen else items)
        self.maxlen = maxlen

    def python_type(self):
        return collections.deque

    def var_getattr(self, tx, name):
        return ConstantVariable(self.maxlen) if name == "maxlen" else method_getattr(self, tx, name)

    def _trim(self, left: bool):
        while self.maxlen is not None and len(self.items) > self.maxlen:
            self.items.pop(-1 if left else 0)

    def call_method(self, tx, name, args, kwargs):
        items = self.items
        if name not in self._METHODS or kwargs:
            raise Unsupported(f"deque.{name}")
        if name in ("pop", "popleft"):
            if args or not items:
                raise Unsupported(f"deque.{name} raising (user code)")
            self._mutated(tx)
            return items.pop(-1 if name == "pop" else 0)
        if name in ("appendleft", "extendleft"):
            self._mutated(tx)
            for v in ([args[0]] if name == "appendleft" else tx.unpack(args[0])):
                items.insert(0, v)
                self._trim(True)
            return ConstantVariable(None)
        if name == "rotate":
            n = (args[0].as_python_constant() if args else 1) % max(len(items), 1)
            self._mutated(tx)
            items[:] = items[-n:] + items[:-n] if n else items
            return ConstantVariable(None)
        if name == "copy":
            return DequeVariable(list(items), self.maxlen)
        if name == "__bool__":
            return ConstantVariable(bool(items))
        if name == "__iter__":
            return self.iterator()
        if name == "__getitem__" and not isinstance(_const_index(tx, args[0]), int):
            raise Unsupported("deque index that is not an int")
        res = super().call_method(tx, name, args, kwargs)
        if name in ("append", "extend"):
            self._trim(False)
        return res

    def _mutated(self, tx):
        super()._mutated(tx)
        self.version = getattr(self, "version", 0) + 1

    def iterator(self):
        """An iterator over the items now; a later change to the deque is eager's RuntimeError at its next step."""
        it = ListIteratorVariable(self.items, container=self)     # (rebuilt at a break over the real deque)
        it.deque, it.deque_version = self, getattr(self, "version", 0)
        return it

    def build_expr(self, cg):
        return f"{cg.const_expr(collections.deque)}({super().build_expr(cg)}, {self.maxlen!r})"


_PROXY_READS = ("__getitem__", "__len__", "__contains__", "get", "keys", "values", "items", "__iter__")


class DictVariable(VariableTracker):
    """A dict (or OrderedDict / other dict subclass) with compile-time-constant keys."""

    mutable = True

    def __init__(self, items: dict, user_cls=dict, source=None):
        super().__init__(source)
        self.items: dict[Any, VariableTracker] = dict(items)
        self.user_cls = user_cls

    def python_type(self):
        return self.user_cls

    def children(self):
        return list(self.items.values())

    def truthy(self, tx):
        return bool(self.items)

    def unpack(self, tx):
        return [ConstantVariable(k) if not isinstance(k, VariableTracker) else k for k in self.items]

    @staticmethod
    def key_of(v: VariableTracker):
        from coil.capture.variables.objects import ObjectVariableBase
        return v.value if isinstance(v, ObjectVariableBase) and v.value is not None else v.as_python_constant()

    def wrap_key(self, tx, k):
        if isinstance(k, (str, int, float, bool, type(None), tuple, torch.dtype)):
            return ConstantVariable(k)
        raise Unsupported("non-constant dict key")

    def _mutated(self, tx):
        tx.output.side_effects.mutated(self)

    default_factory = None

    def getitem(self, tx, key):
        if (k := self.key_of(key)) not in self.items and self.default_factory is not None:
            self._mutated(tx)
            self.items[k] = tx.call(self.default_factory, [], {})
        if k not in self.items:
            raise Unsupported(f"KeyError {k!r} (raised by user code)")
        return self.items[k]

    var_getattr = method_getattr

    def call_method(self, tx, name, args, kwargs):
        if self.user_cls is types.MappingProxyType and name not in _PROXY_READS:   # (a read-only view)
            raise Unsupported(f"mappingproxy.{name}")
        if self.user_cls not in (dict, collections.OrderedDict) and type(self) is DictVariable:
            from coil.capture.variables.functions import UserMethodVariable
            from coil.capture.variables.objects import _static_lookup
            if isinstance(fn := _static_lookup(self.user_cls, name), types.FunctionType):
                return tx.call(UserMethodVariable(fn, self), args, kwargs)
        return self.call_method_base(tx, name, args, kwargs)

    def call_method_base(self, tx, name, args, kwargs):
        items = self.items
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstantVariable(len(items))
        if name == "__contains__":
            return ConstantVariable(self.key_of(args[0]) in items)
        if name == "get":
            if (k := self.key_of(args[0])) in items:
                return items[k]
            return args[1] if len(args) > 1 else kwargs.get("default", ConstantVariable(None))
        if name in ("keys", "values", "items"):
            view = ListIteratorVariable([], kind=name, container=self)
            view._tx = tx
            return view
        if name == "__iter__":
            return ListIteratorVariable(self.unpack(tx), container=self)
        in_place = {"__setitem__": lambda: items.__setitem__(self.key_of(args[0]), args[1]), "clear": items.clear,
                    "__delitem__": lambda: items.__delitem__(self.key_of(args[0]))}  # methods returning None
        if name in in_place:
            self._mutated(tx)
            in_place[name]()
            return ConstantVariable(None)
        if name == "pop":
            if (k := self.key_of(args[0])) in items:
                self._mutated(tx)
                return items.pop(k)
            if len(args) > 1:
                return args[1]
            raise Unsupported(f"KeyError {k!r} (raised by user code)")
        if name == "setdefault":
            if (k := self.key_of(args[0])) not in items:
                self._mutated(tx)
                items[k] = args[1] if len(args) > 1 else ConstantVariable(None)
            return items[k]
        if name == "update":
            self._mutated(tx)
            self.update_items(tx, args, kwargs)
            return ConstantVariable(None)
        if name == "copy":
            return DictVariable(dict(items), self.user_cls)
        if name == "move_to_end":
            k = self.key_of(args[0])
            last = (args[1] if len(args) > 1 else kwargs.get("last", ConstantVariable(True))).as_python_constant()
            self._mutated(tx)
            v = items.pop(k)
            if last:
                items[k] = v
            else:
                self.items = {k: v, **items}
            return ConstantVariable(None)
        if name == "popitem":
            last = (args[0] if args else kwargs.get("last", ConstantVariable(True))).as_python_constant()
            if not items or (args or kwargs) and not issubclass(self.user_cls, collections.OrderedDict):
                raise Unsupported(f"{self.user_cls.__name__}.popitem raising (user code)")
            self._mutated(tx)
            k = next(reversed(items)) if last else next(iter(items))   # OrderedDict.popitem(last=False): the first
            return TupleVariable([self.wrap_key(tx, k), items.pop(k)])
        if name == "__or__" and isinstance(args[0], DictVariable):
            return DictVariable({**items, **args[0].items}, self.user_cls)
        raise Unsupported(f"dict.{name}")

    def update_items(self, tx, args, kwargs) -> None:
        """``items.update(*args, **kwargs)`` with trackers (``dict.update``, ``dict(...)``)."""
        if args and isinstance(args[0], DictVariable):
            self.items.update(args[0].items)
        elif args:
            for pair in tx.unpack(args[0]):
                k, v = tx.unpack(pair)
                self.items[self.key_of(k)] = v
        self.items.update(kwargs)

    def view_items(self, tx, kind: str) -> list:
        """The items of ``d.keys()`` / ``d.values()`` / ``d.items()`` now."""
        if kind == "keys":
            return self.unpack(tx)
        if kind == "values":
            return list(self.items.values())
        return [TupleVariable([self.wrap_key(tx, k), v]) for k, v in self.items.items()]

    def build_expr(self, cg):
        body = "{" + ", ".join(f"{cg.const_expr(k)}: {cg.reconstruct(v)}" for k, v in self.items.items()) + "}"
        if self.user_cls is dict:
            return body
        if self.default_factory is not None:
            return f"{cg.const_expr(self.user_cls)}({cg.reconstruct(self.default_factory)}, {body})"
        return f"{cg.const_expr(self.user_cls)}({body})"

    def reconstruct(self, cg):
        return cg.reconstruct_container(self)


class SetVariable(VariableTracker):
    """A set of compile-time constants."""

    mutable = True

    def __init__(self, items, source=None):
        super().__init__(source)
        self.items = set(items)

    def python_type(self):
        return set

    def as_python_constant(self):
        return set(self.items)

    def unpack(self, tx):
        return [ConstantVariable(v) for v in self.items]

    var_getattr = method_getattr

    def call_method(self, tx, name, args, kwargs):
        if name in ("add", "discard", "remove", "update", "clear", "difference_update", "intersection_update",
                    "symmetric_difference_update"):
            tx.output.side_effects.mutated(self)
            cargs = [set(a.as_python_constant()) if name.endswith("update") else a.as_python_constant() for a in args]
            getattr(self.items, name)(*cargs)
            return ConstantVariable(None)
        cargs = [a.as_python_constant() for a in args]     # (``__contains__``, ``__len__``, ``union``...)
        res = getattr(self.items, name)(*cargs)
        return SetVariable(res) if isinstance(res, set) else ConstantVariable(res)

    def build_expr(self, cg):
        return "set()" if not self.items else "{" + ", ".join(cg.const_expr(v) for v in self.items) + "}"

    def reconstruct(self, cg):
        return cg.reconstruct_container(self)


class SliceVariable(VariableTracker):
    """``slice(start, stop, step)``; parts may be trackers of ints or None."""

    def __init__(self, parts):
        super().__init__(None)
        self.parts = list(parts)

    def python_type(self):
        return slice

    def as_python_constant(self):
        return slice(*[p.as_python_constant() for p in self.parts])

    def children(self):
        return list(self.parts)

    def var_getattr(self, tx, name):
        parts = list(self.parts) if len(self.parts) != 1 else [ConstantVariable(None)] + self.parts
        parts += [ConstantVariable(None)] * (3 - len(parts))
        if name in ("start", "stop", "step"):
            return parts[("start", "stop", "step").index(name)]
        return BoundMethodVariable(self, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "indices":
            return wrap_constant_result(tx, self.as_python_constant().indices(args[0].as_python_constant()))
        raise Unsupported(f"slice.{name}")

    def reconstruct(self, cg):
        return f"slice({', '.join(cg.reconstruct(p) for p in self.parts)})"


class ListIteratorVariable(VariableTracker):
    """An iterator over known items (lists, tuples, ranges, zip/enumerate results,
    dict views). ``next`` advances ``index``; iteration never touches real objects."""

    mutable = True
    container = None     # ListVariable read live; DictVariable/SetVariable whose size is fixed
    size = None

    def __init__(self, items, kind="iterator", container=None, view="keys"):
        super().__init__(None)
        self.items = list(items)
        self.index, self.kind = 0, kind
        if container is not None:
            self.container = container
            self.size = len(container.items)
            self.view = kind if kind in ("keys", "values", "items") else view
            self._tx = None

    @property
    def items(self):
        """The items iterated. Over a list they are the list's own (CPython's list
        iterator sees items appended or removed during the loop) until exhausted."""
        if isinstance(c := self.container, ListVariable):
            return c.items
        if isinstance(c, DictVariable) and self.kind != "iterator":
            return c.view_items(self._tx, self.kind)     # a dict view is live too
        return self._items

    @items.setter
    def items(self, value):
        self._items = list(value)

    def python_type(self):
        return {"keys": type({}.keys()), "values": type({}.values()),
                "items": type({}.items())}.get(self.kind, type(iter([])))

    def children(self):
        return self.items[self.index:]

    def _check_size(self):
        if (d := getattr(self, "deque", None)) is not None and getattr(d, "version", 0) != self.deque_version:
            raise Unsupported("deque mutated during iteration (raised by user code)", hint="the frame runs eagerly")
        if (c := self.container) is not None and not isinstance(c, ListVariable) and len(c.items) != self.size:
            # eager raises RuntimeError here; the frame runs eagerly so that it does
            what = "dictionary" if isinstance(c, DictVariable) else "Set"
            raise Unsupported(f"{what} changed size during iteration (raised by user code)",
                              hint="the frame runs eagerly")

    def _exhaust(self):
        if self.kind == "iterator" and self.container is not None:
            self._items = list(self.items)     # CPython drops the container
            self.container = None

    def next(self, tx):
        self._check_size()
        if self.index >= len(self.items):
            self._exhaust()
            return None
        v = self.items[self.index]
        self.index += 1
        return v

    def unpack(self, tx):
        self._check_size()
        rest = self.items[self.index:]
        if self.kind == "iterator":
            self.index = len(self.items)
            self._exhaust()
        return rest

    var_getattr = method_getattr

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__":
            return ConstantVariable(len(self.items) - self.index)
        if name == "__contains__":
            return ConstantVariable(tx.contains(self.items[self.index:], args[0]))
        if name == "__iter__":
            return self if self.kind == "iterator" else self.iterate()
        if name == "__next__" and self.kind == "iterator" and not args and not kwargs:   # it.__next__(): next(it)
            from coil.capture.variables.builtins import _next
            return _next(tx, [self], {})
        raise Unsupported(f"iterator method {name}")

    def iterate(self):
        """A fresh iterator over this dict view (checking its dict's size from now on)."""
        return ListIteratorVariable(self.items, container=self.container, view=getattr(self, "view", "keys"))

    def reconstruct(self, cg):
        c = self.container
        self._check_size()
        if c is not None and self.kind == "iterator":
            # a real iterator over the real container, advanced to this one's position, so
            # later mutations behave as in eager (list appends seen, dict resizes raise)
            obj = cg.reconstruct(c)
            it = f"iter({obj}.{self.view}())" if isinstance(c, DictVariable) else f"iter({obj})"
            return cg.bind(self, f"{cg.const_expr(advanced)}({it}, {self.index})")   # one object for every use
        inner = "(" + "".join(cg.reconstruct(i) + ", " for i in self.items[self.index:]) + ")"
        if self.kind == "iterator":
            return cg.bind(self, f"iter({inner})")
        return f"dict({inner}).items()" if self.kind == "items" else f"list({inner})"


class ResumedIteratorVariable(ListIteratorVariable):
    """A tuple or range iterator a resume function receives on its stack: the loop a graph
    break interrupted (``for layer in self.layers``, rebuilt as ``iter((...))`` there).

    Read lazily through its source: the ``i``-th item taken is ``___iter_rest(it)[i]``, guarded by ``length_hint(it) >
    i`` (and ``== i`` where the loop ends), so one compile serves every position of the loop whose items trace alike,
    not one per remaining count. At a later break it is the real iterator advanced by the items taken."""

    def __init__(self, value, source):
        VariableTracker.__init__(self, source)
        self.value = value
        self._items, self.index, self.kind, self._tx = [], 0, "iterator", None

    def _take(self, tx, i: int):
        rest = iter_rest(self.value)
        gs, src = tx.output.guards, self.source.expr()
        if i >= len(rest):
            gs.add(f"___length_hint({src}) == {i}", f"___length_hint({src})", i)
            return None
        gs.add(f"___length_hint({src}) > {i}", f"___length_hint({src})", len(rest))
        return wrap(tx, rest[i], GetItemSource(IterRestSource(self.source), i))

    def next(self, tx):
        if (v := self._take(tx, len(self._items))) is not None:
            self._items.append(v)
            self.index += 1
        return v

    def unpack(self, tx):
        while self.next(tx) is not None:
            pass
        rest = self._items[self.index:]
        self.index = len(self._items)
        return rest

    def reconstruct(self, cg):
        if type(self.value) is _LIST_ITERATOR:      # the real one, over the list the code after the break may grow
            return cg.bind(self, f"{cg.const_expr(advanced)}({self.source.expr()}, {len(self._items)})")
        # a new iterator over the items left (the real one is not advanced: other
        # expressions of the entry still read items through it)
        return cg.bind(self, f"iter({IterRestSource(self.source).expr()}[{len(self._items)}:])")

    def __repr__(self):
        return f"ResumedIteratorVariable({type(self.value).__name__}, {self.source})"


#: iterator types a resume function's stack may hold that it reads lazily (builder.py)
RESUMED_ITERATORS = (type(iter(())), type(iter(range(0))), _LIST_ITERATOR := type(iter([])))


def resumed_iterator(tx, value, source):
    """The tracker for iterator ``value`` on a resume function's stack (``source``), or
    None: tuple and range iterators, and ``enumerate`` / ``zip`` over them."""
    if (t := type(value)) not in RESUMED_ITERATORS + (enumerate, zip):
        return None
    gs, src = tx.output.guards, source.expr()
    gs.add(f"type({src}) is {gs.const(t)}", f"type({src})", t, src=src)
    if t in RESUMED_ITERATORS:
        if t is _LIST_ITERATOR and len(r := value.__reduce__()) > 2:  # (FINDINGS_77 #6: the rest of the frame ran
            lst = wrap(tx, r[1][0], IterRestSource(source, 0))       # eagerly) read lazily as a tuple's; a write
            tx.output.side_effects.read_only[id(lst)] = "a list written while a loop resumed after a break reads it"
        return ResumedIteratorVariable(value, source)
    parts = value.__reduce__()[1]
    inner = parts[:1] if t is enumerate else parts
    iters = [resumed_iterator(tx, it, IterRestSource(source, k)) for k, it in enumerate(inner)]
    if any(i is None for i in iters):
        return None
    if t is zip:
        if len(value.__reduce__()) > 2:
            return None          # zip(..., strict=True)
        gs.add(f"len({src}.__reduce__()[1]) == {len(parts)}", f"len({src}.__reduce__()[1])", len(parts))
        return LazyIteratorVariable(tx, zip, iters)
    # the count is an int input: automatic dynamic makes it a SymInt once it changed, so
    # one compile serves every later position of the loop
    count = wrap(tx, parts[1], IterRestSource(source, 1))
    return LazyIteratorVariable(tx, enumerate, iters,
                                start=count.value if isinstance(count, ConstantVariable) else count)


def advanced(it, n: int):
    """``it`` after ``n`` calls of ``next`` (rebuilds an iterator at a graph break)."""
    for _ in range(n):
        next(it)
    return it


class GeneratorVariable(ListIteratorVariable):
    """A generator object made by calling a Python generator function in traced code.

    Lazy and incremental: the generator's body is inlined by a suspended ``InliningTranslator`` that runs to its next
    ``yield`` each time a value is needed (``next``, ``FOR_ITER``), so the body's effects happen where eager Python runs
    them (``@contextlib.contextmanager``: the code after ``yield`` runs at ``__exit__``). Uses that need all items
    (``list(g)``, ``sum(g)``, unpacking: the ``items`` property) run it to the end. A generator never started that
    *escapes* (returned, stored, live at a graph break) is rebuilt by calling the real generator function with the same
    arguments: the caller gets a real generator object. One that traced code started cannot be rebuilt (its position
    lives in a real frame): the frame is captured again with a graph break at the root frame's instruction that started
    it (``with cm():``'s ``BEFORE_WITH``, a ``next(g)``), which runs eagerly on a real generator."""

    site = None     # (root offset, user stack) where traced code started it (None: not started; lazy iterators)

    def __init__(self, tx, fn, args, kwargs, start):
        VariableTracker.__init__(self, None)
        self._tx, self.fn = tx, fn
        self.args, self.kwargs = list(args), dict(kwargs)
        self._start = start          # tx -> a suspended InliningTranslator over the body
        self._sub = None
        self._items = None           # values yielded so far (None: never started)
        self._done, self.index, self.kind = False, 0, "iterator"

    def _advance(self, tx) -> bool:
        """Run the body to its next yield; False when it returned."""
        if self._done:
            return False
        if self._sub is None:
            self._sub = self._start(tx)
            self._items, self.site = [], tx.root_site()
            tx.output.generators.append(self)
        self._sub.parent = tx
        if (got := self._sub.run_until_yield()) is None:
            self._done = True
            return False
        self._items.append(got[0])
        return True

    @property
    def items(self):
        while self._advance(self._tx):
            pass
        return self._items

    @items.setter
    def items(self, value):
        self._items = list(value)
        self._done = True

    def next(self, tx):
        if (self._items is None or self.index >= len(self._items)) and not self._advance(tx):
            return None
        v = self._items[self.index]
        self.index += 1
        return v

    def unpack(self, tx):
        while self._advance(tx):
            pass
        return super().unpack(tx)

    def python_type(self):
        return types.GeneratorType

    def children(self):
        return [self.fn] + self.args + list(self.kwargs.values()) if self._items is None else self._items[self.index:]

    def call_method(self, tx, name, args, kwargs):
        if name == "send" and len(args) == 1 and not kwargs and self._sub is not None and not self._done \
                and self.index == len(self._items):
            # the body waits at a ``yield`` whose value (None, pushed by YIELD_VALUE) becomes the sent one
            self._sub.stack[-1] = args[0]
            if (v := self.next(tx)) is None:
                raise Unsupported("generator.send reaching the end of the generator (StopIteration)")
            return v
        if name in ("throw", "close") and (self._sub is None or self._done or self.index == len(self._items)):
            return self._throw(tx, name, args)
        if name in ("send", "throw", "close", "gi_frame"):
            raise Unsupported(f"generator.{name}")
        return super().call_method(tx, name, args, kwargs)

    def _throw(self, tx, name, args):
        """``throw(exc)`` / ``close()``: ``exc`` (``GeneratorExit``) raised in the body at its ``yield``, as CPython
        does: its handlers and ``finally`` blocks run; the value it yields next is returned, its return raises
        StopIteration (``close``: returns None, also when GeneratorExit leaves it), another exception leaves the call."""
        from coil.capture.exceptions import ExceptionVariable, exception_tracker
        from coil.capture.opcodes import _exception_of
        given = args[1] if len(args) > 1 and args[1].python_type() is not type(None) else args[0] if args else None
        exc = ExceptionVariable(GeneratorExit, []) if name == "close" else _exception_of(tx, given)
        try:
            if self._sub is None or self._done or not self._sub.handle_exception(self._sub.current, exc):
                exc.raise_()
            self._sub.parent = tx
            got = self._sub.run_until_yield()
        except Unsupported as e:
            self._done = True
            if (out := exception_tracker(e.__cause__ if e.reason.endswith("escaping a generator") else e)) is None:
                raise
            if name == "close" and out.cls is GeneratorExit:
                return ConstantVariable(None)
            out.raise_()
        self._done = got is None
        if name == "close":
            if got is None:
                return ConstantVariable(None)
            raise Unsupported("generator ignored GeneratorExit (RuntimeError)")
        if got is None:
            ExceptionVariable(StopIteration, []).raise_()
        self._items.append(got[0])
        self.index += 1
        return got[0]

    def break_earlier(self):
        """The frame's capture again, with a break where traced code started this generator (live at a break)."""
        from coil.capture.output import BreakEarlier
        return BreakEarlier(*self.site, Unsupported("a generator started in traced code is live at a graph break or "
                                                    "escapes the frame", hint="it starts at a graph break"))

    def reconstruct(self, cg):
        if self._items is not None:
            raise self.break_earlier()
        args = "".join(cg.reconstruct(a) + ", " for a in self.args)
        kwargs = "".join(f"{k}={cg.reconstruct(v)}, " for k, v in self.kwargs.items())
        return cg.bind(self, f"{cg.reconstruct(self.fn)}({args}{kwargs})")     # one object for every use

    def __repr__(self):
        return f"GeneratorVariable({self.fn!r})"


class LazyIteratorVariable(GeneratorVariable):
    """``zip`` / ``enumerate`` / ``map`` / ``filter`` over iterators, advanced lazily as in CPython: each
    value is taken from the inner iterators (live over a list the loop appends to) and ``map``/``filter``'s
    function is called when the value is needed. Live at a graph break, it is rebuilt as the same builtin over
    the inner iterators' rebuilt forms (``enumerate`` with its count so far)."""

    def __init__(self, tx, builtin, iters, fn=None, start=0):
        VariableTracker.__init__(self, None)
        self._tx = tx
        self.builtin, self.iters, self.fn, self.start = builtin, list(iters), fn, start
        self._sub, self._items, self._done = None, [], False
        self.index, self.kind = 0, "iterator"
        self._taken = 0          # values taken from the inner iterators (enumerate's count)

    def _advance(self, tx) -> bool:
        while not self._done:
            vals = []
            for it in self.iters:
                if (v := it.next(tx)) is None:
                    self._done = True
                    return False
                vals.append(v)
            n, self._taken = self._taken, self._taken + 1
            if (b := self.builtin) is zip:
                out = TupleVariable(vals)
            elif b is enumerate:
                idx = ConstantVariable(self.start + n) if isinstance(self.start, int) else \
                    tx.binary_op(operator.add, self.start, ConstantVariable(n))
                out = TupleVariable([idx, vals[0]])
            elif b is map:
                out = tx.call(self.fn, vals, {})
            else:   # filter
                keep = vals[0] if isinstance(self.fn, ConstantVariable) and self.fn.value is None \
                    else tx.call(self.fn, vals, {})
                if not tx.truthy(keep):
                    continue
                out = vals[0]
            self._items.append(out)
            return True
        return False

    def python_type(self):
        return self.builtin

    def children(self):
        return self._items[self.index:] + self.iters + ([self.fn] if self.fn is not None else [])

    def reconstruct(self, cg):
        if self.index < len(self._items):
            raise Unsupported(f"a {self.builtin.__name__} iterator with values taken but not "
                              "used is live at a graph break")
        inner = [cg.reconstruct(it) for it in self.iters]
        b = cg.const_expr(self.builtin)
        if self.builtin is enumerate:
            start = f"{cg.reconstruct(self.start)} + {self._taken}" if not isinstance(self.start, int) \
                else self.start + self._taken
            return cg.bind(self, f"{b}({inner[0]}, {start})")
        head = [cg.reconstruct(self.fn)] if self.fn is not None else []
        return cg.bind(self, f"{b}({', '.join(head + inner)})")

    def __repr__(self):
        return f"LazyIteratorVariable({self.builtin.__name__})"
