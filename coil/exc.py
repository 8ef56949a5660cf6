"""coil's errors, in one place.

- :class:`CoilError` is the base of everything coil raises on purpose.
- :class:`Unsupported` is what capture raises internally for a construct it cannot trace; the translator turns it into a
  graph break (or a :class:`UserError` under ``fullgraph=True``).
- :class:`UserError` is for bad input: it carries the user's source location (file, line and that line's text) and says
  what to do.
- :class:`BackendCompilerFailed` wraps an exception raised by a backend, naming it.

Messages say what happened *and* what to do about it (STYLE.md §6)."""
from __future__ import annotations

import linecache
import os
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Optional

from coil.config import config


def warn_user(msg: str) -> None:
    """``warnings.warn(msg)`` attributed to the user's code: the innermost calling frame outside coil, torch and
    generated code (a fixed ``stacklevel`` named coil's own files: the depth varies with the path that warns)."""
    import torch
    skip = (os.path.dirname(__file__) + os.sep, os.path.dirname(torch.__file__) + os.sep, "<coil", "<eval_with_key")
    level, f = 2, sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(skip):
        level, f = level + 1, f.f_back
    warnings.warn(msg, UserWarning, stacklevel=level if f is not None else 2)


def optimizer_not_compiled(what: str) -> str:
    """Why optimizer method ``what`` (``"Adam.step"``) runs eagerly: ``coil.compile(opt.step)``, or its call inlined."""
    return f"{what}: optimizer steps are not compiled by coil yet"


#: what the optimizer-step warnings tell the user to do
OPTIMIZER_TODO = "it runs eagerly. Compile the model (or the loss and backward) instead."


class CoilError(RuntimeError):
    """Base class of all errors coil raises on purpose."""


@dataclass
class SourceLocation:
    """A position in the user's source: ``filename:lineno`` and that line's text."""

    filename: str
    lineno: int
    text: str = ""

    @classmethod
    def of(cls, filename: str, lineno: int) -> "SourceLocation":
        return cls(filename, lineno, linecache.getline(filename, lineno).strip())

    def __str__(self) -> str:
        s = f"{self.filename}:{self.lineno}"
        return f"{s}\n    {self.text}" if self.text else s


class Unsupported(CoilError):
    """A construct capture cannot trace. Becomes a graph break.

    ``reason`` is a short, stable description ("call to print", "data-dependent
    branch on a tensor"), ``hint`` what a user can do instead."""

    def __init__(self, reason: str, hint: str = "", location: Optional[SourceLocation] = None):
        self.reason, self.hint, self.location = reason, hint, location
        super().__init__(reason + (f"\n  at {location}" if location is not None else "")
                         + (f"\n  hint: {hint}" if hint else ""))


class UserError(CoilError):
    """Bad input from the user; names their source line and what to do."""

    def __init__(self, message: str, location: Optional[SourceLocation] = None, hint: str = ""):
        self.location, self.hint = location, hint
        super().__init__(message + (f"\n  at {location}" if location is not None else "")
                         + (f"\n  what to do: {hint}" if hint else ""))


class GraphBreakInFullgraph(UserError):
    """A graph break happened under ``fullgraph=True``."""


class BackendCompilerFailed(CoilError):
    """A backend raised while compiling a graph.

    Attributes: ``backend_name`` (str) and ``inner`` (the original exception)."""

    def __init__(self, backend_name: str, inner: BaseException):
        self.backend_name, self.inner = backend_name, inner
        super().__init__(
            f"backend {backend_name!r} failed to compile a graph: {type(inner).__name__}: {inner}\n"
            "  what to do: try backend='aot_eager' or 'eager' to narrow it down, and set COIL_TRACE=<dir> to see the "
            "graph it was given."
        )


class InternalError(CoilError):
    """A bug in coil. Optional optimisations catch these and fall back."""


class KernelCompileError(InternalError):
    """A generated kernel that its compiler (Triton for the GPU) rejected at first launch;
    ``coil.codegen.CompiledGraph`` catches it and runs the graph with ATen ops."""


class StrictCodegenError(InternalError):
    """A fallback from coil's own kernels to ATen ops / the FX interpreter that
    ``config.strict_codegen`` turned into an error (:func:`refuse_fallback`)."""


#: Fallbacks to ATen ops / the FX interpreter this process took, by compile-log event
#: (:func:`refuse_fallback` counts them; the bench reports them per row).
fallback_counts: Counter = Counter()
#: ``"<event>: <error>"`` of each of those fallbacks, in order (the first 300 characters of the error)
fallback_errors: list = []


def refuse_fallback(event: str, error: BaseException | str) -> None:
    """Count a fallback (:data:`fallback_counts`). Called where coil is about to run a graph with ATen ops or
    the FX interpreter instead of its own kernels because of an internal failure (``event``: the compile-log
    event it logs, e.g. ``codegen_fallback``). With ``config.strict_codegen`` on, raise
    :class:`StrictCodegenError` from ``error`` instead; otherwise return."""
    fallback_counts[event] += 1
    msg = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    fallback_errors.append(f"{event}: {msg[:300]}")
    if not config.strict_codegen:
        return
    raise StrictCodegenError(f"{event} refused (strict_codegen): {msg}") from (
        error if isinstance(error, BaseException) else None)


#: the end of the message of the check aot puts where eager's linalg functions raise ``torch.linalg.LinAlgError`` (a
#: RuntimeError that compiled code raises as that type: coil.codegen.CompiledGraph)
LINALG_ERROR_MESSAGE = "the input is singular or not positive-definite (the factorization could not be completed)"
#: the start of the message of a runtime assert capture defers where Python raises ZeroDivisionError (a division by a
#: number read from a tensor, ``1.0 / n.item()``, that is 0): compiled code raises it as that error (CompiledGraph)
ZERO_DIVISION_MARK = "coil: ZeroDivisionError: "


class KernelIndexError(IndexError, RuntimeError):
    """An index that a generated kernel's bounds check found out of range (``x[i]``, gather, scatter, embedding,
    one_hot, nll_loss targets...). Eager raises IndexError for some of these ops and RuntimeError for others, and a
    kernel check does not know which op it guards, so this is both: ``except IndexError`` and ``except RuntimeError``
    each catch it. The message names the kernel, the check site and, where known, the user's source line."""
