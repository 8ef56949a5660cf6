"""Frame inspection and opaque C callables (docs/capture.md, "Frame inspection").

A call that looks at Python frames (``sys._getframe``, ``inspect.stack``, ``traceback.extract_stack``, logging's caller
lookup, ``warnings.warn``) is a graph break run inside a *call stub* (:func:`coil.capture.resume.make_call_stub`): a
frame with the user's code name, file, line and live locals. Inside an inlined callee, the root frame breaks at the call
to the callee, which then runs uncaptured from the stub (``frame_inspection = True`` on the ``Unsupported``). A frame
object obtained in the root frame outlives the stub, so :func:`frame_result_ok` lets it be used only as ``.f_code``;
anything else runs the frame eagerly, logged. :class:`OpaqueCallableVariable` stands for a C function not known to be
safe: loading it is fine, calling it is the graph break."""
from __future__ import annotations

import inspect
import sys
import traceback
import warnings

from coil.exc import Unsupported
from coil.capture.variables.base import ConstantVariable, RealValueVariable, VariableTracker


def _frame_functions() -> set:
    fns = {sys._getframe, inspect.currentframe, inspect.stack, inspect.trace, inspect.getouterframes,
           inspect.getframeinfo, traceback.extract_stack, traceback.format_stack, traceback.print_stack,
           traceback.walk_stack, warnings.warn}
    if hasattr(sys, "_getframemodulename"):
        fns.add(sys._getframemodulename)
    return fns


FRAME_FUNCTIONS = _frame_functions()
#: calls whose result is the calling frame itself (with no argument / argument 0)
_CURRENT_FRAME = (sys._getframe, inspect.currentframe)


def is_frame_function(fn) -> bool:
    try:
        return fn in FRAME_FUNCTIONS
    except TypeError:
        return False


def frame_unsupported(reason: str, fn, hint: str = "it runs outside the graph") -> Unsupported:
    """An ``Unsupported`` for a call of ``fn``, marked when ``fn`` inspects frames."""
    e = Unsupported(reason, hint=hint)
    if is_frame_function(fn):
        e.frame_inspection = True
    return e


_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK")


def _used_as_f_code(instructions: list, i: int) -> bool:
    nxt = instructions[i + 1] if i + 1 < len(instructions) else None
    return nxt is not None and nxt.opname == "LOAD_ATTR" and nxt.argval == "f_code"


def frame_result_ok(instructions: list, index: int, fn, args, kwargs=None) -> tuple[bool, str]:
    """Whether the result of the frame-inspecting call at ``instructions[index]`` (the
    root frame's own ``CALL``) is used only in ways a call stub answers exactly (see
    the module docstring). ``warnings.warn`` is exact with ``stacklevel`` 1 (the stub is
    the user's frame); a higher level names a frame above it. Returns ``(ok, why_not)``."""
    name = getattr(fn, "__qualname__", repr(fn))
    if fn is warnings.warn:
        level = (kwargs or {}).get("stacklevel", args[2] if len(args) > 2 else None)
        if level is None or (level.is_python_constant() and level.as_python_constant() == 1):
            return True, ""
        return False, "warnings.warn(stacklevel > 1) names a calling frame"
    if fn not in _CURRENT_FRAME:
        return False, f"{name}() lists the calling frames, which include coil's"
    if args:
        a = args[0]
        if len(args) > 1 or not a.is_python_constant() or a.as_python_constant() != 0:
            return False, f"{name}(n) walks to a calling frame"
    nxt = instructions[index + 1] if index + 1 < len(instructions) else None
    if nxt is None:
        return False, "frame object returned"
    if nxt.opname == "POP_TOP" or _used_as_f_code(instructions, index):
        return True, ""
    if nxt.opname == "STORE_FAST":
        var = nxt.argval
        for i, ins in enumerate(instructions):
            if ins.argval != var:
                continue
            if ins.opname in _LOADS and not _used_as_f_code(instructions, i):
                return False, f"frame object in local {var!r} is used beyond .f_code"
            if ins.opname not in _LOADS + ("STORE_FAST", "DELETE_FAST"):
                return False, f"frame object in local {var!r} is used by {ins.opname}"
        return True, ""
    return False, f"frame object used by {nxt.opname} {nxt.argrepr}".rstrip()


class FrameVariable(RealValueVariable):
    """A real frame object reaching a captured frame (the result of a frame-inspecting
    call that ran in a call stub). ``f_code`` is a guarded constant; every other
    attribute is a graph break (its value can change as the frame runs)."""

    def var_getattr(self, tx, name):
        if name == "f_code":
            code = self.value.f_code
            if self.source is not None:
                gs, e = tx.output.guards, self.source.expr()
                gs.add(f"{e}.f_code is {gs.const(code)}", f"{e}.f_code", code, src=e)
            return ConstantVariable(code)
        raise frame_unsupported(f"frame attribute {name}", sys._getframe)

    def call_method(self, tx, name, args, kwargs):
        raise frame_unsupported(f"frame method {name}", sys._getframe)

    def __repr__(self):
        return "FrameVariable()"


class OpaqueCallableVariable(VariableTracker):
    """A C function or method not known to be safe: calling it is a graph break (at the ``CALL``; the entry runs it for
    real). Never evaluated at compile time, so it needs no guard: the entry reads it from its source at run time."""

    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def python_type(self):
        return type(self.fn)

    def call_function(self, tx, args, kwargs):
        name = getattr(self.fn, "__qualname__", None) or getattr(self.fn, "__name__", repr(self.fn))
        raise frame_unsupported(f"call into C function {name}", self.fn)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__") and hasattr(self.fn, name):
            return ConstantVariable(getattr(self.fn, name))
        raise Unsupported(f"attribute {name} of C function {self.fn!r}")

    def reconstruct(self, cg):
        return cg.source_expr(self.source) if self.source is not None else cg.const_expr(self.fn)

    def __repr__(self):
        return f"OpaqueCallableVariable({getattr(self.fn, '__qualname__', self.fn)})"


class OpaqueObjectVariable(RealValueVariable):
    """A real object capture can hold but not use (``torch.Generator``, streams): it may be stored, passed and returned;
    any use (an attribute, a method, an argument of a traced call such as ``torch.rand(..., generator=g)``) is a graph
    break, so the use runs for real (the generator's state advances as in eager)."""

    def as_python_constant(self):
        raise Unsupported(f"{type(self.value).__name__} object used in traced code",
                          hint="the call using it runs outside the graph")

    def var_getattr(self, tx, name):
        self.as_python_constant()

    def call_method(self, tx, name, args, kwargs):
        self.as_python_constant()

    def __repr__(self):
        return f"OpaqueObjectVariable({type(self.value).__name__})"
