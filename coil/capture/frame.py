"""Frame entry: the wrapper ``coil.compile`` returns, the per-code-object cache of
(guard, entry) pairs, recompiles, graph-break plans and eager fallbacks.

Calling a wrapped function binds its arguments (a generated binder with the same signature: CPython does the binding),
then tries each cache entry of the function's code object: the first whose guard returns True runs its entry. A miss
translates the frame (:func:`_translate`), compiles the graph with the backend and appends a new entry; a recompile logs
the first failing guard with old and new values. After ``config.recompile_limit`` entries for one set of module classes
among the arguments the code object runs eagerly for them (logged). Any internal error falls back to eager for that
code object (logged), or raises under ``fullgraph=True``.
"""
from __future__ import annotations

import contextlib
import dis
import functools
import gc
import inspect
import itertools
import operator
import sys
import threading
import time
import traceback
import types
import warnings
import weakref
from typing import Any, Callable, Optional

import torch
import torch.fx
from torch.nn.modules import module as _mm
from torch.amp.autocast_mode import _exit_autocast

from coil import config as _config
from coil import trace
from coil.exc import (OPTIMIZER_TODO, BackendCompilerFailed, GraphBreakInFullgraph, SourceLocation, Unsupported,
                      UserError, warn_user)
from coil.capture.output import BreakEarlier, EntryCodegen, OutputGraph, collect_tensors
from coil.capture.inspection import frame_result_ok, is_frame_function
from coil.capture.resume import label as _label, origin
from coil.capture.resume import make_call_stub, make_resume_function
from coil.capture.source import ClosureSource, LocalSource
from coil.capture.translator import (_GLOBAL_HOOKS, _MODULE_HOOKS, SKIP_MODULES, InstructionTranslator,
                                     BreakInfo, RestartAnalysis, instructions_of)
from coil.capture.variables.base import AttributeMissing, ConstantVariable, NullVariable
from coil.capture.variables.builder import wrap
from coil.capture.variables.hops import calls_while_loop
from coil.capture.variables.symbolic import SymNodeVariable
from coil.capture.variables.tensor import InferenceTensorUse, UserCodeError, call_op, index_copy_break
from coil.capture.variables.torchfn import ForwardADFrame
from coil.capture.dynamic import (DynamicPolicy, SymbolSource, changed_dims, check_marked, is_symbolic_value, readable,
                                  shape_guards)
from coil.capture.guards import Hoister

# --- global state -------------------------------------------------------------------------

_disabled_fns: "weakref.WeakSet" = weakref.WeakSet()
_disabled_codes: "weakref.WeakSet" = weakref.WeakSet()
_caches: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_fn_wrappers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_module_wrappers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

#: Counters for tests and ``explain``: reset by :func:`reset_stats`.
stats: dict = {}
#: Graph break records: dicts with reason, user_stack, code name.
break_log: list = []
_listeners: list = []


def reset_stats() -> None:
    stats.clear()
    stats.update(frames=0, graphs=0, graph_breaks=0, recompiles=0, fallbacks=0, eager_limit=0)
    break_log.clear()


reset_stats()


def is_disabled(fn) -> bool:
    try:
        return fn in _disabled_fns or getattr(fn, "__code__", None) in _disabled_codes
    except TypeError:
        return False


def disable(fn):
    """Never capture ``fn``: calls to it run eagerly, and inside captured code they are graph breaks."""
    with contextlib.suppress(TypeError):
        _disabled_fns.add(fn)
        if hasattr(fn, "__code__"):
            _disabled_codes.add(fn.__code__)
    return fn


#: code objects whose optimizer-step graph break was warned about
_optimizer_warned: set = set()
#: Bumped by :func:`reset`: a wrapper's remembered FrameCache is stale once it changes.
_generation = [0]


def reset() -> None:
    """Drop every compiled frame and wrapper cache."""
    _generation[0] += 1
    _caches.clear()
    _fn_wrappers.clear()
    _module_wrappers.clear()
    _optimizer_warned.clear()
    reset_stats()


class CaptureConfig:
    """What a wrapper compiles with: backend, fullgraph, dynamic (``None``: automatic dynamic, ``True``: every
    input dim symbolic, ``False``: only marked dims; docs/dynamic_shapes.md)."""

    def __init__(self, backend: Callable, fullgraph: bool, dynamic, options=None):
        self.backend, self.fullgraph = backend, fullgraph
        self.backend_name = getattr(backend, "__name__", str(backend))
        opts = options or {}
        cfg = _config.config
        # coil.compile's argument, else options={"dynamic": ...}, else coil.config / COIL_DYNAMIC
        self.dynamic = dynamic if dynamic is not None else opts.get("dynamic", cfg.dynamic)
        #: unbacked symbols for .item() / data-dependent output sizes (else graph breaks)
        self.scalar_outputs = bool(opts.get("capture_scalar_outputs", cfg.capture_scalar_outputs))
        self.dynamic_output_shapes = bool(opts.get("capture_dynamic_output_shape_ops",
                                                   cfg.capture_dynamic_output_shape_ops))
        #: entries per code object before it runs eagerly, when ``options`` set it
        #: (else coil.config's at the time of the miss)
        self.recompile_limit = opts.get("recompile_limit")


class CacheEntry:
    __slots__ = ("guard", "entry", "guards", "guard_src", "argnames", "config", "input_shapes", "input_scalars",
                 "module_key")

    def __init__(self, guard, entry, guards, guard_src, argnames, config, input_shapes=None, input_scalars=None):
        self.guard, self.entry, self.guards, self.guard_src = guard, entry, guards, guard_src
        self.argnames, self.config = argnames, config
        #: source expression -> shape of each tensor input at compile time (automatic dynamic)
        self.input_shapes = input_shapes or {}
        #: source expression -> Python int/float the frame read (automatic dynamic)
        self.input_scalars = input_scalars or {}
        #: the classes of the call's nn.Module arguments (the recompile limit counts entries per class)
        self.module_key: tuple = ()


class FrameCache:
    """Everything compiled for one code object."""

    def __init__(self):
        self.entries: list[CacheEntry] = []
        self.eager_reason: Optional[str] = None
        #: the module classes (of a call's nn.Module arguments) whose calls reached the recompile limit
        self.eager_keys: set = set()
        self.frame_id = trace.next_frame_id()
        self.attempts = 0
        #: source expression -> dims seen with more than one size (automatic dynamic)
        self.auto_dynamic: dict = {}


# --- binding arguments --------------------------------------------------------------------


def _argnames(code: types.CodeType) -> list[str]:
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    return list(code.co_varnames[:n])


