"""Python exceptions raised and caught inside traced code.

An exception met during translation is a :class:`coil.exc.Unsupported` carrying (or standing for) an
:class:`ExceptionVariable`: a ``raise`` statement raises :class:`RaisedException`; a tracker implementing Python
semantics raises a ``UserCodeError`` ("user code raises KeyError: ...") or an ``Unsupported`` whose reason ends with
"(raised by user code)", which :func:`exception_tracker` maps to the exception class.
:meth:`InstructionTranslatorBase.step <coil.capture.translator.InstructionTranslatorBase.step>` looks the raising
instruction up in the frame's exception table (https://docs.python.org/3.11/library/dis.html,
``dis._parse_exception_table``) and jumps to the handler; without one the exception leaves the frame and the caller's
``step`` tries next. Not mapped (stay graph breaks): unsupported constructs, tensor data, failing tensor ops (their
cause comes from torch) and RuntimeError."""
from __future__ import annotations

import ast
import builtins
import contextlib
import dis
import types
from typing import Optional

from coil.exc import Unsupported
from coil.capture.variables.base import ConstantVariable, VariableTracker
from coil.capture.variables.builder import wrap_constant_result
from coil.capture.variables.containers import TupleVariable
from coil.capture.variables.objects import UserDefinedClassVariable
from coil.capture.variables.tensor import UserCodeError


class ExceptionVariable(VariableTracker):
    """An exception object constructed in the frame, or raised by an operation with Python semantics (``KeyError`` from
    a dict lookup). Raised, it goes to the nearest handler in the traced frames; ``origin`` is the :class:`Unsupported`
    carrying it, so an exception no traced frame handles breaks the graph where it was first raised."""

    def __init__(self, cls, args):
        super().__init__(None)
        self.cls, self.args = cls, args
        self.origin: Optional[Unsupported] = None

    def python_type(self):
        return self.cls

    def var_getattr(self, tx, name):
        if name == "args":
            return TupleVariable(list(self.args))
        if name in ("__traceback__", "__cause__", "__context__"):
            if self.origin is None:         # never raised: None, as in eager
                return ConstantVariable(None)
            # raised symbolically: eager has a real traceback / chained exception here
            raise Unsupported(f"{name} of an exception raised in the frame")
        if name == "__class__":
            return UserDefinedClassVariable(self.cls)
        raise Unsupported(f"attribute {name} of a {self.cls.__name__} raised in the frame")

    def set_attr(self, tx, name, value):
        if name != "__traceback__":     # (contextlib's __exit__ sets it to the traceback it was given)
            raise Unsupported(f"setting attribute {name} of a {self.cls.__name__} raised in the frame")

    def truthy(self, tx) -> bool:
        return True

    def exception_value(self) -> BaseException:
        """The exception as a Python object (its arguments must be constants)."""
        from coil.capture.translator import const_value
        return self.cls(*[const_value(a) for a in self.args])

    def raise_(self):
        """Raise this exception inside the traced frames (the same carrier each time)."""
        if self.origin is None:
            self.origin = RaisedException(self)
        raise self.origin

    def reconstruct(self, cg):
        return f"{cg.const_expr(self.cls)}({', '.join(cg.reconstruct(a) for a in self.args)})"


class RaisedException(Unsupported):
    """A ``raise`` of a tracked exception object; a graph break only if no traced frame handles it."""

    def __init__(self, exc_vt: ExceptionVariable):
        super().__init__("raise statement", hint="the exception is raised outside the graph")
        self.exc_vt = exc_vt


_BY_PREFIX = (("index out of range", IndexError), ("KeyError", KeyError), ("StopIteration", StopIteration),
              ("zip(strict=True)", ValueError), ("min/max of an empty", ValueError))


def _python_exception(e: Unsupported):
    """(class, message) of the Python exception eager would raise where ``e`` was raised, or None when ``e``
    is a real graph break (unsupported construct, tensor data, a failing tensor op)."""
    reason = e.reason
    if isinstance(e, UserCodeError) and reason.startswith("user code raises "):
        name, _, msg = reason[len("user code raises "):].partition(":")
        if not (isinstance(cls := getattr(builtins, name.strip(), None), type) and issubclass(cls, Exception)):
            return None
        if (cause := e.__cause__) is not None and type(cause).__module__.startswith("torch"):
            return None      # a tensor op failed: a graph break, eager raises its error
        return None if cls is RuntimeError else (cls, msg.strip())
    if reason.endswith(" (raised by user code)"):
        head = reason[:-len(" (raised by user code)")]
        for prefix, cls in _BY_PREFIX:
            if head.startswith(prefix):
                msg = head[len(prefix):].lstrip(": ") if cls is KeyError else head
                if cls is KeyError:
                    with contextlib.suppress(ValueError, SyntaxError):
                        return cls, ast.literal_eval(msg)
                return cls, msg
    return None


def exception_tracker(e: Unsupported) -> Optional[ExceptionVariable]:
    """The tracker of the Python exception ``e`` stands for (made once per ``e``), or
    None when ``e`` is a graph break that no ``except`` may catch."""
    if (vt := getattr(e, "exc_vt", None)) is not None:
        return vt
    if (found := _python_exception(e)) is None:
        return None
    cls, msg = found
    vt = ExceptionVariable(cls, [wrap_constant_result(None, msg)] if msg != "" else [])
    vt.origin = e
    e.exc_vt = vt
    return vt


_EXC_TABLES: dict = {}


def exception_table(code: types.CodeType) -> list:
    """``dis._parse_exception_table(code)`` (entries start, end (exclusive), target,
    depth, lasti), cached per code object."""
    if (t := _EXC_TABLES.get(code)) is None:
        t = _EXC_TABLES[code] = list(dis._parse_exception_table(code))
    return t
