"""Trackers for objects: nn.Modules, user-defined objects and classes, Python modules, objects created inside the frame,
and ``ModelOutput``-style dataclass dicts.

Attribute reads follow Python's lookup order statically (:func:`lookup_attr`): pending writes made earlier in the frame,
data descriptors (properties are inlined), the instance ``__dict__``, ``nn.Module``'s ``_parameters``/``_buffers``/
``_modules``, then class attributes (functions become bound methods) and finally a user ``__getattr__`` (inlined).
Values read from real objects are wrapped with a source so guards cover them; parameters and buffers become graph
inputs."""
from __future__ import annotations

import collections
import dataclasses
import dis
import enum
import functools
import inspect
import random
import types
import warnings
import weakref

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from coil.exc import Unsupported
from coil.capture.dynamic import RANDOM_DRAWS, random_draw
from coil.capture.source import AttrSource, ConstSource, ModuleDictSource
from coil.capture.variables.base import AttributeMissing, ConstantVariable, RealValueVariable, VariableTracker, wrap
from coil.capture.variables.containers import (BaseListVariable, DictVariable, ListIteratorVariable, ListVariable,
                                               TupleVariable)
from coil.capture.variables.functions import BoundMethodVariable, UserFunctionVariable, UserMethodVariable
from coil.capture.variables.symbolic import SymNodeVariable
from coil.capture.variables.tensor import TensorVariable, call_op


_SENTINEL = object()


def _static_lookup(cls: type, name: str):
    return next((klass.__dict__[name] for klass in cls.__mro__ if name in klass.__dict__), _SENTINEL)


def wrap_class_attr(tx, obj_vt: VariableTracker, cls: type, name: str, source=None):
    """A class attribute seen through an instance (methods get bound to ``obj_vt``)."""
    if (attr := _static_lookup(cls, name)) is _SENTINEL:
        raise AttributeMissing(name)
    if isinstance(attr, staticmethod):
        return wrap(tx, attr.__func__, source)
    if isinstance(attr, classmethod):
        guard_mro_lookup(tx, cls.__mro__, name)
        return UserMethodVariable(attr.__func__, UserDefinedClassVariable(cls))
    if isinstance(attr, (property, types.FunctionType)) and source is not None:
        gs = tx.output.guards   # a method or property replaced on the class (type(obj) is guarded)
        gs.add(f"getattr({gs.const(cls)}, {name!r}, None) is {gs.const(attr)}" if not
               name.isidentifier() else f"{gs.const(cls)}.{name} is {gs.const(attr)}")
    if isinstance(attr, property):
        if attr.fget is None:
            raise AttributeMissing(name)
        return tx.call(UserFunctionVariable(attr.fget), [obj_vt], {})
    if isinstance(attr, types.FunctionType):
        return UserMethodVariable(attr, obj_vt, source)
    if isinstance(attr, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)):
        return BoundMethodVariable(obj_vt, name)
    if hasattr(type(attr), "__get__") and not isinstance(attr, (type,)):
        if obj_vt.source is None or getattr(obj_vt, "value", None) is None:
            get = getattr(type(attr), "__get__")
            if isinstance(get, types.FunctionType):   # a Python descriptor (torch.distributions' lazy_property)
                owner = UserDefinedClassVariable(cls)
                return tx.call(UserFunctionVariable(get), [wrap(tx, attr, None), obj_vt, owner], {})
            raise Unsupported(f"descriptor {type(attr).__name__} {name!r} on a new object")
        return wrap(tx, getattr(obj_vt.value, name), source)
    return wrap(tx, attr, source)


class ObjectVariableBase(RealValueVariable):
    """A tracker for a real (pre-existing) Python object ``value``."""

    def attr_source(self, name):
        return AttrSource(self.source, name) if self.source is not None else None

    def var_getattr(self, tx, name):
        return lookup_attr(tx, self, name)

    def truthy(self, tx):
        return object_truthy(tx, self, type(self.value))

    def __repr__(self):
        return f"{type(self).__name__}({type(self.value).__name__}, {self.source})"


def lookup_attr(tx, vt: ObjectVariableBase, name: str, generic: bool = False):
    """Python attribute lookup on a real object, symbolically (see module docstring);
    ``generic``: ``object.__getattribute__(obj, name)``, past a custom ``__getattribute__``."""
    obj = vt.value
    if (pending := tx.output.side_effects.pending_attr(obj, name)) is not None:
        return pending
    if name == "__class__":
        from coil.capture.variables.builtins import type_of
        return type_of(tx, vt)
    if name == "__dict__":
        d = getattr(obj, "__dict__", None)
        if not ((generic or isinstance(obj, torch.nn.Module)) and type(d) is dict and vt.source is not None) or any(
                k[0] == id(obj) for k in tx.output.side_effects.attrs):
            raise Unsupported("reading __dict__ of an object")
        # read-only use (``d.get(k)``, ``k in d``: guarded lookups, _dict_lookup)
        return UserDefinedObjectVariable(d, AttrSource(vt.source, "__dict__"))
    cls = type(obj)
    getattribute = cls.__getattribute__
    if not generic and getattribute is not object.__getattribute__ and \
            getattribute is not torch.nn.Module.__getattribute__:
        # custom __getattribute__ (e.g. transformers configs): read it for real
        try:
            value = getattr(obj, name)
        except AttributeError:
            raise AttributeMissing(name)
        if isinstance(value, types.MethodType) and value.__self__ is obj:
            return UserMethodVariable(value.__func__, vt)
        return wrap(tx, value, vt.attr_source(name))
    cls_attr = _static_lookup(cls, name)
    is_data_descr = cls_attr is not _SENTINEL and (isinstance(cls_attr, property) or hasattr(type(cls_attr), "__set__"))
    if is_data_descr and not isinstance(cls_attr, property):
        try:
            return wrap(tx, getattr(obj, name), vt.attr_source(name))
        except AttributeError:
            raise AttributeMissing(name)
    if not is_data_descr:
        if (d := getattr(obj, "__dict__", None)) is not None and name in d:
            src = vt.attr_source(name)
            if src is not None and type(d) is dict and _static_lookup(cls, "__getattr__") is not _SENTINEL:
                # guards and entries read it as ``obj.__dict__[name]``: CPython does not
                # specialize attribute loads on a class with __getattr__ (nn.Module), a
                # dict lookup costs half; a value no longer in __dict__ is a guard miss
                src = ModuleDictSource(vt.source, "__dict__", name)
            return wrap(tx, d[name], src)
        if isinstance(obj, torch.nn.Module):
            for dname in ("_parameters", "_buffers", "_modules"):
                if (sub := obj.__dict__.get(dname)) is None:
                    continue
                hit = tx.output.wrapped.get(id(sub))   # a tracked dict sees this frame's writes (register_buffer)
                if hit is not None and isinstance(hit[1], DictVariable):
                    if name in hit[1].items:
                        return hit[1].items[name]
                elif name in sub:
                    src = ModuleDictSource(vt.source, dname, name) if vt.source is not None else None
                    return wrap(tx, sub[name], src)
        if d is not None and vt.source is not None and isinstance(cls_attr, types.FunctionType):
            e = vt.source.expr()    # a function set on the instance later shadows the method
            tx.output.guards.add(f"{name!r} not in {e}.__dict__", f"{name!r} in {e}.__dict__", False, src=e)
    if cls_attr is not _SENTINEL:
        return wrap_class_attr(tx, vt, cls, name, vt.attr_source(name))
    getattr_fn = _static_lookup(cls, "__getattr__")
    if isinstance(getattr_fn, types.FunctionType) and getattr_fn is not torch.nn.Module.__getattr__:
        return tx.call(UserFunctionVariable(getattr_fn), [vt, ConstantVariable(name)], {})
    raise AttributeMissing(name)