class _Named:
    """A default value that a signature's text shows as the name ``name`` (:func:`make_binder`'s source)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


def make_binder(fn: types.FunctionType):
    """A function with ``fn``'s signature returning the frame's arguments as a tuple
    in ``co_varnames`` order (CPython does the binding, at C speed)."""
    code = fn.__code__
    defaults, kwdefaults = fn.__defaults__ or (), fn.__kwdefaults__ or {}
    ns: dict[str, Any] = {f"___d{i}": v for i, v in enumerate(defaults)}
    ns.update({f"___kd_{k}": v for k, v in kwdefaults.items()})
    # ``code``'s own parameters (not a ``__signature__`` or ``__wrapped__`` of ``fn``), each default shown by its name
    proto = types.FunctionType(code, {}, None, tuple(_Named(f"___d{i}") for i in range(len(defaults))), fn.__closure__)
    proto.__kwdefaults__ = {k: _Named(f"___kd_{k}") for k in kwdefaults}
    body = "(" + "".join(n + ", " for n in _argnames(code)) + ")"
    exec(compile(f"def ___bind{inspect.signature(proto)}:\n    return {body}\n", "<coil binder>", "exec"), ns)
    ns["___bind"].__kwdefaults__ = fn.__kwdefaults__   # the same dict: edits to it are seen
    return ns["___bind"]


# --- the wrapper --------------------------------------------------------------------------


#: co_flags of generators, coroutines and async generators (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x200


def wrap_function(fn: types.FunctionType, cfg: CaptureConfig):
    """The capturing wrapper of a Python function (see module docstring)."""
    if (code := fn.__code__).co_flags & _GENERATOR_FLAGS:
        return fn  # generators and coroutines run eagerly
    if not all(n.isidentifier() for n in _argnames(code)):
        return fn  # 3.11 comprehension frames (argument ``.0``) run eagerly
    binder = [make_binder(fn), fn.__defaults__, fn.__kwdefaults__]
    # this code object's FrameCache and the reset generation it was read in: a
    # WeakKeyDictionary lookup per call costs about 0.5 µs
    known = [None, -1]
    generation = _generation

    def coil_wrapper(*args, **kwargs):
        if fn.__defaults__ is not binder[1] or fn.__kwdefaults__ is not binder[2]:
            binder[:] = make_binder(fn), fn.__defaults__, fn.__kwdefaults__   # reassigned defaults
        try:
            bound = binder[0](*args, **kwargs)
        except TypeError:
            bound = None
        if bound is None:          # outside the except: no __context__ leaks into the error
            return fn(*args, **kwargs)
        if (cache := known[0]) is None or known[1] != generation[0]:
            cache = _caches.get(code)
            known[0], known[1] = cache, generation[0]
        if cache is not None:
            if cache.eager_reason is not None:
                return fn(*args, **kwargs)
            if (e := _find_entry(cache, cfg, bound, fn)) is not None:
                return e.entry(*bound, fn)
        return _miss(fn, code, cfg, bound, args, kwargs)
    coil_wrapper.__wrapped__, coil_wrapper._coil_compiled = fn, True
    coil_wrapper.__name__ = getattr(fn, "__name__", "coil_wrapper")
    coil_wrapper.__qualname__ = getattr(fn, "__qualname__", "coil_wrapper")
    coil_wrapper.__doc__ = fn.__doc__
    return coil_wrapper


_peek_functorch = torch._C._functorch.peek_interpreter_stack
_functorch_warned: list = []


def _under_functorch(fn, args, kwargs, what="a torch.func transform (vmap, grad, jvp)",
                     todo="coil does not capture torch.func transforms (coil.compile(torch.vmap(f)) runs eagerly "
                          "too); compile f with the batch dim in its tensors, or torch.autograd.grad for grad"):
    """A compiled function called inside a torch.func transform (``vmap(compiled)``, ``grad(compiled)``): the
    transform's wrapped tensors cannot be captured, so the call runs eagerly, warning once, logging ``functorch_eager``.
    Also a call under a user's TorchFunctionMode (capture does not run its ``__torch_function__``)."""
    if what not in _functorch_warned:
        _functorch_warned.append(what)
        trace.log("functorch_eager", stage="capture", frame=_label(fn.__code__), reason=f"called inside {what}")
        warn_user(f"coil: {_label(fn.__code__)} was called inside {what}; coil cannot capture it, so such calls "
                  f"run eagerly. What to do: {todo}.")
    return fn(*args, **kwargs)


def _user_function_mode() -> bool:
    """A TorchFunctionMode other than ``with torch.device(d)``'s is active."""
    from torch.utils._device import DeviceContext
    return any(not isinstance(m, DeviceContext) for m in torch.overrides._get_current_function_mode_stack())


def _module_call_code(mod: torch.nn.Module) -> types.CodeType:
    def forward_call(self, *args, **kwargs):
        return self(*args, **kwargs)
    cls = type(mod)      # (co_qualname: warnings name the user's Outer.forward)
    attr = "__call__" if cls.__call__ is not torch.nn.Module.__call__ else "forward"
    return forward_call.__code__.replace(co_name=f"{cls.__name__}_call_{id(mod):x}",
                                         co_qualname=f"{cls.__qualname__}.{attr}")


def wrap_module(mod: torch.nn.Module, cfg: CaptureConfig):
    """Capture ``mod(*args, **kwargs)`` as one frame whose local ``self`` is the module:
    hooks and ``forward`` are inlined, parameters and buffers are graph inputs."""
    code = _module_call_code(mod)
    fn = types.FunctionType(code, {"__name__": "coil.capture.frame"}, code.co_name)
    # the compile log shows the module's forward as this frame's source (the frame
    # itself is the generated ``self(*args, **kwargs)``)
    cls, attr = type(mod), code.co_qualname.rsplit(".", 1)[1]   # forward, or an overridden __call__ (which runs)
    fn._coil_source_of = (cls.__name__, attr, getattr(cls, attr))
    inner = wrap_function(fn, cfg)
    mod_ref = weakref.ref(mod)

    def coil_module_wrapper(*args, **kwargs):
        return inner(mod_ref(), *args, **kwargs)
    coil_module_wrapper._coil_code = code  # keeps the cache alive as long as the wrapper
    coil_module_wrapper._coil_fn = fn
    return coil_module_wrapper


def capture_callable(fn, cfg: CaptureConfig, library: bool = False):
    """Wrapper for a callee of a graph break: Python functions, bound methods and modules are captured on their own;
    anything else is returned unchanged. A function of a skipped module (:func:`_skipped_module`) is returned unchanged
    too, unless ``library`` (a torch.nn forward, a resume function of one of torch's frames)."""
    if isinstance(fn, types.FunctionType) and not is_disabled(fn):
        if fn.__code__.co_flags & _GENERATOR_FLAGS:
            return fn
        if not library and _skipped_module(fn) and fn.__code__ not in _CONTEXT_DECORATORS:
            return fn          # library code the translator never traces (logging, copy...)
        return _wrapped_function(fn, cfg)
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        inner = capture_callable(fn.__func__, cfg)
        return fn if inner is fn.__func__ else types.MethodType(inner, fn.__self__)
    if isinstance(fn, torch.nn.Module) and type(fn).__call__ is torch.nn.Module.__call__:
        return functools.partial(_call_module_captured, fn, cfg)
    if type(fn) is functools.partial and (inner := capture_callable(fn.func, cfg)) is not fn.func:
        return functools.partial(inner, *fn.args, **fn.keywords)   # (a user function's partial: the function)
    return fn


