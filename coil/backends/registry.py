"""The backend registry: name → compiler function (see :mod:`coil.backends`)."""
from __future__ import annotations

import importlib
import traceback
from typing import Callable, Optional, Union

import torch

from coil import trace
from coil.capture.meta_checks import check_graph
from coil.capture.substitutes import substitute_graph
from coil.config import check_option_names

Backend = Callable[[torch.fx.GraphModule, list], Callable]

_BACKENDS: dict[str, Backend] = {}
# Backends defined in layers that import heavy modules are loaded on first use.
_LAZY: dict[str, str] = {"aot_eager": "coil.aot.backend:aot_eager", "coil": "coil.backends.coil_backend:coil"}


def register_backend(name: str) -> Callable[[Backend], Backend]:
    """Decorator: ``@register_backend("mine") def mine(gm, example_inputs): ...``."""

    def deco(fn: Backend) -> Backend:
        _BACKENDS[name] = fn
        _LAZY.pop(name, None)
        return fn
    return deco


def list_backends() -> list[str]:
    """Names of the registered backends, sorted."""
    return sorted(set(_BACKENDS) | set(_LAZY))


def lookup_backend(backend: Union[str, Backend]) -> Backend:
    """Resolve a backend name (or pass a callable through).

    Raises ``ValueError`` listing the valid names for an unknown one."""
    if callable(backend):
        return backend
    if backend in _BACKENDS:
        return _BACKENDS[backend]
    if backend in _LAZY:
        module, attr = _LAZY[backend].split(":")
        fn = _BACKENDS[backend] = getattr(importlib.import_module(module), attr)
        return fn
    raise ValueError(f"unknown backend {backend!r}; valid backends are: {', '.join(list_backends())} "
                     "(or pass a callable backend(gm, example_inputs) -> callable)")


@register_backend("eager")
def eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Run the captured graph as it is (checkpoint regions by ``torch.utils.checkpoint``)."""
    from coil.aot.functional import run_eagerly
    return run_eagerly(gm)


@register_backend("inductor")
def inductor(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Hand the graph to torch's Inductor (for comparisons; needs torch's compiler)."""
    from torch._inductor.compile_fx import compile_fx  # allowed here: comparison backend
    return compile_fx(gm, example_inputs)


def coil_backend_entry(gm: torch.fx.GraphModule, example_inputs: list,
                       options: Optional[dict] = None, mode: Optional[str] = None) -> Callable:
    """Entry point for ``torch.compile(model, backend="coil")``; ``torch.compile``'s
    ``options=`` are coil.config options for this graph's compile and calls (ValueError
    names an unknown one), its ``mode=`` sets options as ``coil.compile``'s does.

    An exception is logged (event ``backend_failed``: the error and its traceback)
    before it propagates: torch's capture turns it into a warning and runs the graph
    eagerly, so the compile log is the only record of why nothing was compiled.

    torch's capture runs meta kernels only, so its graph first gets what coil's capture does per call: eager's argument
    checks that meta kernels skip (:func:`coil.capture.meta_checks.check_graph`) and checked substitutes
    (:func:`coil.capture.substitutes.substitute_graph`: ``F.one_hot``)."""
    if mode not in (None, "default"):
        from coil.api import _MODE_OPTIONS, MODES
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid modes are: {', '.join(map(repr, MODES))}")
        options = {**_MODE_OPTIONS[mode], **(options or {})}
    if options:
        from coil.api import _wrap_backend
        check_option_names(options)
        return _wrap_backend(coil_backend_entry, "coil", dict(options))(gm, example_inputs)
    try:
        check_graph(gm)
        substitute_graph(gm)
        return lookup_backend("coil")(gm, example_inputs)
    except Exception as e:
        log_backend_failure("coil", e)
        raise


def log_backend_failure(name: str, e: BaseException) -> None:
    """Log event ``backend_failed`` for backend ``name`` raising ``e`` (in an except block)."""
    trace.log("backend_failed", stage="backend", backend=name, error=f"{type(e).__name__}: {e}"[:4000],
              traceback=traceback.format_exc())