def static_value(vt, what: str):
    """The Python value of a constant, a class, one of typing's special forms (immutable and hashable, like
    ``typing.List``) or a tuple of those; raises :class:`Unsupported` (``what``) for anything else."""
    if type(vt) in (TupleVariable, ListVariable):   # (typing.Callable[[int], str])
        return (tuple if type(vt) is TupleVariable else list)(static_value(i, what) for i in vt.items)
    v = getattr(vt, "value", getattr(vt, "fn", None))
    if isinstance(vt, ConstantVariable) or isinstance(v, type) or type(v).__module__ == "typing":
        return v
    if vt.is_python_constant():
        return vt.as_python_constant()
    raise Unsupported(what)


def _call_lru_cached(tx, vt, args, kwargs):
    """A ``functools.lru_cache`` function called with constant arguments (transformers'
    ``is_torch_distributed_available()``): called for real at trace time, as eager calls it, and guarded by calling it
    again, a cache hit, which must give the same object. Its body runs where eager's first call runs it, never once per
    compiled call. Classes count as constants, and tuples of them (``typing.List[torch.Tensor]`` is such a call).
    Other arguments, or a result holding a tensor, stay a graph break."""
    what = f"call to an lru_cache function {vt.value!r} with non-constant arguments"
    if vt.source is None:
        raise Unsupported(what)
    cargs, ckw = [static_value(a, what) for a in args], {k: static_value(v, what) for k, v in kwargs.items()}
    try:
        result = vt.value(*cargs, **ckw)
    except Exception as e:  # noqa: BLE001 - raised again by eager at the break
        raise Unsupported(f"lru_cache function {vt.value!r} raised {type(e).__name__}") from e
    if _holds_tensor(result) or isinstance(result, (list, dict, set)):
        raise Unsupported(f"lru_cache function {vt.value!r} returned a tensor or a mutable container")
    gs, src = tx.output.guards, vt.source.expr()
    call = f"{src}({''.join(gs.const(a) + ', ' for a in cargs)}" + \
        "".join(f"{k}={gs.const(v)}, " for k, v in ckw.items()) + ")"
    gs.add(f"{call} is {gs.const(result)}", call, result, src=src)
    return wrap(tx, result, None)


_MISSING = object()
_DICT_READS = ("get", "__getitem__", "__contains__")


def _dict_lookup(tx, vt, name, args, kwargs, base=False):
    """``d.get(k)`` / ``d[k]`` / ``k in d`` on a pre-existing dict whose keys are not all literals (huggingface_hub's
    validator table keyed by types): looked up in the real dict, guarded on what the lookup found (the same object, or
    still missing). None when it does not apply (new dicts, unhashable or traced keys, tensor results). ``base``:
    ``dict``'s own method on a subclass that overrides it (``super().__getitem__(k)`` inside the override: transformers'
    ``ACT2FN``)."""
    d = vt.value
    if vt.source is None or kwargs or not args or (not base and (
            type(d).__getitem__ is not dict.__getitem__ or (name == "get" and type(d).get is not dict.get))):
        return None
    kv = args[0]
    key = kv.value if isinstance(kv, (ConstantVariable, ObjectVariableBase)) else _MISSING
    if key is _MISSING or isinstance(key, torch.Tensor):
        return None
    try:
        found = d.get(key, _MISSING)
    except TypeError:           # unhashable key: eager raises
        return None
    if isinstance(found, torch.Tensor):
        return None
    gs, src = tx.output.guards, vt.source.expr()
    get = f"___builtins.dict.get({src}, " if base else f"{src}.get("
    found_expr = f"{get}{gs.const(key)}, {gs.const(_MISSING)})"
    gs.add(f"{found_expr} is {gs.const(found)}", f"{get}{gs.const(key)})", found, src=src)
    if name == "__contains__":
        return ConstantVariable(found is not _MISSING)
    if found is _MISSING:   # d[k]: KeyError, a graph break where eager raises
        return (args[1] if len(args) > 1 else ConstantVariable(None)) if name == "get" else None
    return wrap(tx, found, ConstSource(found_expr))    # (a source: writes into it are replayed)


def object_truthy(tx, vt: VariableTracker, cls: type) -> bool:
    """``bool(obj)`` for an object of class ``cls`` tracked by ``vt``, by Python's rule:
    ``__bool__``, else ``__len__``, else True. A dunder written in Python is traced (an
    empty ``nn.Sequential`` is falsy); one written in C is Unsupported."""
    for dunder in ("__bool__", "__len__"):
        if (fn := _static_lookup(cls, dunder)) is _SENTINEL:
            continue
        if isinstance(fn, types.FunctionType):
            return tx.call(UserMethodVariable(fn, vt), [], {}).truthy(tx)
        raise Unsupported(f"bool() of a {cls.__name__} object ({dunder} is not Python code)")
    return True


