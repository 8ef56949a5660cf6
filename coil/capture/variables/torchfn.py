"""Trackers for torch functions and torch's global-state context managers.

- :class:`TorchFunctionVariable`: ``torch.*``, ``torch.nn.functional.*``, ``torch.Tensor.*`` and friends. A call becomes
  an FX node (``call_op``) except for a short table of functions answered at compile time (``torch.is_grad_enabled``,
  ``torch.compiler.is_compiling``...) and a deny list that changes global state (``torch.manual_seed``...), which is a
  graph break.
- :class:`GradModeVariable`: ``torch.no_grad()``, ``torch.enable_grad()``, ``torch.set_grad_enabled(b)``.
  ``torch.inference_mode()`` is a graph break (its tensors are inference tensors; the block runs as eager Python).
  Entering emits ``torch._C._set_grad_enabled(mode)`` into the graph and switches the compiler's own grad mode so fake
  tensors get eager's ``requires_grad``.
- :class:`AutocastVariable`: ``torch.autocast(...)`` emits the enter/exit calls of ``torch.amp.autocast_mode`` into the
  graph."""
from __future__ import annotations

import contextlib
import inspect
import re
import threading
import types
from typing import Optional

import torch
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast

from coil.exc import Unsupported
from coil.capture.variables.base import ConstantVariable, KnownCallableVariable, NumpyArrayVariable, VariableTracker
from coil.capture.variables.tensor import TensorVariable, call_op
from coil.capture.variables.functions import BaseFunctionVariable, BoundMethodVariable

_CM_HELPER = contextlib.contextmanager(lambda: None).__code__
_COMPILE_TIME = {
    torch.is_grad_enabled: lambda tx: torch.is_grad_enabled(),
    torch.get_default_dtype: lambda tx: torch.get_default_dtype(),
    torch.jit.is_scripting: lambda tx: False,
    torch.jit.is_tracing: lambda tx: False,
    torch._C._get_tracing_state: lambda tx: None,
    torch.is_inference_mode_enabled: lambda tx: torch.is_inference_mode_enabled() or tx.output.inference_depth > 0,
    torch.compiler.is_compiling: lambda tx: True,
    torch.compiler.is_dynamo_compiling: lambda tx: True,
    torch.compiler.is_exporting: lambda tx: False,
    torch.is_autocast_enabled: None,  # handled with arguments below
    torch.cuda.is_available: lambda tx: torch.cuda.is_available(),
}

#: queries of the machine's devices, fixed for the process: called at compile time with the
#: call's constant arguments (transformers asks ``get_device_capability`` inside its MoE
#: layers; tracing into it reached ``os.getenv``, a graph break per layer)
_DEVICE_QUERIES = {inspect.unwrap(f) for f in (torch.cuda.get_device_capability, torch.cuda.device_count,
                                               torch.cuda.get_device_name, torch.cuda.is_bf16_supported)}

# compared unwrapped: torch wraps some of them later (torch._dynamo replaces torch.manual_seed by a disable-wrapper on
# import, after which ``manual_seed`` in a compiled function was dropped: it ran once, while tracing; fresh-user trial)
_DENY = {inspect.unwrap(f) for f in (
    torch.manual_seed, torch.seed, torch.set_rng_state, torch.get_rng_state, torch.set_default_dtype,
    torch.use_deterministic_algorithms, torch.set_printoptions, torch.save, torch.load,
    torch.set_num_threads, torch.autograd.grad, torch.autograd.backward)}
#: torch.func transforms: of a constant function, called at compile time (what they return becomes a graph
#: node that make_fx traces); of a function made in the frame or with tensors, a graph break
_FUNC_TRANSFORMS = {inspect.unwrap(getattr(torch.func, n)) for n in (
    "grad", "grad_and_value", "vmap", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "linearize", "functionalize")}
