"""The public entry points: :func:`compile`, :func:`reset`, :func:`disable`, :func:`list_backends`, :func:`explain`.

``coil.compile`` has torch.compile's shape, so switching is a one-name change::

    fast = coil.compile(model)                   # nn.Module -> OptimizedModule
    fast_fn = coil.compile(fn, backend="eager")  # function -> function
    @coil.compile(fullgraph=True)
    def f(x): ...
"""
from __future__ import annotations

import copy
import functools
import pickle
import warnings
from typing import Any, Callable, Optional, Union

import torch

from coil import capture, config as _config
from coil import trace
from coil.backends import list_backends, lookup_backend
from coil.backends.registry import log_backend_failure
from coil.exc import OPTIMIZER_TODO, BackendCompilerFailed, UserError, optimizer_not_compiled, warn_user

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

_MODE_OPTIONS = {
    None: {},
    "default": {},
    "reduce-overhead": {"cudagraphs": True},
    "max-autotune": {"autotune": True, "cudagraphs": True},
    "max-autotune-no-cudagraphs": {"autotune": True},
}


def _wrap_backend(backend: Callable, name: str, options: dict) -> Callable:
    """The backend as capture calls it: compiles with ``options`` patched into coil.config, times itself as
    compile-log stage ``backend`` (with event ``config``: the options in force), and turns an exception raised
    by the backend into :class:`coil.exc.BackendCompilerFailed` naming it (``.inner`` is the original).
    :class:`coil.exc.UserError` and ``BackendCompilerFailed`` pass through unchanged."""

    @functools.wraps(backend)
    def compile_graph(gm, example_inputs):
        with _config.patch(**options), trace.stage("backend", backend=name):
            if trace.enabled():
                trace.log("config", backend=name, options=_config.config.as_dict())
            try:
                compiled = backend(gm, example_inputs)
            except (UserError, BackendCompilerFailed):
                raise
            except Exception as e:
                log_backend_failure(name, e)
                raise BackendCompilerFailed(name, e) from e
        if not options:
            return compiled
        patched = _config.patch(**options)

        @functools.wraps(compiled)
        def run(*args):
            with patched:
                return compiled(*args)
        return run
    return compile_graph


#: OptimizedModule's own attributes; others are set on (and deleted from) the original module
_OWN_ATTRIBUTES = frozenset({"_orig_mod", "_compiled_call", "_rewrap", "_compile_args"})


_WARNED_METHODS: set = set()


def _warn_uncompiled_method(cls: type, name: str) -> None:
    """Once per (class, method): a method of the original module reached through the compiled wrapper (HF's
    ``compiled.generate(...)``) runs the original's code, whose ``self(...)`` calls are not compiled."""
    if (cls, name) in _WARNED_METHODS:
        return
    _WARNED_METHODS.add((cls, name))
    trace.log("uncompiled_method", stage="api", method=f"{cls.__name__}.{name}")
    warnings.warn(f"coil: {cls.__name__}.{name} is a method of the original module and runs its code as written: a "
                  f"call of the model inside it (self(...), the forward calls of Hugging Face's generate) is not "
                  f"compiled. To compile those calls, compile the forward in place: model.forward = "
                  f"coil.compile(model.forward, ...), then call model.{name}(...).", stacklevel=3)