class UserDefinedObjectVariable(ObjectVariableBase):
    """An instance of a user class that existed before the frame ran."""

    def call_function(self, tx, args, kwargs):
        if isinstance(getattr(self.value, "__func__", self.value), functools._lru_cache_wrapper):
            return _call_lru_cached(tx, self, args, kwargs)     # (a bound method of one too: its object is the key)
        if type(self.value) is weakref.ref and self.source is not None and not args and not kwargs:
            from coil.capture.source import CallSource   # the referent, guarded as any input (lr_scheduler's opt_ref)
            return tx.wrap(self.value(), CallSource(self.source))
        if isinstance(original := inspect.getattr_static(self.value, "_torchdynamo_inline", None), types.FunctionType):
            # ``torch.jit.script`` / ``torch.jit.trace`` of a function keep the Python function here: traced like any
            # call (DeBERTa-v2's scripted helpers were a graph break per attention layer), also where a profiler
            # patched ScriptFunction.__call__ with a Python function (torch.testing._internal does)
            src = AttrSource(self.source, "_torchdynamo_inline") if self.source is not None else None
            return tx.call(UserFunctionVariable(original, src), args, kwargs)
        if isinstance(call := _static_lookup(type(self.value), "__call__"), types.FunctionType):
            return tx.call(UserMethodVariable(call, self), args, kwargs)
        raise Unsupported(f"call to a {type(self.value).__name__} object")

    def var_getattr(self, tx, name):
        if isinstance(self.value, dict) and name in _DICT_READS and self.source is not None \
                and getattr(type(self.value), name) is getattr(dict, name) or self._draws(name):
            return BoundMethodVariable(self, name)      # call_method: _dict_lookup, random_draw
        return super().var_getattr(tx, name)

    def _draws(self, name) -> bool:
        return type(self.value) is random.Random and name in RANDOM_DRAWS and self.source is not None

    def call_method(self, tx, name, args, kwargs):
        if self._draws(name):
            return random_draw(tx, f"{self.source.expr()}.{name}", self.value, name, args, kwargs)
        if isinstance(self.value, dict) and name in _DICT_READS:
            if (found := _dict_lookup(tx, self, name, args, kwargs)) is not None:
                return found
        method = self.var_getattr(tx, name)
        if isinstance(method, BoundMethodVariable) and method.obj is self and method.name == name:
            # a C method of the object (e.g. random.Random().random): not traceable, and
            # asking this tracker again would recurse
            raise Unsupported(f"call to C method {type(self.value).__name__}.{name}", hint="it runs outside the graph")
        return tx.call(method, args, kwargs)

    def unpack(self, tx):
        if isinstance(it := _static_lookup(type(self.value), "__iter__"), types.FunctionType):
            return tx.unpack(tx.call(UserMethodVariable(it, self), [], {}))
        raise Unsupported(f"iteration over a {type(self.value).__name__} object")


class NNModuleVariable(ObjectVariableBase):
    """An ``nn.Module``. Calls run hooks and inline ``forward``; parameters and buffers read through it become
    graph inputs with sources like ``self._modules['fc']._parameters['weight']``."""

    _SPECIAL = ("parameters", "buffers", "children", "modules", "named_parameters",
                "named_buffers", "named_children", "named_modules")

    def call_function(self, tx, args, kwargs):
        return tx.call_module(self, list(args), dict(kwargs))

    def var_getattr(self, tx, name):
        if name in self._SPECIAL and _static_lookup(type(self.value), name) is getattr(torch.nn.Module, name):
            return BoundMethodVariable(self, name)
        return lookup_attr(tx, self, name)

    def has_len(self):
        return isinstance(self.value, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict,
                                       torch.nn.ParameterList, torch.nn.ParameterDict))

    def _sub(self, tx, key):
        m = self.value
        d = m._parameters if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict)) else m._modules
        dname = "_parameters" if d is m._parameters else "_modules"
        return wrap(tx, d[key], ModuleDictSource(self.source, dname, key) if self.source is not None else None)

    def _keys(self, tx):
        """The container's keys, guarded (an appended or deleted entry recompiles)."""
        m = self.value
        dname = "_parameters" if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict)) else "_modules"
        return _guard_keys(tx, self.source, m, dname)

    def unpack(self, tx):
        if isinstance(m := self.value, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return [ConstantVariable(k) for k in self._keys(tx)]
        if self.has_len():
            return [self._sub(tx, k) for k in self._keys(tx)]
        if isinstance(it := _static_lookup(type(m), "__iter__"), types.FunctionType):
            return tx.unpack(tx.call(UserMethodVariable(it, self), [], {}))
        raise Unsupported(f"iteration over {type(m).__name__}")

    def _named(self, tx, kind, recurse=True):
        m = self.value
        dname = {"named_parameters": "_parameters", "named_buffers": "_buffers"}.get(kind, "_modules")

        def source(qual, leaf_dict):
            if (src := self.source) is not None and qual:
                *mods, leaf = qual.split(".")
                for part in mods:
                    src = ModuleDictSource(src, "_modules", part)
                src = ModuleDictSource(src, leaf_dict, leaf)
            return src
        # what the walk reads is guarded: the keys of every dict it visits
        deep = kind == "named_modules" or (recurse and kind != "named_children")
        for qual, sub in (m.named_modules() if deep else [("", m)]):
            for d in {"_modules", dname} if deep else (dname,):
                _guard_keys(tx, source(qual, "_modules"), sub, d)
        pairs = list(getattr(m, kind)(recurse=recurse) if dname != "_modules" else getattr(m, kind)())
        return [(qual, wrap(tx, value, source(qual, dname))) for qual, value in pairs]

    def call_method(self, tx, name, args, kwargs):
        m = self.value
        if name in ("__len__",) and self.has_len():
            return ConstantVariable(len(self._keys(tx)))
        if name == "__getitem__" and self.has_len():
            key = args[0].as_python_constant()
            if isinstance(m, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
                return self._sub(tx, key)
            keys = self._keys(tx)
            if isinstance(key, slice):
                for k in keys[key]:     # the new container's entries keep their sources (wrap
                    self._sub(tx, k)    # finds them by identity): read per call, not constants
                return wrap(tx, m[key], None)
            return self._sub(tx, keys[key])
        if name == "__contains__" and isinstance(m, torch.nn.ModuleDict):
            return ConstantVariable(args[0].as_python_constant() in self._keys(tx))
        if name == "__iter__" and self.has_len():
            return ListIteratorVariable(self.unpack(tx))
        if isinstance(m, (torch.nn.ModuleDict, torch.nn.ParameterDict)) and name in ("keys", "values", "items"):
            keys = self._keys(tx)
            if name == "keys":
                return ListIteratorVariable([ConstantVariable(k) for k in keys], kind="keys")
            if name == "values":
                return ListIteratorVariable([self._sub(tx, k) for k in keys], kind="values")
            return ListIteratorVariable([TupleVariable([ConstantVariable(k), self._sub(tx, k)])
                                         for k in keys], kind="items")
        if name in ("parameters", "buffers", "children", "modules"):
            rec = kwargs.get("recurse", ConstantVariable(True)).as_python_constant()
            return ListIteratorVariable([v for _, v in self._named(tx, "named_" + name, recurse=rec)])
        if name in ("named_parameters", "named_buffers", "named_children", "named_modules"):
            return ListIteratorVariable([TupleVariable([ConstantVariable(q), v]) for q, v in self._named(tx, name)])
        if name == "forward" and type(m).forward is torch.nn.Module.forward:
            raise Unsupported("module has no forward")
        return tx.call(self.var_getattr(tx, name), args, kwargs)


def _guard_keys(tx, src, m: torch.nn.Module, dname: str) -> list:
    """``list(m.<dname>)`` (``_modules``/``_parameters``/``_buffers``), guarded where ``m`` has a source."""
    keys = list(getattr(m, dname))
    if src is not None:
        e = f"{src.expr()}.{dname}"
        tx.output.guards.add(f"list({e}) == {keys!r}", f"list({e})", keys, src=src.expr())
    return keys


def guard_mro_lookup(tx, mro, name: str) -> None:
    """Guard that looking ``name`` up along ``mro`` (classes) still finds what it finds now."""
    gs = tx.output.guards
    for klass in mro:
        gs.add(f"{gs.const(klass)}.__dict__.get({name!r}) is {gs.const(klass.__dict__.get(name))}")
        if name in klass.__dict__:
            return


def _holds_tensor(value) -> bool:
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple, set, frozenset)) \
        else ()
    return isinstance(value, torch.Tensor) or any(map(_holds_tensor, items))