#: the wrappers of ``@torch.no_grad()`` (enable_grad, inference_mode...) and ``@torch.autocast(...)``: captured at a
#: break like user code, so that the function they decorate is too (transformers' ``generate()``)
_CONTEXT_DECORATORS = (torch.no_grad()(lambda: None).__code__, torch.autocast("cpu")(lambda: None).__code__)


def _wrapped_function(fn, cfg: CaptureConfig):
    per = _fn_wrappers.setdefault(fn, {})
    if (w := per.get(id(cfg))) is None:
        w = per[id(cfg)] = wrap_function(fn, cfg)
    return w


#: coil's packages whose code is a user's (models): compiled and captured at a break like any user code
USER_COIL_MODULES = ("coil.bench", "coil.testing")


def _skipped_module(fn) -> bool:
    mod = fn.__globals__.get("__name__", "") or ""
    # torch's own functions called at a break (grad-mode/autocast helpers, hooks, the optimizer's step wrapper...) run
    # as plain Python. Capturing torch.optim's step on its own frame makes graphs with no outputs (in-place parameter
    # updates), which the AOT runtime cannot run today (IndexError in its epilogue).
    return mod.split(".")[0] in SKIP_MODULES or mod.startswith("torch.") or (  # and coil's own runtime, not the
        mod.startswith("coil.") and not mod.startswith(USER_COIL_MODULES))  # models of coil's bench and tests


def _call_module_captured(mod, cfg, *args, **kwargs):
    """``mod(*args, **kwargs)`` with ``forward`` captured on its own frame (hooks, if any, make the call eager)."""
    if any(getattr(mod, h, None) for h in _MODULE_HOOKS) or any(getattr(_mm, h, None) for h in _GLOBAL_HOOKS):
        return mod(*args, **kwargs)
    if isinstance(mod, torch.jit.ScriptModule):
        return mod(*args, **kwargs)  # TorchScript runs its own graph (type(mod).forward raises AttributeError)
    forward = type(mod).forward
    if not isinstance(forward, types.FunctionType) or "forward" in mod.__dict__:
        return mod(*args, **kwargs)  # (an instance forward, m.forward = f: run as is)
    # a torch.nn module's forward (Sequential, BatchNorm2d) is captured too: it is what the module's own frame
    # inlined before the break, and skipping it as library code ran the whole module eagerly
    return capture_callable(forward, cfg, library=forward.__module__.startswith("torch.nn."))(mod, *args, **kwargs)


def _capturer(cfg):
    def ___cap(fn):
        return capture_callable(fn, cfg)
    return ___cap


# --- compiling a frame --------------------------------------------------------------------


def _find_entry(cache: "FrameCache", cfg, bound, fn):
    """The first entry of ``cache`` compiled for ``cfg`` whose guard accepts this call (raising: a miss), or None."""
    for e in cache.entries:
        if e.config is cfg:
            try:
                ok = e.guard(*bound, fn)
            except Exception:  # noqa: BLE001 - a failing access is a miss
                ok = False
            if ok:
                return e
    return None


def _miss_entry(fn, code, cfg, bound):
    """The cache entry to run for this call, compiled if needed (None: run ``fn`` eagerly); under ``_compile_lock``."""
    if (cache := _caches.get(code)) is None:
        cache = _caches[code] = FrameCache()
    if cache.eager_reason is not None:
        return None
    if (hit := _find_entry(cache, cfg, bound, fn)) is not None:   # compiled by another thread meanwhile
        return hit
    # the limit counts the entries compiled for this call's module classes: a decorator's wrapper (transformers'
    # deprecate_kwarg) or a loop's resume frame shared by modules of many classes is one entry per class, not a
    # recompile (as torch.compile counts only entries whose ID_MATCH-ed objects are this call's); all classes
    # together stop at 8 times the limit
    key = tuple(type(a) for a in itertools.chain.from_iterable(a if type(a) is tuple else (a,) for a in bound)
                if isinstance(a, torch.nn.Module))  # (a *args tuple: its items)
    if key in cache.eager_keys:
        return None
    ours = [e for e in cache.entries if e.config is cfg]
    mine = [e for e in ours if e.module_key == key]
    limit = cfg.recompile_limit if cfg.recompile_limit is not None else _config.config.recompile_limit
    if len(mine) >= limit or len(ours) >= 8 * limit:
        old = (mine or ours)[-1]
        fails = old.guards.failures(old.argnames, tuple(bound) + (fn,), limit=4)
        last = fails[0]["text"] if fails else "unknown"
        reason = f"recompile limit ({limit}) reached for {_user_name(fn, code)}"
        if all(e.module_key == key for e in ours):  # (one class: every call runs eagerly, without trying guards)
            cache.eager_reason = reason
        else:
            cache.eager_keys.add(key)
            reason += f" called with {', '.join(t.__name__ for t in key)}"
        stats["eager_limit"] += 1
        trace.log("recompile_limit", stage="capture", frame=_label(code), reason=reason, failed_guards=fails)
        warn_user(f"coil: {reason}; it runs eagerly from now on. Last failed guard: {last}")
        if _config.config.verbose:
            print(f"coil: {reason}; running it eagerly from now on")
        return None
    cache.attempts += 1
    with trace.compile_context(cache.frame_id, cache.attempts - 1):
        if mine:
            stats["recompiles"] += 1
            old = mine[-1]
            fails = old.guards.failures(old.argnames, tuple(bound) + (fn,))
            reason = fails[0]["text"] if fails else None
            trace.log("recompile", stage="capture", frame=_label(code), reason=reason, failed_guards=fails)
            if cfg.dynamic is not False:   # (dynamic=True too: a module's int attribute, a buffer's size)
                _note_changed_sizes(cache, old, bound, fn)
            if _config.config.verbose:
                print(f"coil: recompiling {_label(code)}: {reason}")
        from coil.aot.compile import saved_tensors_hooks_aside
        try:
            with trace.stage("capture", frame=_label(code)), saved_tensors_hooks_aside():
                entry = _translate(fn, code, cfg, bound, cache.auto_dynamic)
        except (UserError, BackendCompilerFailed):
            raise
        except Exception as e:  # noqa: BLE001 - internal error or user error: run eagerly
            if cfg.fullgraph and not isinstance(e, UserCodeError) or _config.config.strict_capture and \
                    not isinstance(e, (Unsupported, ForwardADFrame, InferenceTensorUse, AttributeMissing)):
                raise
            reason = f"{type(e).__name__}: {e}"
            stats["fallbacks"] += 1
            trace.log("capture_fallback", stage="capture", frame=_label(code), reason=reason,
                      traceback=traceback.format_exc())
            if _config.config.verbose:
                print(f"coil: running {_label(code)} eagerly: {reason}")
            loc = e.location if isinstance(e, Unsupported) else getattr(e, "coil_location", None)
            warn_user(f"coil: could not capture {_user_name(fn, code, loc)}; it runs eagerly, uncompiled: "
                      f"{reason[:300]}")
            cache.eager_reason = reason
            entry = None
            for listener in _listeners:
                listener("eager", _user_name(fn, code, loc), reason)
    if entry is not None:
        entry.module_key = key
        cache.entries.append(entry)
    return entry


