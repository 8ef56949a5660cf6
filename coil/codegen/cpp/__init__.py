"""The C++/OpenMP kernel backend for CPU tensors (``config.cpu_backend == "cpp"``).

What goes in: a :class:`coil.codegen.common.KernelPlan` (one fused group, see docs/codegen.md). What comes out: a
:class:`coil.codegen.backend.GeneratedKernel` whose source is one ``extern "C"`` C++ function (plus the shared prelude)
and whose launcher calls it through ctypes with the tensors' data pointers. docs/cpp_backend.md ("Files") says what each
module of this package does.

Invariants: the same plan and kernel name give the same source (golden tests); the kernel never reads or writes outside
the buffers' storage (indirect indices are bounds-checked and reported as ``IndexError``); results do not depend on the
number of threads."""
from __future__ import annotations

from coil.codegen.backend import GeneratedKernel, KernelBackend, register_kernel_backend
from coil.codegen.cpp.kernel import CppKernel
from coil.codegen.cpp.launch import CppLauncher
from coil.runtime import cpp_build

__all__ = ["CppBackend", "CppKernel", "CppLauncher"]


@register_kernel_backend("cpp")
class CppBackend(KernelBackend):
    """Generates one C++ function per fused group and builds it in the background."""

    name = "cpp"
    #: C++ kernels loop over the reduction (no register-resident "persistent" blocks):
    #: plans keep one loop section per dependent reduction.
    persistent_rnumel = 0

    def generate(self, plan, kernel_name: str) -> GeneratedKernel:
        """Write and start building the kernel for ``plan``.

        Raises :class:`coil.runtime.cpp_build.CompilerNotFound` at once when there is no C++ compiler (the caller falls
        back to extern kernels for the graph) and NotImplementedError for ops/dtypes the C++ backend does not support.
        """
        cpp_build.compiler()
        k = CppKernel(plan, kernel_name, cpp_build.num_threads())
        body = k.source()
        launcher = CppLauncher(body, kernel_name, len(k.arg_names()), k.has_checks, batch=True,
                               check_origins=k.check_origins, n_sizes=len(k.size_symbols))
        return GeneratedKernel(name=kernel_name, source=body, arg_names=k.arg_names(),
                               launcher=launcher, language="cpp", size_args=list(k.size_symbols))