class InFrameModuleVariable(NNModuleVariable):
    """A parameter-free ``torch.nn`` module built inside the frame from constant arguments
    (``nn.CrossEntropyLoss(ignore_index=-100)(logits, y)``, ``nn.ReLU()(x)``).

    The instance is built for real at trace time and used like a sourceless submodule: its forward is inlined and its
    attributes are constants. Nothing is guarded on it: the compiled code never sees it, and a rebuild (at a graph
    break, or when it escapes the frame) constructs a fresh one from the same arguments, as each eager call does.
    torch.nn's own constructors have no side effects. A user subclass's own ``__init__``s (transformers'
    ``GELUActivation``, built by ``ACT2FN["gelu"]`` in DeBERTa's pooler) may call nothing but ``super().__init__`` and
    write nothing but attributes (:func:`_calls_only_super_init`), and are first traced on a :class:`ModuleInitProbe`,
    torch.nn's part skipped: if that adds no graph op and no mutation outside the new object, running them for real is
    pure too. One that gets parameters or buffers, or a tensor argument, is a graph break."""

    def __init__(self, value, args: tuple, kwargs: dict):
        super().__init__(value, None)
        self.args, self.kwargs = args, kwargs

    @classmethod
    def create(cls, tx, mod_cls: type, args: list, kwargs: dict) -> "InFrameModuleVariable":
        from coil.capture.translator import const_value
        what = f"creating a {mod_cls.__name__} module inside the frame"
        own = [k for k in mod_cls.__mro__ if k is not object and not _torch_nn(k) and
               ("__init__" in k.__dict__ or "__new__" in k.__dict__)]
        if any("__new__" in k.__dict__ or not isinstance(k.__dict__["__init__"], types.FunctionType) for k in own):
            raise Unsupported(what + " (a custom __new__ or C __init__)", hint="create the module in __init__")
        if not all(_calls_only_super_init(k.__dict__["__init__"]) for k in own):
            raise Unsupported(what + " (its __init__ calls more than super().__init__ or writes more than "
                              "attributes)", hint="create the module in __init__")
        try:
            c = tuple(const_value(a) for a in args)
            kw = {k: const_value(v) for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported(what + " (a tensor or other non-constant argument)",
                              hint="create the module in __init__") from None
        if _holds_tensor(c) or _holds_tensor(kw):
            raise Unsupported(what + " (a tensor argument)", hint="create the module in "
                              "__init__, or call the torch.nn.functional form")
        if own:   # before anything runs for real
            out = tx.output
            before = (len(out.graph.nodes), out.side_effects.count)
            tx.call(UserMethodVariable(own[0].__dict__["__init__"], ModuleInitProbe(mod_cls)), args, kwargs)
            if (len(out.graph.nodes), out.side_effects.count) != before:
                raise Unsupported(what + " (its __init__ runs tensor ops or mutates state outside it)",
                                  hint="create the module in __init__")
        try:
            # first on the meta device: a module with parameters costs no memory and
            # draws nothing from the RNG before it is refused
            with torch.random.fork_rng(devices=[]), torch.device("meta"), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the real build below warns once
                probe = mod_cls(*c, **kw)
            stateful = _has_state(probe)
            m = None if stateful else mod_cls(*c, **kw)
        except Exception as e:  # the eager call raises it again, outside the graph
            raise Unsupported(what + f" (its constructor raised {type(e).__name__})") from None
        if stateful or _has_state(m):
            raise Unsupported(what + " (it has parameters or buffers)", hint="create the module in __init__")
        return cls(m, c, kw)

    def reconstruct(self, cg):
        args = ", ".join([cg.const_expr(a) for a in self.args] +
                         [f"{k}={cg.const_expr(v)}" for k, v in self.kwargs.items()])
        return cg.bind(self, f"{cg.const_expr(type(self.value))}({args})")


def _calls_only_super_init(init) -> bool:
    """``init``'s bytecode calls nothing but ``super().__init__(...)`` and stores nothing but attributes and locals
    (no ``+=`` on an object): effects the trace cannot see (a mutable default argument appended to, a cached
    function's side effect) need a call or an in-place operator."""
    ins = list(dis.get_instructions(init))
    calls = sum(i.opname.startswith("CALL") for i in ins)
    writes = any(i.opname.startswith(("STORE_SUBSCR", "STORE_GLOBAL", "STORE_DEREF", "DELETE", "IMPORT", "YIELD"))
                 or i.opname == "BINARY_OP" and "=" in i.argrepr or i.opname.startswith("INPLACE") for i in ins)
    supers = sum(i.argval == "super" for i in ins if i.opname.startswith("LOAD_GLOBAL"))
    return not writes and (calls == 0 or calls <= 2 and supers == 1)   # (3.12: one CALL after LOAD_SUPER_ATTR)


def _torch_nn(k: type) -> bool:
    return k is torch.nn.Module or (k.__module__ or "").startswith("torch.nn.modules.")


def _has_state(m: torch.nn.Module) -> bool:
    return any(True for _ in m.parameters()) or any(True for _ in m.buffers())


class AutogradFunctionApplyVariable(VariableTracker):
    """``MyFn.apply`` of a custom ``torch.autograd.Function``: the call is one graph node whose target is
    ``MyFn.apply``. AOT's joint trace runs it under ``make_fx``, so the user's ``forward`` becomes the forward
    graph's ops and the user's ``backward`` (run by ``autograd.grad`` in the joint trace) the backward
    graph's: gradients are the user's, never autograd's derivative of ``forward``. A Python side effect in them
    (eager runs it on every call), code capture cannot trace (:func:`probe_autograd`), or an argument that is not a
    tensor or a constant makes the call a graph break. They are guarded by identity, the globals they read too."""

    def __init__(self, cls_vt):
        super().__init__(None)
        self.cls_vt = cls_vt

    def python_type(self):
        return types.MethodType

    def reconstruct(self, cg):
        return f"{cg.reconstruct(self.cls_vt)}.apply"      # called from the entry at a break

    def call_function(self, tx, args, kwargs):
        cls = self.cls_vt.value
        name = cls.__name__
        if not torch.is_grad_enabled():
            return self._forward_only(tx, cls, args, kwargs)
        leaves: list = []
        try:    # a dict / list / tuple of constants (YOSO's lsh_config) is rebuilt by the node's target, its leaves
            structs = [a if isinstance(a, TensorVariable) else _flatten(a, leaves) for a in args]   # node arguments
        except Unsupported:     # (FX would hand the function immutable copies: ``type(cfg) is dict`` false)
            raise Unsupported(f"{name}.apply with arguments other than tensors and constants") from None
        if kwargs:
            raise Unsupported(f"{name}.apply with keyword arguments")
        gs, src = tx.output.guards, self.cls_vt.source.expr()
        for meth in ("forward", "backward", "setup_context"):
            fn = getattr(cls, meth, None)
            gs.add(f"{src}.{meth} is {gs.const(fn)}", f"{src}.{meth}", fn, src=src)
        base = _static_lookup(torch.autograd.Function, "setup_context")
        setup = cls.setup_context if _static_lookup(cls, "setup_context") is not base else None

        def forward(ctx):
            return tx.call(UserFunctionVariable(inspect.unwrap(cls.forward)), ([] if setup else [ctx]) + list(args), {})
        ctx = probe_autograd(tx, f"{name}.apply", list(args), forward, setup, cls.backward)
        kept = _mutable_containers(ctx.attrs.values())
        for v in (v for k, v in _mutable_containers(args).items() if k in kept):   # (the node rebuilds it)
            what = f"{name}.apply keeps a {v.python_type().__name__} argument on ctx, which backward reads then"
            if v.source is not None:
                raise Unsupported(f"{what} (the caller can change it)", hint="keep its values on ctx: ctx.k = cfg['k']")
            exc = Unsupported(f"{what} (changed or kept after the call)")
            exc.root_offset, exc.user_stack = tx.root_site()
            tx.output.side_effects.held[id(v)] = exc    # a later change or rebuild breaks at this call
        if not leaves:
            return call_op(tx, "call_function", _apply_target(cls), list(args), {})
        tensors = [a for a in structs if isinstance(a, TensorVariable)]
        structs = [_Leaf(len(leaves) + tensors.index(a)) if isinstance(a, TensorVariable) else a for a in structs]
        return call_op(tx, "call_function", _apply_target(cls, structs), leaves + tensors, {})

    def _forward_only(self, tx, cls, args, kwargs):
        """``apply`` with grad mode off (inference under ``no_grad``): no gradient can flow, so eager's ``apply``
        only runs ``forward`` (and ``setup_context``) on a fresh ctx: inlined here as a call, any argument goes (a
        module, a list it appends to). An input returned as is comes back as eager's: a view of it, or a detached
        alias where it requires grad (``_wrap_outputs``), itself where it is a ``mark_dirty`` one that does not."""
        gs, src = tx.output.guards, self.cls_vt.source.expr()
        for meth in ("forward", "setup_context"):
            fn = getattr(cls, meth, None)
            gs.add(f"{src}.{meth} is {gs.const(fn)}", f"{src}.{meth}", fn, src=src)
        ctx = FunctionCtxProbe(object)
        ctx.attrs["needs_input_grad"] = ConstantVariable((False,) * len(args))
        custom_setup = _static_lookup(cls, "setup_context") is not _static_lookup(torch.autograd.Function,
                                                                                  "setup_context")
        res = tx.call(UserFunctionVariable(inspect.unwrap(cls.forward)), ([] if custom_setup else [ctx]) + list(args),
                      kwargs)
        if custom_setup:
            tx.call(UserFunctionVariable(inspect.unwrap(cls.setup_context)), [ctx, TupleVariable(list(args)), res], {})
        ins = [a for a in args if isinstance(a, TensorVariable)]

        def fresh(o):
            dirty = ctx.attrs.get("_coil_dirty", TupleVariable([])).items
            if not any(o is a for a in ins) or not o.fake.requires_grad and any(o is a for a in dirty):
                return o
            return call_op(tx, "call_method", *(("detach", [o]) if o.fake.requires_grad else ("view_as", [o, o])), {})
        if isinstance(res, TupleVariable) and type(res) is TupleVariable:
            return TupleVariable([fresh(o) for o in res.items])
        return fresh(res)


def _mutable_containers(vts, found=None) -> dict:
    """id -> tracker of each dict or list in or under ``vts`` (through dicts, lists and tuples)."""
    found = {} if found is None else found
    for v in vts:
        if isinstance(v, (DictVariable, BaseListVariable)) and id(v) not in found:
            if v.mutable:
                found[id(v)] = v
            _mutable_containers(v.children(), found)
    return found


class _Leaf(int):
    """The position of a constant, symbolic scalar or tensor among an ``apply`` node's arguments."""


def _flatten(v, leaves: list):
    """``v``'s Python structure (plain dicts, lists, tuples), each constant or symbolic scalar in it replaced by a
    :class:`_Leaf`, appended to ``leaves``; Unsupported for anything else."""
    if type(v) is DictVariable and v.user_cls is dict:
        return {k: _flatten(x, leaves) for k, x in v.items.items()}
    if type(v) in (ListVariable, TupleVariable):
        return (list if type(v) is ListVariable else tuple)(_flatten(x, leaves) for x in v.items)
    if not isinstance(v, (ConstantVariable, SymNodeVariable)):
        raise Unsupported(f"{v} in an apply argument")
    leaves.append(v)
    return _Leaf(len(leaves) - 1)


def _unflatten(s, args):
    if type(s) is _Leaf:
        return args[s]
    if type(s) is dict:
        return {k: _unflatten(x, args) for k, x in s.items()}
    return type(s)(_unflatten(x, args) for x in s) if type(s) in (list, tuple) else s


_APPLY_TARGETS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _apply_target(cls, structs=None):
    """The graph target for ``cls.apply``: a plain function named after the class (a
    bound ``apply`` would print as an import from ``torch.autograd.function``); with
    ``structs`` (:func:`_flatten`), it rebuilds the arguments from the node's."""
    if (fn := _APPLY_TARGETS.get(cls)) is None or structs:
        ref = weakref.ref(cls)

        def apply(*args):
            c = ref()
            c = _marked_backward(c) if get_proxy_mode() is not None else c     # (AOT's joint trace)
            return c.apply(*(_unflatten(s, args) for s in structs) if structs else args)
        apply.__name__ = apply.__qualname__ = f"{cls.__name__}_apply"
        apply.__module__ = "coil.capture.autograd_function"
        fn = apply if structs else _APPLY_TARGETS.setdefault(cls, apply)
    return fn


def _marked_backward(cls):
    """``cls`` whose backward, when autograd materializes its gradients, passes them through
    :func:`coil.aot.partition.grad_in` first: the joint graph then shows where an undefined gradient becomes zeros
    in eager. ``cls`` itself where it defines ``vjp`` (a subclass may not define both). Made per trace, not cached:
    a cache keyed by ``cls`` holding its subclass would keep ``cls`` alive."""
    if _static_lookup(cls, "vjp") is not _static_lookup(torch.autograd.Function, "vjp"):
        return cls
    from coil.aot.partition import grad_in

    def backward(ctx, *grads):
        if getattr(ctx, "materialize_grads", True):
            grads = [grad_in(g, id(ctx)) if isinstance(g, torch.Tensor) else g for g in grads]
        return cls.backward(ctx, *grads)
    return type(cls)(cls.__name__, (cls,), {"backward": staticmethod(backward), "__module__": cls.__module__})


class UserDefinedClassVariable(ObjectVariableBase):
    """A class object (user classes, torch classes, builtin types not handled as
    builtins). Calling it builds the instance symbolically where possible."""

    def as_python_constant(self):
        return self.value

    def var_getattr(self, tx, name):
        cls = self.value
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(cls, name))
        if (attr := _static_lookup(cls, name)) is _SENTINEL:
            if name == "__mro__":
                return TupleVariable([wrap(tx, c, None) for c in cls.__mro__])
            meta = _static_lookup(type(cls), name)   # a metaclass property (torch.distributed's GroupMember.WORLD)
            if isinstance(meta, property) and meta.fget is not None:
                guard_mro_lookup(tx, type(cls).__mro__, name)
                return tx.call(UserFunctionVariable(meta.fget), [self], {})
            raise AttributeMissing(name)
        if isinstance(attr, (staticmethod, classmethod, types.FunctionType)):
            guard_mro_lookup(tx, cls.__mro__, name)     # C.f replaced later recompiles
        if isinstance(attr, staticmethod):
            return wrap(tx, attr.__func__, None)
        if isinstance(attr, classmethod):
            if name == "apply" and isinstance(cls, type) and \
                    issubclass(cls, torch.autograd.Function) and self.source is not None:
                return AutogradFunctionApplyVariable(self)
            return UserMethodVariable(attr.__func__, self)
        if isinstance(attr, types.FunctionType):
            return UserFunctionVariable(attr)
        return wrap(tx, getattr(cls, name), self.attr_source(name))

    def call_function(self, tx, args, kwargs):
        return tx.construct_object(self, list(args), dict(kwargs))

    def unpack(self, tx):
        if isinstance(self.value, enum.EnumMeta):
            return [ConstantVariable(m) for m in self.value]
        raise Unsupported(f"iteration over class {self.value.__name__}")

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__" and isinstance(self.value, enum.EnumMeta):
            return ConstantVariable(len(self.value))
        if name == "__contains__" and isinstance(self.value, enum.EnumMeta):
            return ConstantVariable(args[0].as_python_constant() in self.value)
        return tx.call(self.var_getattr(tx, name), args, kwargs)