#: Held while a frame is compiled: torch.fx's tracer (make_fx) is not thread-safe, and concurrent first calls
#: of one function from several threads raised inside it. The compiled or eager code itself runs outside the
#: lock. Re-entrant: compiling may run nested compiled frames on the same thread.
_compile_lock = threading.RLock()


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic GC off while a frame compiles (unless it is off already). A compile allocates millions
    of objects, and each full collection they triggered walked the whole heap: ~10 of them were 1-2 s of a
    12-layer GPT-2 training step's 12 s compile. The compile's cyclic garbage is collected after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _miss(fn, code, cfg, bound, args, kwargs):
    """A cache miss: compile (one thread at a time) and run this call."""
    if _peek_functorch() is not None:  # under vmap / grad / jvp: the guards refused its wrapped tensors
        return _under_functorch(fn, args, kwargs)
    if torch._C._is_torch_function_mode_enabled() and _user_function_mode():
        return _under_functorch(fn, args, kwargs, "a TorchFunctionMode", "leave the mode out of the compiled call")
    with _compile_lock, _gc_paused():
        entry = _miss_entry(fn, code, cfg, bound)
    if entry is None:
        # outside the except block: user code must not see coil's exception as sys.exc_info() or its raises' __context__
        return fn(*args, **kwargs)
    return entry.entry(*bound, fn)


def _user_name(fn, code, loc=None) -> str:
    """``Outer.forward (m.py:7)``: the user's function (a module's, not coil's generated call frame) and ``loc`` (where
    capture stopped), else its first line."""
    root = origin(code)
    first = getattr(getattr(fn, "_coil_source_of", (0, 0, None))[2], "__code__", root)
    return f"{root.co_qualname} (" + (f"capture stopped at {loc.filename}:{loc.lineno})" if loc else
                                      f"{first.co_filename}:{first.co_firstlineno})")


def _note_changed_sizes(cache: FrameCache, old: CacheEntry, bound, fn) -> None:
    """Automatic dynamic: note tensor input dims resized since ``old``'s compile (symbolic in the next translation)."""
    ns = dict(old.guards.ns)
    ns.update(zip(list(old.argnames) + ["___f"], tuple(bound) + (fn,)))
    values = {}
    for expr in old.input_shapes:   # unreadable now (a float turned tensor: no torch warning either): not a size change
        with contextlib.suppress(Exception), warnings.catch_warnings(action="ignore"):
            values[expr] = eval(expr, ns)
    for expr, dims in changed_dims(old.input_shapes, values).items():
        cache.auto_dynamic.setdefault(expr, set()).update(dims)
    for expr, value in old.input_scalars.items():     # Python ints/floats that changed
        try:
            new = eval(expr, ns)
        except Exception:  # noqa: BLE001
            continue
        if type(new) is type(value) and new != value:
            cache.auto_dynamic.setdefault(expr, set()).add("value")


def _translate(fn, code, cfg, bound, auto_dynamic=None) -> CacheEntry:
    stats["frames"] += 1
    argnames = _argnames(code)
    trace.artifact("capture_source", lambda: _source_of(fn), kind="python", frame=_label(code))
    trace.artifact("capture_bytecode", lambda: dis.Bytecode(code).dis(), kind="text", frame=_label(code))
    break_at: dict = {}
    for _ in range(64):
        output = OutputGraph(fn.__globals__, argnames, cfg.scalar_outputs, cfg.dynamic_output_shapes)
        output.dynamic = DynamicPolicy(cfg.dynamic, auto_dynamic)
        output.guards.add("___f.__globals__ is ___G")
        cells = {}
        tx = InstructionTranslator(code, fn.__globals__, output, {}, cells, break_at, cfg.fullgraph)
        if fn.__closure__:
            for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__)):
                tx.cells[name] = output.sourced_cell(cell, ClosureSource(i))
        try:
            for name, value in zip(argnames, bound):
                tx.locals[name] = wrap(tx, value, LocalSource(name))
            tx.run()
        except RestartAnalysis:
            continue
        except Unsupported as e:
            if cfg.fullgraph and not isinstance(e, UserCodeError):
                raise GraphBreakInFullgraph(
                    f"graph break under fullgraph=True: {e.reason}", e.location or tx.location(),
                    hint=(f"without fullgraph=True, {e.hint}. " if e.hint else "")
                    + "Remove the construct, or use fullgraph=False") from e
            raise
        finally:
            output.restore_global_state()
        logged = len(break_log)
        try:
            return _build_entry(tx, output, cfg, fn, code, argnames)
        except BreakEarlier as e:    # (a draw from random guarded after the trace; a Function's ctx-kept dict)
            if cfg.fullgraph:
                raise GraphBreakInFullgraph(f"graph break under fullgraph=True: {e.exc.reason}", None) from None
            stats["graph_breaks"] -= len(break_log) - logged    # (that attempt's break is not taken)
            del break_log[logged:]
            break_at[e.offset] = BreakInfo(e.offset, e.exc.reason, e.stack, e.exc)
    raise Unsupported("too many graph-break restarts")


def _source_of(fn) -> str:
    name, attr, target = getattr(fn, "_coil_source_of", None) or (None, None, fn)   # (a module's call: wrap_module)
    head = "" if name is None else f"# {name}.__call__: hooks, then {name}.forward:\n" if attr == "forward" \
        else f"# {name}.__call__ (overridden):\n"
    try:
        return head + inspect.getsource(target)
    except (OSError, TypeError):
        return f"<source unavailable for {f'{name}.{attr}' if name else fn.__code__.co_name}>"


def _in_exception_block(code, offset: int) -> bool:
    try:
        table = dis._parse_exception_table(code)
    except Exception:  # noqa: BLE001
        return False
    for e in table:
        if e.start <= offset < e.end:
            if _is_comprehension_cleanup(code, e.target):
                # py3.12: the handler only restores the names an inlined comprehension shadowed and re-raises;
                # the break is in a user block only if the handler itself is.
                return _in_exception_block(code, e.target)
            return True
    return False


def _is_comprehension_cleanup(code, target: int) -> bool:
    """3.12 (PEP 709): is the handler at ``target`` an inlined comprehension's cleanup
    (``SWAP``/``POP_TOP``/``STORE_FAST`` only, then ``RERAISE``)? Such a handler restores locals that die with the
    exception anyway, so breaking the graph inside the comprehension is safe. https://peps.python.org/pep-0709/"""
    if sys.version_info[:2] < (3, 12):
        return False
    for inst in dis.get_instructions(code):
        if inst.offset < target:
            continue
        if inst.opname == "RERAISE":
            return inst.offset > target
        if inst.opname not in ("SWAP", "POP_TOP", "STORE_FAST"):
            return False
    return False


