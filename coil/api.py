"""The public entry points: :func:`compile`, :func:`reset`, :func:`disable`,
:func:`list_backends`, :func:`explain`.

``coil.compile`` has torch.compile's shape, so switching is a one-name change::

    fast = coil.compile(model)                   # nn.Module -> OptimizedModule
    fast_fn = coil.compile(fn, backend="eager")  # function -> function
    @coil.compile(fullgraph=True)
    def f(x): ...
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Union

import torch

from coil import config as _config
from coil.backends import list_backends, lookup_backend

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

_MODE_OPTIONS = {
    None: {},
    "default": {},
    "reduce-overhead": {"cudagraphs": True},
    "max-autotune": {"autotune": True, "cudagraphs": True},
    "max-autotune-no-cudagraphs": {"autotune": True},
}


def _with_options(backend: Callable, options: dict) -> Callable:
    """Wrap a backend so it compiles with ``options`` patched into coil.config."""
    if not options:
        return backend

    @functools.wraps(backend)
    def compile_with_options(gm, example_inputs):
        with _config.patch(**options):
            compiled = backend(gm, example_inputs)

        @functools.wraps(compiled)
        def run(*args):
            with _config.patch(**options):
                return compiled(*args)

        return run

    return compile_with_options


class OptimizedModule(torch.nn.Module):
    """A compiled ``nn.Module``: shares the original's parameters, buffers and
    ``state_dict`` (same keys, same tensors), forwards attribute access to it and
    follows ``train()``/``eval()``. ``_orig_mod`` is the original module."""

    def __init__(self, mod: torch.nn.Module, compiled_call: Callable):
        super().__init__()
        self._orig_mod = mod
        self._compiled_call = compiled_call

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled_call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    def state_dict(self, *args: Any, **kwargs: Any):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"


def compile(fn_or_module: Union[Callable, torch.nn.Module, None] = None, *,
            backend: Union[str, Callable] = "coil", mode: Optional[str] = None,
            dynamic: Optional[bool] = None, fullgraph: bool = False,
            options: Optional[dict] = None):
    """Compile a function or ``nn.Module`` (torch.compile's signature).

    Args:
        fn_or_module: what to compile; omitted, returns a decorator.
        backend: a registered name (``coil.list_backends()``) or a callable
            ``backend(gm, example_inputs) -> callable``.
        mode: None, "reduce-overhead" (CUDA graphs) or "max-autotune".
        dynamic: None (static, then dynamic on a shape recompile), True, False.
        fullgraph: raise :class:`coil.exc.UserError` at a graph break instead of breaking.
        options: coil.config options for this compile (``coil.config.option_names()``).

    Raises:
        ValueError: unknown ``mode``, ``backend`` or option key (the message lists
            the valid ones).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes are: {', '.join(map(repr, MODES))}")
    options = dict(options or {})
    _config.check_option_names(options)
    backend_fn = lookup_backend(backend)
    merged = {**_MODE_OPTIONS[mode], **options}
    if dynamic is not None:
        merged.setdefault("dynamic", dynamic)
    backend_fn = _with_options(backend_fn, merged)

    def wrap(target):
        from coil import capture

        compiled = capture.wrap_callable(target, backend=backend_fn, fullgraph=fullgraph,
                                         dynamic=dynamic)
        if isinstance(target, torch.nn.Module):
            return OptimizedModule(target, compiled)
        return compiled

    if fn_or_module is None:
        return wrap
    return wrap(fn_or_module)


def reset() -> None:
    """Drop every cache: compiled frames, guards, kernel caches in memory."""
    from coil import capture

    capture.reset()


def disable(fn: Callable) -> Callable:
    """Never capture ``fn`` (it and what it calls run eagerly, even inside compiled code)."""
    from coil import capture

    return capture.disable(fn)


def explain(fn: Callable, *args: Any, **kwargs: Any):
    """Capture ``fn(*args, **kwargs)`` and report graphs, graph breaks and their reasons."""
    from coil import capture

    return capture.explain(fn, *args, **kwargs)


__all__ = ["compile", "reset", "disable", "explain", "list_backends", "OptimizedModule"]