#: argument-free queries of global settings: answered at compile time, guarded on their value
_GUARDED = {inspect.unwrap(f) for f in (
    torch.are_deterministic_algorithms_enabled, torch.is_deterministic_algorithms_warn_only_enabled,
    torch.get_num_threads, torch.get_num_interop_threads, torch.is_anomaly_enabled)}
#: ``torch._check``-style functions: the index of their condition argument
_CHECKS = {inspect.unwrap(torch._check): 0, inspect.unwrap(torch._check_with): 1}
#: modules whose wrappers torch puts on its own functions (``@deprecated``, ``singledispatch``)
_WRAPPER_HOMES = {"contextlib", "typing_extensions", "functools", "warnings"}


#: torch's global switches in ``torch._C`` that pick kernels (cudnn, cuBLAS, oneDNN, SDPA backends, TF32): traced as
#: reads and writes of global state, not graph ops (``OutputGraph.torch_switch``)
_SWITCH = re.compile(r"_(cuda_)?[gs]et_(cudnn|cublas|mkldnn|nnpack|onednn|miopen|math_sdp|fp32_precision|"
                     r"float32_matmul|cpu_allow|blas_pref|linalg_pref|rocm_fa)")


def is_torch_function(value) -> bool:
    """Callables that should become graph nodes rather than be inlined."""
    if isinstance(value, type):
        return False
    if not isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.BuiltinMethodType,
                              types.MethodDescriptorType, types.WrapperDescriptorType, types.MethodWrapperType,
                              torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return False
    code = getattr(value, "__code__", None)
    if code is _CM_HELPER or code is not None and code.co_flags & inspect.CO_GENERATOR:
        return False   # a @contextmanager or a generator: inlined, their objects made at each call
    home = str(getattr(value, "__globals__", {}).get("__name__"))
    if code is not None and not home.startswith("torch") and home not in _WRAPPER_HOMES:
        return False   # user code under a torch function's name (functools.wraps): inlined, its Python runs
    mod = getattr(value, "__module__", None) or ""
    if mod.startswith(("torch.nn.modules", "torch.utils", "torch._dynamo", "torch.fx", "torch.autograd.function",
                       "torch.nn.utils", "torch.optim", "torch.distributed", "torch.compiler", "torch._tensor",
                       "torch.testing", "torch.backends", "torch.overrides", "torch.amp", "torch.cuda",
                       "torch.distributions")):
        return value in _COMPILE_TIME or inspect.unwrap(value) in _DEVICE_QUERIES
    if mod.startswith("torch") or mod == "torch._C._nn" or mod == "torch._C._linalg":
        return True
    if (name := getattr(value, "__name__", None)) and getattr(torch.Tensor, name, None) is value:
        return True
    # builtins defined by torch's C extension (torch._C._VariableFunctions...)
    return type(value).__name__ == "builtin_function_or_method" and \
        str(getattr(getattr(value, "__self__", None), "__name__", "") or "").startswith("torch")


class ForwardADFrame(RuntimeError):
    """Not a graph break: the whole frame runs eagerly (the graph would drop tangents)."""