def _forwards_call(tx, output: OutputGraph, code, inst, cfg) -> bool:
    """Does the frame break at a call whose result it returns at once (``return f(*args, **kwargs)``), having recorded
    no graph op and no side effect before it, to a callee captured on its own frame? (Library code, a builtin or a
    generator runs eagerly: a break to report, ``coil.compile(torch.func.vmap(f))``, trial 78 #6.)"""
    if inst.opname not in ("CALL", "CALL_FUNCTION_EX") or output.count_calls() or \
            output.side_effects.order or _in_exception_block(code, inst.offset):
        return False
    if not (after := tx.instructions[tx.offset_to_index[inst.offset] + 1:]) or after[0].opname != "RETURN_VALUE":
        return False
    items = tx.stack[-(inst.arg + 2):] if inst.opname == "CALL" else [None, tx.stack[-2 - (inst.arg & 1)]]
    callee = items[1] if items[0] is None or isinstance(items[0], NullVariable) else items[0]
    value = getattr(callee, "fn", None) or getattr(callee, "value", None)
    return value is not None and capture_callable(value, cfg) is not value


def _build_entry(tx, output: OutputGraph, cfg: CaptureConfig, fn, code, argnames) -> CacheEntry:
    from coil.capture.opcodes import split_call
    kind = tx.result[0]
    se = output.side_effects
    plan = None
    if kind == "return":
        values = [tx.result[1]] + se.values()
    else:
        info, inst = tx.result[1], tx.result[2]
        rec = {"reason": info.reason, "user_stack": info.stack, "frame": _label(code), "offset": info.offset}
        if getattr(info.exc, "optimizer_step", False) and code not in _optimizer_warned:
            _optimizer_warned.add(code)     # (as coil.compile(opt.step) warns; the call runs eagerly from a stub)
            trace.log("eager_fallback", stage="capture", frame=_label(code), reason=info.reason)
            loc = info.exc.location
            warnings.warn_explicit(f"coil: {info.reason}; {OPTIMIZER_TODO}", UserWarning, loc.filename, loc.lineno)
        if _forwards_call(tx, output, code, inst, cfg):
            # the frame's own code made no graph and mutated nothing, and returns what the
            # breaking call returns: nothing is split (the callee is captured on its own
            # frame), so this is no graph break (a module's call frame, a decorator's wrapper)
            trace.log("forwarded_call", stage="capture", **rec)
        else:
            stats["graph_breaks"] += 1
            break_log.append(rec)
            trace.log("graph_break", stage="capture", **rec)
            if _config.config.verbose:
                print(f"coil: graph break in {_label(code)}: {info.reason}\n  " + "\n  ".join(info.stack))
        if tx.exc_stack:
            # inside an except block of an exception raised and caught symbolically: the
            # handler's rest would see no real exception (sys.exc_info(), bare raise)
            raise Unsupported("graph break inside an except block of an exception caught "
                              "in traced code: the frame runs eagerly")
        in_block = _in_exception_block(code, inst.offset)
        index = tx.offset_to_index[inst.offset]
        if (name := inst.opname) in ("CALL", "CALL_FUNCTION_EX"):
            full_stack = list(tx.stack)
            if name == "CALL":
                call_fn, call_args, call_kwargs = split_call(tx, inst.arg)
                star = None
            else:
                kwv = tx.pop() if inst.arg & 1 else None
                argv = tx.pop()
                call_fn = tx.pop()
                if tx.stack and isinstance(tx.stack[-1], NullVariable):
                    tx.pop()
                call_args, call_kwargs, star = None, None, (argv, kwv)
            # a frame-inspecting call inside an inlined callee: run the callee as plain
            # Python from the call stub, so its view of the calling frame is exact
            direct = bool(getattr(info.exc, "frame_inspection", False))
            target = getattr(call_fn, "fn", None)
            if is_frame_function(target):
                ok, why = frame_result_ok(tx.instructions, index, target, call_args or [], call_kwargs or {})
                if not ok:
                    raise FrameInspectionFallback(
                        f"frame inspection at {code.co_filename}:{_line_of(inst)}: {why}; the frame runs eagerly")
            plan = ("call", index + 1, call_fn, call_args, call_kwargs, star, direct, _line_of(inst))
            if in_block:
                # inside try/with: the call must run under the frame's exception table
                start = index
                while start > 0 and tx.instructions[start - 1].opname in ("PRECALL", "KW_NAMES"):
                    start -= 1
                plan = plan + (full_stack, start, index)
        elif not in_block and (getter := _property_getter(tx, inst)) is not None:
            # the getter of a property broke: call it from a stub (captured on its own
            # frame) and resume captured after the attribute load, as for a call
            obj = tx.pop()
            if name == "LOAD_METHOD" or (name == "LOAD_ATTR" and sys.version_info >= (3, 12) and inst.arg & 1):
                tx.push(NullVariable())        # a method-style load pushes NULL, value
            plan = ("call", index + 1, ConstantVariable(getter), [obj], {}, None, False, _line_of(inst))
            trace.log("break_plan", stage="capture", frame=_label(code), offset=inst.offset,
                      plan=f"property getter {getter.__qualname__} called from the entry; "
                           "the frame resumes captured after the attribute load")
        elif name.startswith("POP_JUMP") and "NONE" not in name:
            plan = ("branch", tx.pop(), "TRUE" in name, tx.offset_to_index[inst.argval], index + 1, _line_of(inst))
        else:
            plan = ("generic", index)
        live_locals = {k: v for k, v in tx.locals.items() if not k.startswith("___stack")}
        for cname, cell in tx.cells.items():
            if cname in code.co_cellvars:
                # the cell itself: closures made before the break share it (resume.py)
                live_locals[cname] = cell
        values = list(tx.stack) + list(live_locals.values()) + se.values()
        if plan[0] == "call":
            values += [plan[2]] + list(plan[3] or []) + list((plan[4] or {}).values()) + \
                [v for v in (plan[5] or ()) if v is not None]
        elif plan[0] == "branch":
            values.append(plan[1])
    graph_outs: list = []
    data_dependent: list = []
    started: list = []
    collect_tensors(values, graph_outs, set(), data_dependent, started if plan is not None else None)
    if started:     # (found before the backend compiles a graph the next attempt would not use)
        raise started[0].break_earlier()
    live = {t.fake.untyped_storage()._cdata for t in graph_outs} if plan is not None else ()
    for c in (c for c in output.index_copies if c[0].untyped_storage()._cdata in live):
        # a copy (a view in eager), or a view / detach of it, outlives the graph: code after the break could write
        # through it. Captured again with the indexing itself a graph break (eager's view)
        raise BreakEarlier(c[1], c[2], index_copy_break(c, "the result of indexing with a 0-d integer tensor (a view in "
                                                           "eager, a copy in the graph) is live at a graph break"))
    for sym in data_dependent:  # a value of .item() or of a nonzero size leaves the graph as a 0-d tensor
        dtype = {int: torch.int64, float: torch.float64, bool: torch.bool}[sym.python_type()]
        sym.as_tensor = call_op(tx, "call_function", torch.ops.aten.scalar_tensor.default, [sym], {"dtype": dtype})
        collect_tensors([sym.as_tensor], graph_outs, {id(t.node) for t in graph_outs})
    graph = output.graph
    _balance_modes(output)
    graph.output(tuple(t.node for t in graph_outs))
    print_negative_bases_as_calls(graph)
    gm = torch.fx.GraphModule(output.root_module(), graph)
    needs_graph = bool(graph_outs) or output.count_calls() > 0
    cg = EntryCodegen(output, graph_outs)
    lines = cg.lines
    output.restore_input_layouts()  # the backend traces from the inputs as at the call
    check_marked(output.shape_env, output.dynamic, output.sites)
    if needs_graph:
        stats["graphs"] += 1
        example_inputs = [real for (_, real, _) in output.inputs]
        if calls_while_loop(gm):
            # torch's while_loop needs a fake mode with a ShapeEnv (its trip count is an
            # unbacked size): the backend gets capture's own fake inputs (hops.py)
            example_inputs = [n.meta["example_value"] for (_, _, n) in output.inputs]
        trace.artifact("captured_graph", lambda: gm.print_readable(print_output=False),
                       kind="python", frame=_label(code))
        t0 = time.perf_counter()
        try:    # (a graph that may run again eagerly, below, writes no input in place)
            with _config.patch(inplace_input_writes=False) if output.in_try else contextlib.nullcontext():
                compiled = cfg.backend(gm, example_inputs)
        except BackendCompilerFailed:  # (the backend's wrapper said it: once)
            raise
        except Exception as e:  # noqa: BLE001
            raise BackendCompilerFailed(cfg.backend_name, e) from e
        trace.log("backend_compile", stage="capture", backend=cfg.backend_name,
                  duration_ms=(time.perf_counter() - t0) * 1e3)
        cg.ns["___graph"] = compiled
        lines.append(None)   # the inputs and the call, once the guard is built (_entry_inputs)
        if output.graph.find_nodes(op="call_function", target=torch._C._set_grad_enabled):
            # outputs made under no_grad inside the graph: the backend's autograd wrapper
            # must not hand them back requiring grad (eager's requires_grad is the rule)
            if nograd := tuple(i for i, t in enumerate(graph_outs) if not t.fake.requires_grad):
                cg.ns["___detach_outs"] = _detach_outs
                lines.append(f"___o = ___detach_outs(___o, {nograd!r})")
    if output.final_grad != output.initial_grad:
        # the frame left (or broke with) a different grad mode: set it here, since a
        # backend (AOT) runs the graph's own grad-mode switches only inside the graph
        cg.ns["___set_grad"] = torch._C._set_grad_enabled
        lines.append(f"___set_grad({output.final_grad!r})")
    for ctx in output.left_open:    # outermost first
        trace.log("context_at_graph_end", stage="capture", frame=_label(code),
                  context=f"{type(ctx).__name__}{ctx.args}", entry=ctx.at_graph_end(cg))
    cg.side_effect_lines(se)
    if plan is None:
        lines.append(f"return {cg.reconstruct(tx.result[1])}")
    else:
        _emit_break(cg, tx, plan, fn, code, cfg, live_locals)
    lines[:0] = _add_shape_guards(output) + cg.early  # after the backend: guards it added count too
    guard_fn, guard_src = output.guards.build(argnames, _label(code))
    if needs_graph:
        k = lines.index(None)
        lines[k:k + 1] = call = _entry_inputs([src.expr() for (src, _, _) in output.inputs], output.guards, cg.ns)
        if output.in_try:
            # ops inside a try block: an error the graph raises (an index out of bounds, a singular matrix) must
            # reach the user's handler, so the frame runs eagerly from its start instead (no input was written yet;
            # the default generators' and the drawn random.Randoms' states are put back: the eager run draws anew)
            cg.ns.update(___set_grad=torch._C._set_grad_enabled, ___eagerly=_run_bound, ___rng=_rng_states)
            k += len(call) - 1
            lines[k:k + 1] = ["try:", f"    {lines[k]}", "except Exception:", "    ___rng(*___r)",
                              f"    ___set_grad({output.initial_grad})",
                              f"    return ___eagerly(___f, {''.join(a + ', ' for a in argnames)})"]
            lines.insert(0, f"___r = ___rng({''.join(sorted({m.rsplit('.', 1)[0] + ', ' for m, _, _ in output.draws}))})")
            trace.log("graph_in_try", stage="capture", frame=_label(code), user_line=output.in_try,
                      reason="an op inside try (or a with block that may suppress): if the graph raises, the frame reruns")
    params = ", ".join(argnames + ["___f"])
    src = f"def ___entry({params}):\n" + "".join(f"    {ln}\n" for ln in lines)
    try:
        exec(compile(src, f"<coil entry {code.co_name}>", "exec"), cg.ns)
    except SyntaxError as e:
        raise SyntaxError(f"{e}\n{src}") from None
    entry_fn = cg.ns["___entry"]
    trace.artifact("guards", guard_src, kind="python", frame=_label(code))
    trace.artifact("entry", src, kind="python", frame=_label(code))
    for listener in _listeners:     # (once the entry is built: a frame that then runs eagerly made no graph)
        if needs_graph:
            listener("graph", gm, example_inputs)
        listener("frame", code, guard_src, src)
    shapes = {src.expr(): tuple(real.shape) for (src, real, _) in output.inputs if isinstance(real, torch.Tensor)}
    return CacheEntry(guard_fn, entry_fn, output.guards, guard_src, argnames, cfg, shapes, dict(output.dynamic.scalars))