class PythonModuleVariable(ObjectVariableBase):
    """A Python module (``torch``, ``math``, ``torch.nn.functional``, user modules)."""

    TRUSTED = ("torch", "math", "operator", "functools", "itertools", "collections", "typing", "dataclasses",
               "builtins", "enum", "inspect", "warnings", "numbers", "abc", "transformers", "numpy")

    def var_getattr(self, tx, name):
        try:
            value = getattr(self.value, name)
        except AttributeError:
            raise AttributeMissing(name)
        root, src = self.value.__name__.split(".")[0], self.attr_source(name)
        if isinstance(prop := type(self.value).__dict__.get(name), torch.backends.ContextProp) and \
                getattr(prop.getter, "__self__", None) is torch._C:     # torch.backends.cudnn.enabled: torch._C's
            return tx.output.torch_switch(prop.getter, prop.setter, (), False)
        # torch's switches (torch.backends.cudnn.enabled, ...matmul.allow_tf32) change at
        # run time: a branch on one is guarded like any user global
        switch = self.value.__name__.startswith("torch.backends") and isinstance(value, (bool, int, float, str))
        if root in self.TRUSTED and not switch:
            if self.source is not None and vars(self.value).get(name, _SENTINEL) is value:
                # `torch.nn.functional.relu = f` after compiling recompiles: one identity check
                # through the module's __dict__ (skipped by tag while it is unchanged)
                tx.output.guards.add(f"{self.source.expr()}.__dict__[{name!r}] is {tx.output.guards.const(value)}")
            return wrap(tx, value, src, guard=False)
        return wrap(tx, value, src)

    def call_method(self, tx, name, args, kwargs):
        return tx.call(self.var_getattr(tx, name), args, kwargs)