class TorchFunctionVariable(KnownCallableVariable):
    """A torch function: calls become graph nodes (see module docstring)."""

    def call_function(self, tx, args, kwargs):
        fn = self.fn
        if (base := inspect.unwrap(fn)) in _DENY:
            raise Unsupported(f"call to {fn.__module__}.{fn.__name__} changes global state",
                              hint="call it outside the compiled function")
        if base in _FUNC_TRANSFORMS and not all(a.is_python_constant() for a in [*args, *kwargs.values()]):
            raise Unsupported(f"torch.func.{fn.__name__} of a function made in the compiled frame, or of tensors, "
                              "is not captured", hint="this call of the transform runs eagerly")
        if getattr(base, "__closure__", None) and any(isinstance(v, torch.nn.Module) for v in inspect.getclosurevars(
                base).nonlocals.values()):   # (linearize's jvp_fn: a const-folded graph folds on its first real call)
            raise Unsupported(f"{base.__qualname__} holds a module, whose Python a run on fake tensors would run",
                              hint="this call runs eagerly")
        if getattr(base, "__module__", None) == "torch.autograd.forward_ad":
            raise ForwardADFrame(f"{fn.__name__}: forward AD in the frame (dual levels, dual tensors)")
        if getattr(fn, "__self__", None) is torch._C and _SWITCH.match(name := fn.__name__) and not kwargs and all(
                a.is_python_constant() for a in args) and (other := getattr(torch._C, re.sub(
                    r"_[gs]et(_|ter)", r"_get\1" if (is_set := "_set_" in name) else r"_set\1", name), None)):
            return tx.output.torch_switch(*((other, fn) if is_set else (fn, other)),
                                          tuple(a.as_python_constant() for a in args), is_set)
        if fn is torch.is_autocast_enabled:
            return ConstantVariable(fn(*[a.as_python_constant() for a in args]))
        if fn in _COMPILE_TIME:
            return ConstantVariable(_COMPILE_TIME[fn](tx))
        if base in _DEVICE_QUERIES:
            try:
                consts = [a.as_python_constant() for a in args]
                kw = {k: v.as_python_constant() for k, v in kwargs.items()}
            except (NotImplementedError, Unsupported):
                raise Unsupported(f"{fn.__name__} with an argument not known at compile time") from None
            try:
                return ConstantVariable(fn(*consts, **kw))
            except Exception as e:  # noqa: BLE001 - eager raises it: the call runs there
                raise Unsupported(f"{fn.__name__} raised {type(e).__name__}") from None
        if base in _GUARDED and not args and not kwargs:
            # a global setting read as a constant: its value is a guard (use_deterministic_algorithms
            # after the first call ran the other branch; fresh-user trial)
            value, gs = fn(), tx.output.guards
            gs.add(f"{gs.const(fn)}() == {value!r}", f"{gs.const(fn)}()", value)
            return ConstantVariable(value)
        if fn is torch.set_grad_enabled:
            ctx = GradModeVariable(args[0].as_python_constant())
            ctx.enter(tx)  # set_grad_enabled acts immediately when called as a function
            ctx.called_as_function = True
            return ctx
        if fn is torch.is_tensor:
            return ConstantVariable(isinstance(args[0], TensorVariable))
        if fn is torch.tensor and args and isinstance(args[0], NumpyArrayVariable) and args[0].value.size <= 1 << 16:
            # a copy, never the array's memory (unlike from_numpy / as_tensor): its values, in its dtype unless given
            a = args[0].value
            try:
                kwargs = {"dtype": ConstantVariable(torch.from_numpy(a.copy()).dtype), **kwargs}
            except TypeError:
                raise Unsupported(f"torch.tensor of a numpy array of dtype {a.dtype}") from None
            args = [ConstantVariable(a.tolist()), *args[1:]]
        if base in _CHECKS and len(args) > _CHECKS[base] and args[_CHECKS[base]].is_python_constant() and \
                args[_CHECKS[base]].as_python_constant() is True:
            return ConstantVariable(None)   # passes, as in eager (a node would print _check_with's error class)
        if (name := getattr(fn, "__name__", None)) and getattr(torch.Tensor, name, None) is fn:
            return call_op(tx, "call_method", name, list(args), kwargs)
        return call_op(tx, "call_function", fn, list(args), kwargs)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVariable(getattr(self.fn, name))
        raise Unsupported(f"attribute {name} of {self.fn}")


class ContextManagerVariable(VariableTracker):
    """Base of the context managers capture understands."""

    def enter(self, tx):
        raise NotImplementedError

    def exit(self, tx):
        raise NotImplementedError

    def var_getattr(self, tx, name):
        if name in ("__enter__", "__exit__", "clone"):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"attribute {name} of {type(self).__name__}")

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            return self.enter(tx)
        if name == "__exit__":
            self.exit(tx)
            return ConstantVariable(None)
        if name == "clone":
            return type(self)(*self.ctor_args())
        raise Unsupported(f"{type(self).__name__}.{name}")

    def call_function(self, tx, args, kwargs):
        # used as a decorator: ``@torch.no_grad()``
        if len(args) == 1 and isinstance(args[0], BaseFunctionVariable):
            return DecoratedFunctionVariable(self, args[0])
        raise Unsupported(f"call to {type(self).__name__}")