def _rng_states(*randoms):
    """The states of the default generators (CPU's; CUDA's once initialized) and of ``random.Random`` objects
    ``randoms``; called with such a tuple, puts them back."""
    if not (randoms and isinstance(randoms[0], torch.Tensor)):
        return torch.get_rng_state(), torch.cuda.is_initialized() and torch.cuda.get_rng_state_all(), \
            [(r, r.getstate()) for r in randoms]
    torch.set_rng_state(randoms[0])
    if randoms[1]:
        torch.cuda.set_rng_state_all(randoms[1])
    for r, state in randoms[2]:
        r.setstate(state)


def _run_bound(fn, *bound):
    """``fn`` run eagerly with a frame's arguments ``bound`` (in ``co_varnames`` order, as :func:`make_binder`'s)."""
    c = fn.__code__
    n, k = c.co_argcount, c.co_kwonlyargcount
    args, kwargs = list(bound[:n]), dict(zip(c.co_varnames[n:n + k], bound[n:n + k]))
    if c.co_flags & 0x04:
        args += bound[n + k]
    if c.co_flags & 0x08:
        kwargs.update(bound[-1])
    return fn(*args, **kwargs)


def _entry_inputs(exprs: list, guards, ns: dict) -> list:
    """The entry's lines reading the graph's inputs (source expressions ``exprs``) and calling it: those the fast guard
    keeps (values reached only through dicts whose version tags it watches) come from its snapshot while that holds
    for this call's root dicts (a 12-layer GPT-2 step reads ~150 parameters: ~25 µs), else through the module tree."""
    kept = {e: k for e, k in guards.kept(exprs).items() if not e.isidentifier()}
    kept, hoister, lines, walk = kept if len(kept) >= 8 else {}, Hoister("___i"), [], []
    for e in sorted(exprs, key=lambda e: e in kept):  # (stable: the others first, in order)
        hoister.hoist(e, walk if e in kept else lines, indent="")
    args = [hoister.hoist(e, [], indent="") for e in exprs]
    call = f"___o = ___graph({', '.join(args)}{',' if len(args) == 1 else ''})"
    if not kept:
        return lines + [call]
    ns["___kstate"], ns["___kpick"] = guards.state, operator.itemgetter(*kept.values())
    roots = ", ".join(f"{a}.__dict__" for a in guards.state.root_args)
    return lines + [f"___kc = ___kstate.cached({roots})", "if ___kc is None:", *("    " + ln for ln in walk),
                    "else:", f"    {', '.join(hoister.names[e] for e in kept)} = ___kpick(___kc)", call]