class NewObjectVariable(VariableTracker):
    """An instance of a plain user class created inside the frame. Its attributes are trackers; if it escapes,
    the entry rebuilds it with ``cls.__new__`` and the attribute values."""

    mutable = True

    def __init__(self, cls: type):
        super().__init__(None)
        self.cls = cls
        self.attrs: dict[str, VariableTracker] = {}
        self.value = None

    def python_type(self):
        return self.cls

    def children(self):
        return list(self.attrs.values())

    def is_python_constant(self):
        return False   # never one (and its attributes may point back to it: no walk)

    def var_getattr(self, tx, name, generic=False):
        if not generic and isinstance(ga := _static_lookup(self.cls, "__getattribute__"), types.FunctionType):
            return tx.call(UserMethodVariable(ga, self), [ConstantVariable(name)], {})   # (transformers' configs)
        attr = _static_lookup(self.cls, name)
        if isinstance(attr, types.MemberDescriptorType):    # a ``__slots__`` entry: stored like an attribute
            if name not in self.attrs:
                raise AttributeMissing(name)
            return self.attrs[name]
        if name in self.attrs:
            if not (isinstance(attr, property) or hasattr(type(attr), "__set__")) or attr is _SENTINEL:
                return self.attrs[name]
        if name == "__class__":
            return UserDefinedClassVariable(self.cls)
        if name == "__dict__":
            d = DictVariable({})
            d.items = self.attrs   # the same dict: writes through it are the object's attributes
            return d
        try:
            return wrap_class_attr(tx, self, self.cls, name)
        except AttributeMissing:
            if isinstance(getattr_fn := _static_lookup(self.cls, "__getattr__"), types.FunctionType):
                return tx.call(UserFunctionVariable(getattr_fn), [self, ConstantVariable(name)], {})
            raise

    def set_attr(self, tx, name, value):
        if isinstance(attr := _static_lookup(self.cls, name), property):
            if attr.fset is None:
                raise Unsupported(f"can't set property {name}")
            tx.call(UserFunctionVariable(attr.fset), [self, value], {})
            return
        setattr_fn = _static_lookup(self.cls, "__setattr__")
        if setattr_fn is not object.__setattr__ and isinstance(setattr_fn, types.FunctionType):
            tx.call(UserFunctionVariable(setattr_fn), [self, ConstantVariable(name), value], {})
            return
        self.attrs[name] = value

    def del_attr(self, tx, name):      # (an object made in the frame: no side effect)
        if _static_lookup(self.cls, "__delattr__") is not object.__delattr__ or name not in self.attrs:
            super().del_attr(tx, name)      # (a missing name: eager raises AttributeError after the break)
        del self.attrs[name]

    def call_function(self, tx, args, kwargs):
        if isinstance(call := _static_lookup(self.cls, "__call__"), types.FunctionType):
            return tx.call(UserMethodVariable(call, self), args, kwargs)
        raise Unsupported(f"call to a {self.cls.__name__} object")

    def call_method(self, tx, name, args, kwargs):
        return tx.call(self.var_getattr(tx, name), args, kwargs)

    def truthy(self, tx):
        return object_truthy(tx, self, self.cls)

    def reconstruct(self, cg):
        name = cg.bind(self, f"___new_object({cg.const_expr(self.cls)}, {{}})")   # first: an attribute may be itself
        attrs = ", ".join(f"{k!r}: {cg.reconstruct(v)}" for k, v in self.attrs.items())
        cg.lines.append(f"___new_object({name}, {{{attrs}}})")
        return name