class GradModeVariable(ContextManagerVariable):
    """``torch.no_grad()`` / ``enable_grad()`` / ``set_grad_enabled(b)`` /
    ``inference_mode()`` (captured with no_grad semantics)."""

    def __init__(self, mode: bool, kind: str = "set_grad_enabled"):
        super().__init__(None)
        self.mode, self.kind = mode, kind
        self.prev, self.exited, self.called_as_function = None, False, False

    def ctor_args(self):
        return (self.mode, self.kind)

    def python_type(self):
        return {"no_grad": torch.no_grad, "enable_grad": torch.enable_grad,
                "inference_mode": torch.inference_mode}.get(self.kind, torch.set_grad_enabled)

    def enter(self, tx):
        if self.called_as_function and self.prev is not None:
            return ConstantVariable(None)
        self.prev = torch.is_grad_enabled()
        tx.output.set_grad_mode(tx, self.mode)
        tx.output.inference_depth += self.kind == "inference_mode"
        return ConstantVariable(None)

    def exit(self, tx):
        tx.output.set_grad_mode(tx, self.prev)
        tx.output.inference_depth -= self.kind == "inference_mode"
        self.exited = True

    def reconstruct(self, cg):
        if self.prev is not None and not self.exited and self.kind == "inference_mode":
            raise Unsupported("graph break inside torch.inference_mode")    # (the frame runs eagerly)
        args = () if self.kind in ("no_grad", "enable_grad") else (self.mode,)
        if self.prev is not None and not self.exited:
            # entered and live at a graph break (inside its ``with`` block): a real context
            # object in the entered state; the entry has already set the grad mode
            return cg.bind(self, f"{cg.const_expr(reenter)}({cg.const_expr(self.python_type())}, {args}, {self.prev})")
        return f"{cg.const_expr(self.python_type())}{args}"


class AutocastVariable(ContextManagerVariable):
    """``torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)``."""

    def __init__(self, args: tuple, source=None):
        super().__init__(source)
        self.args, self.handle = args, None

    def ctor_args(self):
        return (self.args,)

    def python_type(self):
        return torch.autocast

    def enter(self, tx):
        device_type, dtype, enabled, cache = self.args
        self.handle = tx.output.graph.create_node(
            "call_function", _enter_autocast, (device_type, dtype, enabled, cache), {})
        tx.locate_node(self.handle)
        self.real = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache)
        self.real.__enter__()
        tx.output.open_contexts.append(self)
        return self     # (``with torch.autocast(...) as c``: eager's ``__enter__`` returns the object)

    def exit(self, tx):
        if self.handle is None:
            raise Unsupported("__exit__ of a torch.autocast not entered in this frame (__enter__() before a break)")
        tx.locate_node(tx.output.graph.create_node("call_function", _exit_autocast, (self.handle,), {}))
        self.real.__exit__(None, None, None)
        tx.output.open_contexts.remove(self)

    def var_getattr(self, tx, name):
        if name in ("fast_dtype", "device"):
            device_type, dtype, enabled, cache = self.args
            real = getattr(self, "real", None) or torch.autocast(device_type, dtype=dtype, enabled=enabled,
                                                                   cache_enabled=cache)
            return ConstantVariable(getattr(real, name))
        return super().var_getattr(tx, name)

    def at_graph_end(self, cg):
        """The entry's part for this block, open where the graph ends (a graph break inside it; the graph closes it at
        its end): after the graph, the real block is entered (:func:`reenter`). Returns what it did, for the log."""
        return cg.bind(self, f"{cg.const_expr(reenter)}({cg.const_expr(torch.autocast)}, {cg.const_expr(self.args)})") \
            and "entered after the graph"

    def reconstruct(self, cg):  # (an open block is bound by at_graph_end first): its object, or a new one not entered
        new = f"{cg.const_expr(torch.autocast)}(*{cg.const_expr(self.args)})"
        return cg.source_expr(self.source) if self.source else new