class OptimizedModule(torch.nn.Module):
    """A compiled ``nn.Module``.

    It shares the original's parameters, buffers and ``state_dict`` (same keys as the original, no ``_orig_mod.``
    prefix, the very same tensors, so an optimizer built on either trains both), forwards attribute reads it does not
    have, and attribute writes but its own, to the original, and follows ``train()``/``eval()``: ``training`` is the
    original's flag, set by calling ``train``/``eval`` on either object. ``_orig_mod`` is the original module.
    ``copy.deepcopy`` copies the original and compiles the copy afresh, so the copy runs its own weights."""

    def __init__(self, mod: torch.nn.Module, compiled_call: Callable,
                 rewrap: Optional[Callable[[torch.nn.Module], Callable]] = None, compile_args: Optional[dict] = None):
        super().__init__()
        self._orig_mod, self._compiled_call = mod, compiled_call
        # rewrap(module) -> compiled call: used by copy.deepcopy so that a copy
        # compiles and runs *its own* module, not the original's.
        self._rewrap = rewrap
        # coil.compile's keyword arguments: pickling compiles the loaded module with them
        self._compile_args = compile_args
        del self.__dict__["training"]  # `training` lives on the original only; reads fall through __getattr__.

    def __deepcopy__(self, memo: dict) -> "OptimizedModule":
        mod = copy.deepcopy(self._orig_mod, memo)
        if self._rewrap is None:
            raise TypeError("this OptimizedModule cannot be copied (built without rewrap); "
                            "copy the original module and compile the copy")
        return OptimizedModule(mod, self._rewrap(mod), self._rewrap, self._compile_args)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled_call(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks:
            return super().__call__(*args, **kwargs)    # (hooks registered on the wrapper)
        # global module hooks (``register_module_forward_hook``) fire for the original only, once, as in eager; the
        # wrapper's own call ran them a second time (an output hook ``o * 3`` gave ``o * 9``)
        return self._compiled_call(*args, **kwargs)

    def __reduce__(self):
        """Pickling (``pickle``, ``torch.save``) saves the original module and the ``coil.compile`` arguments;
        unpickling compiles the loaded module again (compiled code is not saved). Raises ``pickle.PicklingError`` when
        the arguments cannot be pickled (a backend given as a local function)."""
        if (args := self._compile_args) is None:
            raise pickle.PicklingError("this OptimizedModule was not built by coil.compile; "
                                       "pickle its _orig_mod and compile it after loading")
        return (_compile_unpickled, (self._orig_mod, args))

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules")
            if modules is None or "_orig_mod" not in modules:  # half-built (unpickling)
                raise
            value = getattr(modules["_orig_mod"], name)
            if getattr(value, "__self__", None) is modules["_orig_mod"] and not name.startswith("_"):
                _warn_uncompiled_method(type(modules["_orig_mod"]), name)
            return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "training":
            self._orig_mod.training = value
            return
        modules = self.__dict__.get("_modules")
        if name in _OWN_ATTRIBUTES or modules is None or "_orig_mod" not in modules or hasattr(type(self), name):
            super().__setattr__(name, value)
        else:   # (``model.scale = 2.0``: the compiled forward reads the original's attributes)
            setattr(modules["_orig_mod"], name, value)

    # a compiled Sequential / ModuleList / ModuleDict is indexed, iterated and measured as the original
    def __len__(self) -> int:
        return len(self._orig_mod)

    def __bool__(self) -> bool:
        return bool(self._orig_mod)     # (not __len__'s: a Linear has none)

    def __getitem__(self, key: Any) -> Any:
        return self._orig_mod[key]

    def __iter__(self):
        return iter(self._orig_mod)

    def __delattr__(self, name: str) -> None:
        try:
            super().__delattr__(name)
        except AttributeError:
            delattr(self._orig_mod, name)

    def train(self, mode: bool = True) -> "OptimizedModule":
        self._orig_mod.train(mode)
        return self

    # Names and state as the original reports them (no "_orig_mod." prefix).
    def state_dict(self, *args: Any, **kwargs: Any):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args: Any, **kwargs: Any):
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args: Any, **kwargs: Any):
        return self._orig_mod.named_buffers(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"


def _compile_unpickled(mod: torch.nn.Module, args: dict) -> "OptimizedModule":
    return compile(mod, **args)


def compile(fn_or_module: Union[Callable, torch.nn.Module, None] = None, *, backend: Union[str, Callable] = "coil",
            mode: Optional[str] = None, dynamic: Optional[bool] = None, fullgraph: bool = False,
            options: Optional[dict] = None, disable: bool = False, recompile_limit: Optional[int] = None,
            name: Optional[str] = None, isolate_recompiles: bool = False, shapes_spec: Any = None, **unknown: Any):
    """Compile a function or ``nn.Module`` (torch.compile's signature).

    Args:
        fn_or_module: what to compile; omitted, returns a decorator.
        backend: a registered name (``coil.list_backends()``) or a callable
            ``backend(gm, example_inputs) -> callable``.
        mode: None, "reduce-overhead" or "max-autotune". "reduce-overhead" (and
            "max-autotune") replay each compiled graph on CUDA from a CUDA graph, the
            graphs of a device sharing one memory pool (docs/cudagraphs.md).
        dynamic: None (default): compile static first, then make the sizes (and Python
            numbers) that changed symbolic on the recompile; True: every input dim and
            number argument symbolic from the first compile; False: only dims marked
            with :func:`mark_dynamic` (docs/dynamic_shapes.md).
        fullgraph: raise :class:`coil.exc.UserError` at a graph break instead of breaking.
        options: coil.config options for this compile (``coil.config.option_names()``).
        disable: True returns ``fn_or_module`` unchanged (as torch.compile).
        recompile_limit: compiles per function for this call before it runs eagerly
            (default ``coil.config.recompile_limit``).
        name, isolate_recompiles: accepted for torch.compile's sake; ignored (coil counts
            each ``coil.compile`` call's recompiles on their own already).

    Raises:
        ValueError: unknown ``mode``, ``backend``, option key or value of an enumerated
            option (``cpu_backend``, ``partitioner``; the message lists the valid ones).
        TypeError: a keyword torch.compile does not take. NotImplementedError: ``shapes_spec``."""
    if unknown:
        raise TypeError(f"coil.compile() got unknown keyword(s) {', '.join(unknown)}: it takes torch.compile's "
                        "keywords; give coil.config options as options={name: value} (coil.config.option_names())")
    if shapes_spec is not None:
        raise NotImplementedError("coil.compile(shapes_spec=...) is not supported: mark dynamic dims with "
                                  "coil.mark_dynamic(x, dim) or pass dynamic=True")
    if disable:
        return (lambda f: f) if fn_or_module is None else fn_or_module
    backend = "coil" if backend is None else backend
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes are: {', '.join(map(repr, MODES))}")
    options = dict(options or {}, **({} if recompile_limit is None else {"recompile_limit": recompile_limit}))
    _config.check_option_names(options)
    backend_fn = lookup_backend(backend)
    merged = {**_MODE_OPTIONS[mode], **options}
    if dynamic is not None:
        merged.setdefault("dynamic", dynamic)
    bname = backend if isinstance(backend, str) else (getattr(backend, "__name__", None) or type(backend).__name__)
    backend_fn = _wrap_backend(backend_fn, bname, merged)

    def wrap(target):
        def capture_it(t):
            return capture.wrap_callable(t, backend=backend_fn, fullgraph=fullgraph, dynamic=dynamic, options=merged)
        if isinstance(getattr(target, "__self__", None), torch.optim.Optimizer):
            # capture skips torch.optim's frames (docs/capture.md, "Known limitations"): say so instead of running
            # the step eagerly behind a compiled-looking wrapper
            why = optimizer_not_compiled(f"{type(target.__self__).__name__}.{target.__name__}")
            trace.log("eager_fallback", stage="capture", reason=why)
            warn_user(f"coil: {why}; {OPTIMIZER_TODO}")
            return target
        if isinstance(target, torch.nn.Module):
            return OptimizedModule(target, capture_it(target), capture_it,
                                   dict(backend=backend, mode=mode, fullgraph=fullgraph,
                                        dynamic=dynamic, options=options or None))
        return capture_it(target)
    return wrap if fn_or_module is None else wrap(fn_or_module)


from coil.capture.dynamic import mark_dynamic, mark_static, mark_unbacked  # noqa: E402


def reset() -> None:
    """Drop every cache: compiled frames, guards, kernel caches in memory, recorded CUDA graphs."""
    from coil.runtime import cudagraph_trees
    capture.reset()
    cudagraph_trees.reset()


def cudagraph_mark_step_begin() -> None:
    """Mark the start of a new iteration for ``mode="reduce-overhead"``: the next compiled call starts again
    from the roots of the CUDA graph tree, so its replays may overwrite the outputs of the previous iteration
    (reading those then raises; clone what you keep)."""
    from coil.runtime import cudagraph_trees
    cudagraph_trees.mark_step_begin()


def disable(fn: Callable) -> Callable:
    """Never capture ``fn`` (it and what it calls run eagerly, even inside compiled code)."""
    return capture.disable(fn)


def explain(fn: Callable, *args: Any, **kwargs: Any):
    """Capture ``fn(*args, **kwargs)`` and report graphs, graph breaks and their reasons."""
    return capture.explain(fn, *args, **kwargs)


__all__ = ["compile", "reset", "disable", "explain", "list_backends", "OptimizedModule", "mark_dynamic", "mark_static",
           "mark_unbacked", "cudagraph_mark_step_begin"]