class ModuleInitProbe(NewObjectVariable):
    """The ``self`` of a user ``nn.Module`` subclass's ``__init__`` traced to prove it pure
    (:meth:`InFrameModuleVariable.create`); ``super().__init__`` into torch.nn is skipped."""


class FunctionCtxProbe(NewObjectVariable):
    """The ``ctx`` of a custom autograd formula traced by :func:`probe_autograd`: attributes are kept,
    ``save_for_backward`` keeps its tensors as ``saved_tensors``, the other ctx calls do nothing."""

    CALLS = ("save_for_backward", "save_for_forward", "mark_dirty", "mark_non_differentiable", "set_materialize_grads")

    def var_getattr(self, tx, name):
        return BoundMethodVariable(self, name) if name in self.CALLS else super().var_getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name not in self.CALLS:
            return super().call_method(tx, name, args, kwargs)
        if name in ("save_for_backward", "mark_dirty"):
            self.attrs["saved_tensors" if name == "save_for_backward" else "_coil_dirty"] = TupleVariable(list(args))
        return ConstantVariable(None)


def probe_autograd(tx, what: str, inputs: list, forward, setup_context, backward) -> "FunctionCtxProbe":
    """Trace a custom autograd formula once, before anything runs it (``forward(ctx)`` traces its forward;
    ``setup_context`` is None where forward takes ``ctx``; ``backward`` None: not traced). The graph runs none of its Python per call, so a side
    effect, or code capture cannot trace, raises Unsupported (a break). Its nodes are removed, its guards kept;
    returns the probe's ctx."""
    from coil.capture.variables.hops import _RefusingSideEffects
    out = tx.output
    before, saved, draws = set(out.graph.nodes), out.side_effects, len(out.draws)
    out.side_effects = _RefusingSideEffects(saved, what)
    try:
        ctx = FunctionCtxProbe(object)
        grad = torch.is_grad_enabled() and any(isinstance(a, TensorVariable) and a.fake.requires_grad for a in inputs)
        ctx.attrs["needs_input_grad"] = ConstantVariable(tuple(grad and isinstance(a, TensorVariable) and
                                                               a.fake.requires_grad for a in inputs))
        res = forward(ctx)
        if setup_context is not None:
            tx.call(UserFunctionVariable(inspect.unwrap(setup_context)), [ctx, TupleVariable(list(inputs)), res], {})
        outs = res.items if isinstance(res, (TupleVariable, ListVariable)) else [res]
        if grad and backward is not None:
            grads = [call_op(tx, "call_function", torch.ones_like, [o], {}) if isinstance(o, TensorVariable)
                     else ConstantVariable(None) for o in outs]
            tx.call(UserFunctionVariable(inspect.unwrap(backward)), [ctx] + grads, {})
        if len(out.draws) != draws:
            raise Unsupported("a draw from Python's random")
        args = {a.node for a in inputs if isinstance(a, TensorVariable)}
        new = [n for n in out.graph.nodes if n not in before]
        if any(isinstance(m.meta.get("example_value"), torch.Tensor) and m not in args
               and (m.op == "placeholder" or m in before) and not all(u.target == "item" for u in m.users)
               for n in new for m in [n, *n.all_input_nodes]):    # (a Python float's 0-d tensor: its item)
            # a tensor it reads that is not an argument (a global, a closure's): the node's fake run would run the
            # formula's Python on the real tensor (an in-place op on it mutates it while tracing), AOT's bakes it in
            raise Unsupported("it reads a tensor that is not one of its arguments")
        return ctx
    except Unsupported as e:
        raise Unsupported(f"{what} cannot be traced free of Python side effects, which eager runs on every call "
                          f"({e.reason})", hint="it runs eagerly") from e
    finally:
        out.side_effects = saved
        for n in reversed([n for n in out.graph.nodes if n not in before and n.op != "placeholder"]):
            out.graph.erase_node(n)