class ResumedAutocastVariable(AutocastVariable):
    """An autocast block entered before a graph break (the real object :func:`reenter` made, at ``source``) and left
    in a resume function. Leaving it is traced as entering the state its ``__exit__`` restores (``prev``), which the
    graph closes at its end; the entry then runs the real ``__exit__`` (:meth:`at_graph_end`)."""

    def __init__(self, obj, source):
        super().__init__((obj.device, obj.prev_fastdtype, obj.prev, obj.prev_cache_enabled), source)

    def exit(self, tx):
        AutocastVariable.enter(self, tx)

    def at_graph_end(self, cg):
        cg.lines.append(f"{cg.source_expr(self.source)}.__exit__(None, None, None)")
        return "the real block's __exit__ runs after the graph"


class DecoratedFunctionVariable(VariableTracker):
    """``ctx(fn)``: calling it runs ``fn`` inside the context manager."""

    def __init__(self, ctx, fn):
        super().__init__(None)
        self.ctx, self.fn = ctx, fn

    def call_function(self, tx, args, kwargs):
        ctx = type(self.ctx)(*self.ctx.ctor_args())
        ctx.enter(tx)
        try:
            return tx.call(self.fn, args, kwargs)
        finally:
            ctx.exit(tx)


class ResumedGradModeVariable(GradModeVariable):
    """A grad-mode block entered before a graph break and left in a resume function. Leaving it is traced, except when
    it turns grad back *on* in a graph called with grad off: that exit is a graph break (the real ``__exit__`` runs), so
    every graph's grad-enabled regions start in the mode it is called in (what AOT supports)."""

    def exit(self, tx):
        if self.prev and not torch.is_grad_enabled() and not tx.output.initial_grad:
            raise Unsupported("leaving a no_grad block a graph break resumed inside",
                              hint="grad turns back on: the __exit__ runs outside the graph")
        super().exit(tx)


def reenter(cls, args: tuple, prev: Optional[bool] = None):
    """A real context object ``cls(*args)`` in the state its ``__enter__`` leaves, for a ``with`` block a graph break
    resumes inside. A grad mode (``prev``: the mode its ``__exit__`` restores) is not switched: the entry has set the
    mode. An autocast (``prev`` None) is entered here, so its ``__exit__`` restores the caller's state exactly."""
    obj = object.__new__(cls) if cls is torch.set_grad_enabled else cls(*args)
    if prev is None:
        obj.__enter__()
    else:   # (mode: set_grad_enabled's own; no_grad and enable_grad ignore it)
        obj.mode, obj.prev = args[0] if args else cls is torch.enable_grad, prev
    return obj


def resumed_context(obj, source):
    """The tracker of ``obj``, the real context object of a block entered before a graph break whose ``__exit__`` a
    resume function gets (``source``: where ``obj`` is), or None when ``obj`` is no entered grad-mode / autocast."""
    if type(obj) not in (torch.no_grad, torch.enable_grad, torch.set_grad_enabled, torch.autocast) or \
            not isinstance(getattr(obj, "prev", None), bool):
        return None
    if type(obj) is torch.autocast:
        return ResumedAutocastVariable(obj, source)
    kind = {torch.no_grad: "no_grad", torch.enable_grad: "enable_grad"}.get(type(obj), "set_grad_enabled")
    ctx = ResumedGradModeVariable(getattr(obj, "mode", kind == "enable_grad"), kind)
    ctx.prev = obj.prev
    return ctx