def _add_shape_guards(output: OutputGraph) -> list:
    """The ShapeEnv's guards over the symbolic inputs, into the frame's guard set; returns
    the entry's runtime asserts (dims marked unbacked, :func:`~coil.capture.dynamic.shape_guards`)."""
    env, drawn = output.shape_env, output.sites.drawn
    for g in env.guards if drawn else ():
        if (hit := drawn & g.expr.free_symbols):
            offset, stack = output.sites.draw_at[min(hit, key=str)]
            raise BreakEarlier(offset, stack, Unsupported(
                f"a guard on a value drawn from Python's random ({g.expr}), added after the trace",
                hint="Python draws it at a graph break"))
    at_call = {id(f): (size, stride) for f, size, stride, _ in output.layouts_at_call}  # (before x.t_(): s1 == 4)
    inputs = [(src.expr(), v) for (src, _, node) in output.inputs if not isinstance(src, SymbolSource) and (
        is_symbolic_value(v := node.meta["example_value"]) or any(map(is_symbolic_value, at_call.get(id(v), [[]])[0])))]
    inputs += output.scalar_floats
    if not inputs:
        return []
    prelude, exprs, names, checks = shape_guards(output.shape_env, inputs, output.guards.contiguous, at_call)
    output.guards.set_shape_guards(prelude, exprs, names)
    trace.log("shape_guards", stage="capture", guards=[readable(e, names) for e in exprs], runtime_asserts=checks)
    return checks


def _detach_outs(outs, idxs):
    outs = list(outs)
    for i in idxs:
        if outs[i].requires_grad:
            outs[i] = outs[i].detach()
    return outs


def print_negative_bases_as_calls(graph: torch.fx.Graph) -> bool:
    """Give ``operator.pow`` of a negative literal base the builtin ``pow`` as target: FX prints the operator as
    ``-0.5 ** a``, which Python reads as ``-(0.5 ** a)`` (s1044 #819: ``(-0.5) ** a`` gave -1 at a = 0 where a graph
    ran its code, as one that runs eagerly does); ``pow(-0.5, a)`` is the same call. Used for capture's graphs and
    for the ATen graphs run as they are (coil/aot/backend.py). Returns whether a node changed."""
    changed = False
    for n in graph.find_nodes(op="call_function", target=operator.pow):
        if n.args and type(b := n.args[0]) in (int, float) and str(b).startswith("-"):
            n.target, changed = pow, True
    return changed


def _balance_modes(output: OutputGraph) -> None:
    """Make the graph's grad-mode and autocast switches self-contained: a graph that ends in another state than it
    started (a break inside ``with no_grad()`` or ``torch.autocast``, ``set_grad_enabled(b)`` called as a function, a
    resume leaving such a block) switches back at its end, and the entry sets the final state itself (the grad mode;
    each block left open: ``at_graph_end``). AOT (coil.aot) runs the graph's switches only inside the graph and decides
    outputs' ``requires_grad`` with the graph's final mode equal to the mode it was called in."""
    setter = torch._C._set_grad_enabled
    if output.final_grad != output.initial_grad and output.graph.find_nodes(op="call_function", target=setter):
        output.graph.create_node("call_function", setter, (output.initial_grad,), {})
    for ctx in reversed(output.left_open):
        output.graph.create_node("call_function", _exit_autocast, (ctx.handle,), {})


def _property_getter(tx, inst) -> Optional[types.FunctionType]:
    """The Python getter of the property ``inst`` (an attribute load) reads from the object atop the stack, or None."""
    if inst.opname not in ("LOAD_ATTR", "LOAD_METHOD") or not tx.stack:
        return None
    obj = tx.stack[-1]
    cls = getattr(obj, "cls", None) or type(getattr(obj, "value", None))
    if not isinstance(cls, type) or cls.__getattribute__ is not object.__getattribute__:
        return None
    attr = inspect.getattr_static(cls, inst.argval, None)
    return attr.fget if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType) else None


