"""The kernel-backend interface (docs/codegen.md): a backend turns a KernelPlan into a GeneratedKernel (source +
launcher). Triton (coil/codegen/triton) and C++ (coil/codegen/cpp) register themselves here."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from coil.codegen.common import PERSISTENT_RNUMEL, KernelPlan


@dataclasses.dataclass
class GeneratedKernel:
    """name: deterministic kernel name; source: the full kernel text; arg_names: IR buffer names the launcher takes, in
    order; launcher(*tensors, *sizes) runs the kernel. ``size_args``: with symbolic sizes, the size expressions (sympy,
    in the ShapeEnv's symbols) whose values the wrapper passes after the tensors, in order; empty for static kernels."""

    name: str
    source: str
    arg_names: list
    launcher: Callable
    language: str = "python"
    size_args: list = dataclasses.field(default_factory=list)


class KernelBackend:
    """Base class: subclasses set ``name`` and implement :meth:`generate`."""

    name: str = "?"
    #: Reductions with at most this many elements per output are planned persistent.
    persistent_rnumel: int = PERSISTENT_RNUMEL
    #: dtypes an accumulating store (``mode="atomic_add"``) can add in; None: all. The
    #: lowering widens a scatter into another dtype (lowering_views._scatter_box).
    atomic_add_dtypes: Optional[frozenset] = None

    def generate(self, plan: KernelPlan, kernel_name: str) -> GeneratedKernel:
        raise NotImplementedError


_BACKENDS: dict[str, Callable[[], KernelBackend]] = {}


def register_kernel_backend(name: str) -> Callable:
    """Class decorator: ``@register_kernel_backend("cpp") class CppBackend(KernelBackend)``."""
    def deco(cls):
        _BACKENDS[name] = cls
        return cls
    return deco


def get_kernel_backend(name: str) -> Optional[KernelBackend]:
    """An instance of the backend called ``name``, importing built-in ones on demand."""
    if name not in _BACKENDS:
        try:
            if name == "triton":
                import coil.codegen.triton.backend  # noqa: F401
            elif name == "cpp":
                import coil.codegen.cpp  # noqa: F401
        except ImportError:
            return None
    cls = _BACKENDS.get(name)
    return cls() if cls is not None else None