class ProfilerRangeVariable(ContextManagerVariable):
    """``torch.autograd.profiler.record_function(name)``: a profiler label. Inside a
    captured region it adds no graph node (the profiler shows the compiled kernels
    instead); optimizers wrap every ``step`` in one, which made ``step`` uncapturable."""

    def __init__(self, name):
        super().__init__(None)
        self.name = name

    def ctor_args(self):
        return (self.name,)

    def python_type(self):
        return torch.autograd.profiler.record_function

    def enter(self, tx):
        return self

    def exit(self, tx):
        pass

    def reconstruct(self, cg):
        return f"{cg.const_expr(contextlib.nullcontext)}()"


class _InferenceModeOff(ProfilerRangeVariable):
    """``torch.inference_mode(mode)`` entered in that mode already: a context that changes nothing."""

    def python_type(self):
        return torch.inference_mode

    def enter(self, tx):
        return ConstantVariable(None)   # (eager's ``__enter__`` returns None)


class LockVariable(ContextManagerVariable):
    """A ``threading.Lock``/``RLock`` (from ``source``, or made by ``factory``): ``with`` is a no-op (capture.md)."""
    TYPES = (type(threading.Lock()), type(threading.RLock()))

    def __init__(self, value=None, source=None, factory=None):
        super().__init__(source)
        self.value, self.factory, self.depth = value, factory, 0

    def enter(self, tx):
        if self.factory is threading.Lock or type(self.value) is self.TYPES[0]:
            if self.source is not None:     # held when called: eager waits (or deadlocks), a recompile breaks here
                tx.output.guards.add(f"{(e := self.source.expr())}.locked() is False", f"{e}.locked()", False, src=e)
            if self.depth or self.value is not None and self.value.locked():
                raise Unsupported("entering a threading.Lock that is held", hint="eager takes it (or deadlocks)")
        self.depth += 1
        return ConstantVariable(True)

    def exit(self, tx):
        self.depth -= 1

    def reconstruct(self, cg):     # live at a graph break inside its block(s): taken for real
        name = cg.bind(self, cg.source_expr(self.source) if self.source else f"{cg.const_expr(self.factory)}()")
        cg.lines += [f"{name}.acquire()"] * self.depth
        return name


def make_context(tx, cls, args, kwargs):
    """Construct a supported context manager from its class, or None."""
    c, kw = [a.as_python_constant() for a in args], {k: v.as_python_constant() for k, v in kwargs.items()}
    if cls is torch.autograd.profiler.record_function:
        return ProfilerRangeVariable(c[0] if c else kw.get("name"))
    if cls is torch.no_grad:
        return GradModeVariable(False, "no_grad")
    if cls is torch.enable_grad:
        return GradModeVariable(True, "enable_grad")
    mode = c[0] if c else kw.get("mode", True)
    if cls is torch.inference_mode and torch.is_inference_mode_enabled() == bool(mode) and not \
            tx.output.inference_depth:      # (every frame guards the inference mode it was traced in)
        return _InferenceModeOff(None)    # inference_mode(m) in mode m changes nothing
    if cls is torch.inference_mode:
        if not mode or tx.output.inference_depth:
            raise Unsupported("torch.inference_mode(False) inside inference mode, or nested")
        # captured as no_grad; the tensors it makes are tracked (OutputGraph.inference_made)
        return GradModeVariable(False, "inference_mode")
    if cls is torch.set_grad_enabled:
        v = GradModeVariable(c[0] if c else kw["mode"])
        v.enter(tx)
        v.called_as_function = True
        return v
    if cls in (torch.autocast, torch.amp.autocast):
        device_type = c[0] if c else kw["device_type"]
        dtype = kw.get("dtype", c[1] if len(c) > 1 else None) or torch.get_autocast_dtype(device_type)
        enabled = kw.get("enabled", c[2] if len(c) > 2 else True)
        cache = kw.get("cache_enabled", c[3] if len(c) > 3 else None)
        return AutocastVariable((device_type, dtype, enabled, cache if cache is not None else
                                 torch.is_autocast_cache_enabled()))
    return None


CONTEXT_CLASSES = (torch.no_grad, torch.enable_grad, torch.inference_mode, torch.set_grad_enabled,
                   torch.autograd.profiler.record_function, torch.autocast)