def _emit_break(cg: EntryCodegen, tx, plan, fn, code, cfg, live_locals: dict) -> None:
    lines = cg.lines
    stack = list(tx.stack)
    local_names = tuple(live_locals)
    local_exprs = [cg.reconstruct(v) for v in live_locals.values()]

    def stack_exprs(items):
        return [cg.reconstruct(v) for v in items if not isinstance(v, NullVariable)]

    def resume(index, items, captured=True):
        rfn = make_resume_function(fn.__globals__, fn.__closure__, code, index, _nulls(items), local_names)
        for name, v in zip(local_names, live_locals.values()):
            if isinstance(v, SymNodeVariable) and tx.output.sites.drawn & v.value.node.expr.free_symbols:
                # a value drawn from random: a graph input there too, not a constant guarded per value
                if (cache := _caches.get(rfn.__code__)) is None:
                    cache = _caches[rfn.__code__] = FrameCache()
                cache.auto_dynamic[name] = {"value"}
        # (a resume function has its frame's globals: one of torch's own frames, a torch.nn forward, is
        # captured on like the user's, not skipped as library code)
        return cg.const_expr(_Holder(capture_callable(rfn, cfg, library=True) if captured else rfn)) + ".fn"
    if plan[0] == "call" and len(plan) > 8:
        _emit_trampoline(cg, tx, plan, fn, code, cfg, local_names, local_exprs, resume)
    elif plan[0] == "call":
        _, next_index, call_fn, call_args, call_kwargs, star, direct, lineno = plan
        cg.ns["___cap"] = _capturer(cfg)
        fexpr = cg.reconstruct(call_fn)
        if star is None:
            aexpr = "(" + "".join(cg.reconstruct(a) + ", " for a in call_args) + ")"
            kexpr = "{" + ", ".join(f"{k!r}: {cg.reconstruct(v)}" for k, v in call_kwargs.items()) + "}"
        else:
            aexpr = f"tuple({cg.reconstruct(star[0])})"
            kexpr = cg.reconstruct(star[1]) if star[1] is not None else "{}"
        sexprs = stack_exprs(stack)
        # the call runs in a stub frame like the user's (name, file, line, locals): see coil/capture/inspection.py
        stub = cg.const_expr(make_call_stub(code, lineno, local_names, fn.__globals__))
        callee = fexpr if direct else f"___cap({fexpr})"
        lines.append(f"___r = {stub}({callee}, {aexpr}, {kexpr}{''.join(', ' + e for e in local_exprs)})")
        rname = resume(next_index, stack + [_RESULT])
        args = sexprs + ["___r"] + local_exprs
        lines.append(f"return {rname}({', '.join(args)})")
    elif plan[0] == "branch":
        _, cond, jump_if_true, target, fallthrough, lineno = plan
        # the truth test runs in a stub frame at the user's line: an error it raises
        # (bool() of a many-element tensor) names the user's ``if``, as in eager
        stub = cg.const_expr(make_call_stub(code, lineno, (), fn.__globals__))
        cexpr = f"{stub}(___truth, ({cg.reconstruct(cond)},), {{}})"
        cg.ns["___truth"] = operator.truth
        sexprs = stack_exprs(stack)
        args = ", ".join(sexprs + local_exprs)
        t_name = resume(target, stack)
        f_name = resume(fallthrough, stack)
        first, second = (t_name, f_name) if jump_if_true else (f_name, t_name)
        lines += [f"if {cexpr}:", f"    return {first}({args})", f"return {second}({args})"]
    else:
        _, index = plan
        sexprs = stack_exprs(stack)
        after = _stack_after(tx.instructions[index], stack)
        if after is None:    # the rest of the frame runs as plain Python
            rname = resume(index, stack, captured=False)
            lines.append(f"return {rname}({', '.join(sexprs + local_exprs)})")
            return
        # a trampoline runs just the instruction (``t.requires_grad = True``, ``obj[0]`` in ``f(x=obj[0])``) as plain
        # Python and returns the captured resume function's result for the rest of the frame
        rname = resume(index + 1, after)
        null_mask = _nulls(stack)
        tramp = make_resume_function(fn.__globals__, fn.__closure__, code, index, null_mask, local_names,
                                     tail=(index, _nulls(after), set(code.co_cellvars), cg.ns[rname.split(".")[0]].fn,
                                           local_names))
        lines.append(f"return {cg.const_expr(tramp)}({', '.join(sexprs + local_exprs)})")


#: instructions a graph break may run alone (no jump, no NULL pushed): opname -> (pops, pushes)
_ONE_INSTRUCTION = {"STORE_ATTR": (2, 0), "DELETE_ATTR": (1, 0), "STORE_SUBSCR": (3, 0), "DELETE_SUBSCR": (2, 0),
                    "STORE_GLOBAL": (1, 0), "BINARY_SUBSCR": (2, 1), "BINARY_OP": (2, 1), "COMPARE_OP": (2, 1),
                    "IS_OP": (2, 1), "CONTAINS_OP": (2, 1), "UNARY_NEGATIVE": (1, 1), "UNARY_NOT": (1, 1),
                    "UNARY_INVERT": (1, 1), "STORE_SLICE": (4, 0), "BINARY_SLICE": (3, 1), "BEFORE_WITH": (1, 2),
                    "IMPORT_NAME": (2, 1)}


def _nulls(items) -> tuple:
    """Which stack items are a pending call's NULL (a resume function's ``null_mask``, a trampoline's tail)."""
    return tuple(isinstance(v, NullVariable) for v in items)


def _stack_after(inst, stack: list):
    """The stack after ``inst`` (its pushes as None) if a trampoline can run it alone; else None."""
    if inst.opname == "LOAD_ATTR" and not (sys.version_info >= (3, 12) and inst.arg & 1):
        pops, pushes = 1, 1
    elif inst.opname == "UNPACK_SEQUENCE":
        pops, pushes = 1, inst.arg
    elif inst.opname in _ONE_INSTRUCTION:
        pops, pushes = _ONE_INSTRUCTION[inst.opname]
    else:
        return None
    return stack[:len(stack) - pops] + [None] * pushes if len(stack) >= pops else None


def _emit_trampoline(cg, tx, plan, fn, code, cfg, local_names, local_exprs, resume) -> None:
    """A graph-break call inside a ``try``/``with`` block: the entry returns ``trampoline(*stack, *locals)``, a
    resume-style function that runs the call under the frame's own exception table and then returns the captured resume
    function's result for the rest (``coil/capture/resume.py``, ``make_resume_code(tail=...)``)."""
    (_, next_index, call_fn, call_args, _kw, star, direct, _line, full_stack, start, call_index) = plan
    below = list(tx.stack)
    rname = resume(next_index, below + [_RESULT])      # "<holder>.fn"
    next_fn = cg.ns[rname.split(".")[0]].fn
    tramp = make_resume_function(fn.__globals__, fn.__closure__, code, start, _nulls(full_stack), local_names,
                                 tail=(call_index, _nulls(below + [_RESULT]), set(code.co_cellvars), next_fn,
                                       local_names))
    # the callee is captured on its own frame unless it inspects frames
    n_call = len(full_stack) - len(below)
    exprs = []
    for pos, v in enumerate(full_stack):
        if isinstance(v, NullVariable):
            continue
        e = cg.reconstruct(v)
        is_callee = pos == len(below) + (1 if isinstance(full_stack[len(below)], NullVariable) else 0)
        if is_callee and not direct and n_call > 0:
            cg.ns["___cap"] = _capturer(cfg)
            e = f"___cap({e})"
        exprs.append(e)
    cg.lines.append(f"return {cg.const_expr(tramp)}({', '.join(exprs + local_exprs)})")


def _line_of(inst):
    line = inst.positions.lineno if inst.positions is not None else None
    return line if line is not None else inst.starts_line


class FrameInspectionFallback(Unsupported):
    """Frame inspection whose result a call stub cannot answer exactly: the frame runs
    eagerly (never a stale frame value)."""


class _Holder:
    """Holds a resume function for the entry's namespace (a stable attribute load)."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


_RESULT = object.__new__(type("ResultSlot", (), {}))
__all__ = ["wrap_function", "wrap_module", "disable", "reset", "stats", "CaptureConfig",
           "SourceLocation", "instructions_of"]
