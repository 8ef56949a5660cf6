"""Capture: Python bytecode → FX graphs (Dynamo's role in coil; docs/capture.md).

In: a Python function or ``nn.Module`` and a backend (``backend(gm, example_inputs) -> callable``). Out: a wrapper that
on each call runs a cached compiled entry whose guards pass, or translates the frame again. Steps, one module each:
:mod:`.frame` (bind the arguments, look up the per-code-object cache of (guard, entry) pairs), :mod:`.translator` +
:mod:`.opcodes` (symbolic execution of CPython 3.11/3.12 bytecode over :mod:`.variables` trackers, torch calls into an
``fx.Graph`` on fake tensors), :mod:`.guards` (the checks each real value read adds, generated as one function),
:mod:`.output` (the backend call and the generated entry), :mod:`.resume` (graph breaks: the rest of the frame as a
resume function, captured in turn).

Invariant: the compiled entry is observationally the frame (outputs, mutations in order, exceptions); what capture
cannot prove is a graph break or a visible eager fallback. Public seam (used by :mod:`coil.api`): :func:`wrap_callable`,
:func:`reset`, :func:`disable`, :func:`explain`."""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Optional, Any, Callable

import torch

from coil import trace
from coil.exc import warn_user
from coil.capture.frame import (CaptureConfig, break_log, capture_callable, disable,  # noqa: F401
                                reset, reset_stats, stats, wrap_function, wrap_module)
from coil.capture import frame as _frame


def wrap_callable(fn_or_module, *, backend: Callable, fullgraph: bool = False, dynamic=None,
                  options: Optional[dict] = None):
    """Return a callable that captures ``fn_or_module`` on each call (see module docstring).

    Args:
        fn_or_module: a Python function, bound method or ``nn.Module``.
        backend: ``backend(gm, example_inputs) -> callable`` (torch.compile's contract).
        fullgraph: raise :class:`coil.exc.UserError` at a graph break.
        dynamic: None (automatic dynamic), True or False (docs/dynamic_shapes.md).
        options: coil.config options of the compile; capture reads
            ``capture_scalar_outputs`` and ``capture_dynamic_output_shape_ops``.

    A builtin or an ATen op (``torch.fmod``, ``torch.ops.aten.add``) is captured through a Python function that calls
    it, a callable object through its ``__call__``; other callables (classes, C extensions) run eagerly, with a warning
    and a ``compile_target_eager`` log entry."""
    cfg = CaptureConfig(backend, fullgraph, dynamic, options)
    if isinstance(fn_or_module, torch.nn.Module):
        return wrap_module(fn_or_module, cfg)
    if isinstance(fn_or_module, types.MethodType) and isinstance(fn_or_module.__func__, types.FunctionType):
        return types.MethodType(wrap_function(fn_or_module.__func__, cfg), fn_or_module.__self__)
    if isinstance(fn_or_module, types.FunctionType):
        return wrap_function(fn_or_module, cfg)
    if isinstance(fn_or_module, (types.BuiltinFunctionType, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        op = fn_or_module

        def call_op(*args, **kwargs):
            return op(*args, **kwargs)
        call_op.__name__ = call_op.__qualname__ = getattr(op, "__name__", "op")
        return wrap_function(call_op, cfg)
    dunder_call = getattr(type(fn_or_module), "__call__", None)
    if isinstance(dunder_call, types.FunctionType) and not isinstance(fn_or_module, type):  # a callable object
        return types.MethodType(wrap_function(dunder_call, cfg), fn_or_module)
    if callable(fn_or_module):
        what = getattr(fn_or_module, "__qualname__", type(fn_or_module).__name__)
        trace.log("compile_target_eager", stage="capture", target=what)
        warn_user(f"coil.compile: {what} is not a Python function or nn.Module; it runs eagerly "
                  "(compile a function that calls it instead)")
        return fn_or_module
    raise TypeError(f"coil.compile expects a function or nn.Module, got {type(fn_or_module).__name__}")


@dataclass
class ExplainOutput:
    """What :func:`explain` found: counts, break reasons with user stacks, graphs and guards (as Python source)."""

    graph_count: int
    graph_break_count: int
    break_reasons: list = field(default_factory=list)
    graphs: list = field(default_factory=list)
    guards: list = field(default_factory=list)
    entries: list = field(default_factory=list)
    result: Any = None
    #: (frame, reason) of each frame that runs eagerly, uncompiled (as ``coil.compile`` warns)
    eager_frames: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"Graph count: {self.graph_count}", f"Graph break count: {self.graph_break_count}"]
        for i, b in enumerate(self.break_reasons):
            lines.append(f"Break {i + 1}: {b['reason']}")
            lines.extend("    " + s for s in b["user_stack"])
        lines += [f"Runs eagerly, uncompiled: {frame}: {reason}" for frame, reason in self.eager_frames]
        for i, g in enumerate(self.graphs):
            lines += [f"--- graph {i} ---", g.code.strip()]
        return "\n".join(lines)


def explain(fn, *args, **kwargs) -> ExplainOutput:
    """Capture ``fn(*args, **kwargs)`` with a recording eager backend and report the
    graphs, graph breaks (reason and user stack), guards and the frames that run eagerly, as ``coil.compile`` would."""
    graphs, guards, entries, eager = [], [], [], []

    def backend(gm, example_inputs):
        return gm.forward

    def listener(kind, *payload):
        if kind == "graph":
            graphs.append(payload[0])
        elif kind == "eager":
            eager.append(payload)
        else:
            guards.append(payload[1])
            entries.append(payload[2])
    n_breaks = len(_frame.break_log)
    _frame._listeners.append(listener)
    # a fresh capture of every frame: a cached one (a callee, a resume function) may run eagerly (an earlier failure,
    # the recompile limit) or be compiled already, which explained nothing
    saved, _frame._generation[0] = dict(_frame._caches), _frame._generation[0] + 1
    _frame._caches.clear()
    try:
        result = wrap_callable(fn, backend=backend)(*args, **kwargs)
    finally:
        _frame._listeners.remove(listener)
        _frame._caches.clear()
        _frame._caches.update(saved)
        _frame._generation[0] += 1
    breaks = list(_frame.break_log[n_breaks:])
    return ExplainOutput(len(graphs), len(breaks), breaks, graphs, guards, entries, result, eager)


__all__ = ["wrap_callable", "reset", "disable", "explain", "ExplainOutput", "stats"]
