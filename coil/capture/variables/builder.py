"""VariableBuilder: real value + source → tracker, adding the guards its use needs.

:func:`wrap` is the only way real objects enter a translation. It de-duplicates by identity (one tracker per real
object, so aliasing and mutation stay consistent; two sources reaching the same tensor get an ``a is b`` guard), chooses
the tracker class, and adds guards on the value's source: a tensor, parameter or buffer its type, dtype, device, shape,
stride and requires_grad; None, a bool, Ellipsis ``x is v``; an int, float, str... ``type(x) is T and x == v``; a dtype,
device, enum or class ``x is ___cN`` (``==`` for devices); a tuple, list or dict its type and length (items guarded as
read); a function ``x.__code__ is ___cN``; an nn.Module or object ``type(x) is ___cN``; a Python module ``x is ___cN``.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import inspect
import math
import os
import random
import types
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from coil.exc import Unsupported
from coil.capture.dynamic import RANDOM_DRAWS
from coil.capture.guards import tensor_guard
from coil.capture.source import AttrSource, GetItemSource, LocalSource
from coil.capture.variables.base import ConstantVariable, NumpyArrayVariable, VariableTracker, is_literal
from coil.capture.variables.containers import (DictVariable, ListVariable, NamedTupleVariable, SetVariable,
                                               TupleVariable, method_getattr, resumed_iterator)
from coil.capture.variables.functions import (BoundMethodVariable, PartialVariable, UserFunctionVariable,
                                              UserMethodVariable)
from coil.capture.variables.objects import (AutogradFunctionApplyVariable, DataClassDictVariable, NNModuleVariable,
                                            PythonModuleVariable, UserDefinedClassVariable, UserDefinedObjectVariable,
                                            is_model_output_class)
from coil.capture.variables.torchfn import (CONTEXT_CLASSES, AutocastVariable, LockVariable,
                                            TorchFunctionVariable, is_torch_function, resumed_context)
from coil.capture.variables.hops import HigherOrderVariable, hop_handler
from coil.capture import frame as _frame
from coil.capture.inspection import FrameVariable, OpaqueCallableVariable, OpaqueObjectVariable


_FUNCTION_APPLY = torch.autograd.Function.apply.__func__

#: numpy functions without side effects, folded on constant arguments (numpy arrays among them: NumpyArrayVariable)
_NUMPY_PURE = frozenset(
    "array asarray arange zeros ones full zeros_like ones_like full_like linspace concatenate stack vstack hstack "
    "reshape transpose where sum prod cumsum cumprod mean max min amax amin argmax argmin argsort sort unique clip "
    "repeat tile flip roll diff nonzero round floor ceil abs all any isin searchsorted squeeze expand_dims "
    "broadcast_to pad take dot matmul outer eye identity tril triu count_nonzero ravel".split())


def _numpy_pure(value) -> bool:
    np, name = __import__("sys").modules.get("numpy"), getattr(value, "__name__", None)
    return np is not None and name in _NUMPY_PURE and getattr(np, name, None) is value


def wrap_constant_result(tx, value: Any) -> VariableTracker:
    """Wrap a value computed at compile time (no source, no guard)."""
    if is_literal(value) or isinstance(value, (inspect.Signature, inspect.Parameter, types.MappingProxyType,
                                               types.CodeType, __import__("dataclasses").Field)) or \
            type(value).__module__ == "numpy" and getattr(value, "ndim", 1) == 0:  # a numpy scalar (np.sqrt(d))
        return ConstantVariable(value)
    if type(value).__name__ == "ndarray" and type(value).__module__ == "numpy":   # np.array([64, 128]) // 8
        return NumpyArrayVariable(value)
    return wrap(tx, value, None)


def _guard_literal(gs, expr, value):
    if value is None or isinstance(value, bool) or value is Ellipsis:
        gs.add(f"{expr} is {value!r}", expr, value, src=expr)
    elif isinstance(value, (torch.dtype, enum.Enum, torch.layout, torch.memory_format)):
        gs.add(f"{expr} is {gs.const(value)}", expr, value, src=expr)
    elif isinstance(value, torch.device):
        gs.add(f"{expr} == {gs.const(value)}", expr, value, src=expr)
    elif isinstance(value, float) and value != value:
        gs.add(f"type({expr}) is float and {expr} != {expr}", expr, value)
    elif type(value) in (int, str, bytes) or type(value) is float and math.isfinite(value):   # (repr(inf): no Python)
        gs.add(f"type({expr}) is {type(value).__name__} and {expr} == {value!r}", expr, value, src=expr)
    else:
        gs.add(f"type({expr}) is {gs.const(type(value))} and {expr} == {gs.const(value)}", expr, value)
    for path, v in _float_zeros(value, ""):   # == cannot tell -0.0 from 0.0; x * -0.0 can
        gs.add(f"math.copysign(1.0, {expr}{path}) == {math.copysign(1.0, v)}", f"{expr}{path}", v)


def _float_zeros(value, path):
    """(index path, value) of each float zero in a literal (tuples of tuples included)."""
    if type(value) is float and value == 0:
        yield path, value
    elif type(value) is tuple:
        for i, v in enumerate(value):
            yield from _float_zeros(v, f"{path}[{i}]")


def _changed_items(tx, value: tuple, expr: str) -> bool:
    """Whether an int/float item of the constant tuple read from ``expr`` changed between calls (automatic dynamic:
    an optimizer's ``betas`` under a momentum schedule recompiled every step). Then the tuple is wrapped item by item,
    the changed items graph inputs; each such item is recorded to be compared on the next miss."""
    dyn = tx.output.dynamic
    items = {f"{expr}[{i}]": v for i, v in enumerate(value) if type(v) in (int, float)}
    dyn.scalars.update(items)
    return any("value" in dyn.auto.get(k, ()) for k in items)


def _fields_are_items(value) -> bool:
    """Whether the ModelOutput ``value``'s dict items are exactly its non-None dataclass fields (setting a field
    after construction can leave an attribute without its item, or an item whose attribute is None)."""
    names = {f.name for f in dataclasses.fields(value)}
    return all(type(k) is str and k in names for k in value) and all(
        getattr(value, n, None) is (value[n] if n in value else None) for n in names)


def _source_key(k) -> bool:
    """Whether ``repr(k)`` is Python source for dict key ``k``, as sources and guards index with it."""
    if type(k) is tuple:
        return all(map(_source_key, k))
    return type(k) in (str, int, bool, type(None), torch.dtype) or type(k) is float and math.isfinite(k)


def wrap(tx, value: Any, source, guard: bool = True) -> VariableTracker:
    """The tracker for real ``value`` read from ``source`` (see module docstring)."""
    out = tx.output
    if not (literal := is_literal(value)) and (hit := out.wrapped.get(id(value))) is not None:
        vt = hit[1]
        if guard and source is not None and vt.source is not None and source != vt.source:
            a, b = vt.source.expr(), source.expr()
            out.guards.add(f"{b} is {a}", note=f"{a} and {b} were one object when compiled; they are "
                                                 f"distinct on this call")
        return vt
    vt = _build(tx, value, source, out.guards if (guard and source is not None) else None)
    if not literal:
        out.wrapped[id(value)] = (value, vt)
    return vt


def _build(tx, value, source, gs) -> VariableTracker:
    from coil.capture.variables import builtins as bi
    expr = source.expr() if source is not None else None

    def guard_is():  # the value by identity
        if gs is not None:
            gs.add(f"{expr} is {gs.const(value)}")

    def guard_type():
        if gs is not None:
            gs.add(f"type({expr}) is {gs.const(type(value))}", f"type({expr})", type(value), src=expr)

    def part(v, source_of):  # a part of ``value`` (guarded too when ``value`` is), at ``source_of(source)``
        return wrap(tx, v, source_of(source) if source is not None else None, guard=gs is not None)
    if is_literal(value) and not (gs is not None and type(value) is tuple and _changed_items(tx, value, expr)):
        if gs is not None and type(value) in (int, float):
            if (sym := tx.output.dynamic.scalar_input(tx, value, source)) is not None:   # dynamic.py
                gs.add(f"type({expr}) is {type(value).__name__}", f"type({expr})", type(value), src=expr)
                return sym
        if gs is not None:
            _guard_literal(gs, expr, value)
        return ConstantVariable(value, source)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", 1) == 0 and value == value:
        if gs is not None:     # a numpy scalar (Reformer's np.lcm chunk length): a constant as computed ones are
            _guard_literal(gs, expr, value)
        return ConstantVariable(value, source)
    if isinstance(value, torch.Tensor):
        tf = getattr(type(value).__torch_function__, "__func__", type(value).__torch_function__)
        if tf not in (torch.Tensor.__torch_function__.__func__, torch._C._disabled_torch_function_impl):
            raise Unsupported(f"tensor subclass {type(value).__name__} overrides "
                              "__torch_function__ (the graph would bypass it)", "the code that reads it runs eagerly")
        if tf is not torch._C._disabled_torch_function_impl and type(value) is not torch.Tensor \
                and source is not None and not isinstance(value, FakeTensor):
            raise Unsupported(f"tensor subclass {type(value).__name__}: torch functions return {type(value).__name__} "
                              f"there, the graph plain tensors", "the code that reads it runs eagerly")
        if value.layout is not torch.strided and not isinstance(value, FakeTensor):  # compiled code would fail
            raise Unsupported(f"{value.layout} tensor (coil compiles strided tensors only)",
                              "the code that reads it runs eagerly")
        if source is None:
            return tx.output.lift_constant_tensor(tx, value)
        vt = tx.output.add_input(tx, value, source)
        if gs is not None:
            tensor_guard(gs, expr, value, vt.fake)
        return vt
    if isinstance(value, torch.nn.Module):
        guard_type()
        return NNModuleVariable(value, source)
    if (t := type(value)) in (tuple, list) or (isinstance(value, tuple) and hasattr(t, "_fields")):
        if gs is not None:
            gs.add(f"type({expr}) is {gs.const(t)} and len({expr}) == {len(value)}", f"len({expr})", len(value))
        items = [part(v, lambda s, i=i: GetItemSource(s, i)) for i, v in enumerate(value)]
        if t is list:
            return ListVariable(items, source)
        return TupleVariable(items, source) if t is tuple else NamedTupleVariable(items, t, source)
    if is_model_output_class(t) and _fields_are_items(value):
        # a ModelOutput made outside the frame: its items are its non-None fields, read as ``x[key]``
        keys = list(value)
        if gs is not None:
            gs.add(f"type({expr}) is {gs.const(t)} and list({expr}) == {keys!r}", f"list({expr})", keys)
            for f in dataclasses.fields(t):
                gs.add(f"{expr}.{f.name} is {expr}[{f.name!r}]" if f.name in value else f"{expr}.{f.name} is None")
        items = {k: part(v, lambda s, k=k: GetItemSource(s, k)) for k, v in value.items()}
        return DataClassDictVariable(t, items, source)
    if t in (dict, collections.OrderedDict, types.MappingProxyType) or (
            isinstance(value, dict) and t.__module__ != "builtins" and t.__init__ is dict.__init__
            and t.__getitem__ is dict.__getitem__   # (sources index it)
            and all(is_literal(k) for k in value)):
        if not all(map(_source_key, value)):   # (an enum member, inf: guarded lookups instead)
            return UserDefinedObjectVariable(value, source)
        if gs is not None:
            gs.add(f"type({expr}) is {gs.const(t)} and list({expr}) == {list(value)!r}", f"list({expr})", list(value))
        items = {k: part(v, lambda s, k=k: GetItemSource(s, k)) for k, v in value.items()}
        return DictVariable(items, t, source)
    if t in (set, frozenset):
        if not all(is_literal(k) for k in value):
            raise Unsupported("set of non-constants")
        if gs is not None:
            gs.add(f"{expr} == {gs.const(value)}", expr, value)
        return SetVariable(value, source) if t is set else ConstantVariable(value)
    if value is os.environ:
        return EnvironVariable(source)
    if gs is not None and isinstance(source, LocalSource) and source.name.startswith("___stack"):
        if (vt := resumed_iterator(tx, value, source)) is not None:   # a loop a graph break interrupted
            return vt
    if isinstance(value, types.ModuleType):
        guard_is()
        return PythonModuleVariable(value, source)
    if value in CONTEXT_CLASSES if isinstance(value, type) else False:
        return UserDefinedClassVariable(value, source)
    if isinstance(value, torch.amp.autocast):   # made before the call (``@torch.autocast(...)``'s): as one made in the
        # frame (its __enter__ traced as Python set the real state while tracing); guarded on its settings
        args = (value.device, value.fast_dtype, value._enabled, value._cache_enabled)
        if gs is not None:
            gs.add(f"type({expr}) is {gs.const(type(value))} and ({expr}.device, {expr}.fast_dtype, {expr}._enabled, "
                   f"{expr}._cache_enabled) == {gs.const(args)}", src=expr)
        return AutocastVariable(args, source)
    if bi.is_builtin(value):
        guard_is()
        return bi.BuiltinVariable(value, source)
    if isinstance(value, types.FunctionType) and hop_handler(value) is not None:
        # torch.cond, checkpoint: their function arguments are traced as subgraphs
        guard_is()
        return HigherOrderVariable(value, source)
    if is_torch_function(value) and not hasattr(value, "__marked_compile_region_fn__"):
        # (a nested_compile_region wrapper is torch's Python code: inlined, builtins.py)
        guard_is()
        return TorchFunctionVariable(value, source)
    if _numpy_pure(value):     # ``np.array([64, 128])``, ``np.eye(2)`` (Python, not inlined): folded on constants
        guard_is()
        return bi.PureFunctionVariable(value, source)
    if isinstance(value, types.FunctionType):
        if _frame.is_disabled(value):
            return bi.DisabledFunctionVariable(value, source)
        if gs is not None:
            gs.add(f"{expr}.__code__ is {gs.const(value.__code__)}", src=expr)
        return UserFunctionVariable(value, source)
    if source is not None and isinstance(value, (types.MethodType, types.BuiltinMethodType)) and (
            (type(value.__self__) is random.Random and value.__name__ in RANDOM_DRAWS)  # a draw (objects.py)
            # ``x.reshape`` left on the stack by a graph break inside its argument list (``x.reshape(-1,
            # int(k.item()))``): the tensor's method, not a call into C that breaks again
            or (isinstance(value, types.BuiltinMethodType) and isinstance(value.__self__, torch.Tensor)
                and callable(getattr(torch.Tensor, value.__name__, None)))):
        if gs is not None:  # not by identity: ``rng.uniform`` is a new bound method each time it is read
            gs.add(f"type({expr}) is {gs.const(type(value))} and {expr}.__name__ == {value.__name__!r}")
        method = BoundMethodVariable(wrap(tx, value.__self__, AttrSource(source, "__self__")), value.__name__)
        method.source = source      # rebuilt at a break as the same object (``obj.name`` is a new one each time)
        return method
    if isinstance(value, types.MethodType) and value.__name__ == "__exit__" and source is not None and \
            (ctx := resumed_context(value.__self__, AttrSource(source, "__self__"))) is not None:
        # the __exit__ of a grad-mode / autocast block a graph break resumed inside (torchfn.reenter)
        obj, state = value.__self__, dict(vars(value.__self__))    # (prev: what its __exit__ restores)
        if gs is not None:
            gs.add(f"type({expr}.__self__) is {gs.const(type(obj))} and {expr}.__self__.__dict__ == {gs.const(state)}",
                   f"{expr}.__self__.__dict__", state, src=expr)
        method = BoundMethodVariable(ctx, "__exit__")
        method.source = source      # (still open at the next break: passed on as it is)
        return method
    if isinstance(value, types.MethodType) and value.__func__ is torch.inference_mode.clone:
        # ``@torch.inference_mode()``'s ctx_factory: a new context of the same mode (torchfn.make_context)
        if gs is not None:
            gs.add(f"{expr}.__func__ is {gs.const(value.__func__)} and {expr}.__self__.mode is {value.__self__.mode!r}")
        return PartialVariable(UserDefinedClassVariable(torch.inference_mode), [ConstantVariable(value.__self__.mode)],
                               {})
    if isinstance(value, types.MethodType) and isinstance(value.__func__, functools._lru_cache_wrapper) and \
            source is not None:   # ``logger.warning_once(msg)``: called as an lru_cache function (objects.py)
        return UserDefinedObjectVariable(value, source)
    if isinstance(value, types.MethodType) and value.__func__ is _FUNCTION_APPLY and source is not None and \
            isinstance(value.__self__, type):   # ``self.fn = MyFn.apply`` kept on a module (I-BERT's QuantAct)
        if gs is not None:
            gs.add(f"{expr}.__func__ is {gs.const(value.__func__)}", src=expr)
        return AutogradFunctionApplyVariable(wrap(tx, value.__self__, AttrSource(source, "__self__"),
                                                  guard=gs is not None))
    if isinstance(value, types.MethodType):
        fn_vt = part(value.__func__, lambda s: AttrSource(s, "__func__"))
        self_vt = part(value.__self__, lambda s: AttrSource(s, "__self__"))
        if isinstance(fn_vt, UserFunctionVariable):
            return UserMethodVariable(value.__func__, self_vt, source)
        raise Unsupported(f"bound method {value!r}")
    if isinstance(value, functools.partial):
        fn = part(value.func, lambda s: AttrSource(s, "func"))
        args = [part(a, lambda s, i=i: GetItemSource(AttrSource(s, "args"), i)) for i, a in enumerate(value.args)]
        kwargs = {k: part(a, lambda s, k=k: GetItemSource(AttrSource(s, "keywords"), k))
                  for k, a in value.keywords.items()}
        return PartialVariable(fn, args, kwargs, source)
    if isinstance(value, type):
        guard_is()
        return UserDefinedClassVariable(value, source)
    if isinstance(value, (types.BuiltinFunctionType, types.MethodWrapperType,
                          types.MethodDescriptorType, types.WrapperDescriptorType)):
        mod = getattr(value, "__module__", None) or ""
        if mod in ("math", "_operator", "operator", "cmath") or bi.is_pure_builtin_method(value):
            guard_is()
            return bi.PureFunctionVariable(value, source)
        return OpaqueCallableVariable(value, source)   # calling it is the graph break
    if t.__name__ == "ufunc" and t.__module__ == "numpy":   # ``np.sqrt(head_dim)``: folded on constants
        guard_is()
        return bi.PureFunctionVariable(value, source)
    if isinstance(value, (torch.Generator, torch.Stream, *LockVariable.TYPES)):
        # may be held and passed around; using it (e.g. ``generator=g``) is a graph break; ``with lock:`` is traced
        guard_type()
        return (LockVariable if t in LockVariable.TYPES else OpaqueObjectVariable)(value, source)
    if t is types.CellType and source is not None:
        # a frame's cell handed to its resume function (resume.py): content read on use
        guard_type()
        return tx.output.sourced_cell(value, AttrSource(source, "cell_contents"))
    if t is types.FrameType:
        guard_type()
        return FrameVariable(value, source)
    if isinstance(inspect.getattr_static(value, "_torchdynamo_inline", None), types.FunctionType):
        guard_is()   # a scripted or traced function: its Python function is traced when called
    else:
        guard_type()
    return UserDefinedObjectVariable(value, source)


class EnvironVariable(VariableTracker):
    """``os.environ``: reads become constants guarded on the variable's current value."""

    var_getattr = method_getattr

    def call_method(self, tx, name, args, kwargs):
        gs = tx.output.guards
        env = gs.const(os.environ)
        if name in ("get", "__getitem__", "__contains__"):
            if "default" in kwargs:     # os.getenv(key, default=...)
                args = [args[0], kwargs["default"]]
            key = args[0].as_python_constant()
            value = os.environ.get(key)
            gs.add(f"{env}.get({key!r}) == {value!r}", f"{env}.get({key!r})", value)
            if name == "__contains__":
                return ConstantVariable(value is not None)
            if value is None:
                if name == "get":
                    return args[1] if len(args) > 1 else ConstantVariable(None)
                raise Unsupported(f"KeyError: {key!r} (raised by user code)")
            return ConstantVariable(value)
        raise Unsupported(f"os.environ.{name}")