def is_model_output_class(cls) -> bool:
    """Dataclasses that are also OrderedDicts (``transformers.utils.ModelOutput``)."""
    return (isinstance(cls, type) and issubclass(cls, collections.OrderedDict) and dataclasses.is_dataclass(cls))


class DataClassDictVariable(DictVariable):
    """A ``ModelOutput``-style object: a dataclass whose non-None fields are also its dict items (keys in field
    order), built in the frame or read from an input (``source``; mutating that one is a graph break). Supports
    attribute and item access, ``to_tuple()``, and is rebuilt as ``cls(**items)``."""

    def __init__(self, cls, items: dict, source=None):
        super().__init__(items, user_cls=cls, source=source)
        self.fields = [f.name for f in dataclasses.fields(cls)]

    def _mutated(self, tx):
        if self.source is not None:   # the dict write-back (clear/update) is refused by ModelOutput
            raise Unsupported(f"mutating a {self.user_cls.__name__} made outside the compiled frame")
        super()._mutated(tx)

    @classmethod
    def create(cls, tx, klass, args, kwargs):
        names = [f.name for f in dataclasses.fields(klass)]
        values = {**dict(zip(names, args)), **kwargs}
        for f in dataclasses.fields(klass):
            if f.name not in values:
                absent = f.default is None or f.default is dataclasses.MISSING
                values[f.name] = ConstantVariable(None) if absent else tx.wrap(f.default, None)
        items = {n: values[n] for n in names
                 if not (isinstance(values[n], ConstantVariable) and values[n].value is None)}
        return cls(klass, items)

    def var_getattr(self, tx, name):
        if name in self.items:
            return self.items[name]
        return ConstantVariable(None) if name in self.fields else super().var_getattr(tx, name)

    def getitem(self, tx, key):
        if isinstance(k := key.as_python_constant(), (int, slice)):
            values = list(self.items.values())
            return TupleVariable(values[k]) if isinstance(k, slice) else values[k]
        return super().getitem(tx, key)

    def call_method(self, tx, name, args, kwargs):
        if name == "to_tuple":
            return TupleVariable(list(self.items.values()))
        return self.getitem(tx, args[0]) if name == "__getitem__" else super().call_method(tx, name, args, kwargs)

    def set_attr(self, tx, name, value):
        if name in self.fields:
            self._mutated(tx)
            if not (isinstance(value, ConstantVariable) and value.value is None):
                self.items[name] = value   # a new key goes last, as ModelOutput.__setattr__ adds it
            elif name in self.items:   # eager keeps the item and sets only the attribute to None
                raise Unsupported(f"setting {self.user_cls.__name__}.{name} = None over an item")
            return
        raise Unsupported(f"setting non-field attribute {name} on {self.user_cls.__name__}")

    def unpack(self, tx):
        return [ConstantVariable(k) for k in self.items]

    def build_expr(self, cg):
        body = ", ".join(f"{k}={cg.reconstruct(v)}" for k, v in self.items.items())
        if list(self.items) == [f for f in self.fields if f in self.items]:
            return f"{cg.const_expr(self.user_cls)}({body})"
        return f"{cg.const_expr(_in_order)}({cg.const_expr(self.user_cls)}({body}), {list(self.items)!r})"


def _in_order(obj, keys):
    """``obj`` with its items moved into ``keys``' order (fields set after construction go last)."""
    for k in keys:
        collections.OrderedDict.move_to_end(obj, k)
    return obj
