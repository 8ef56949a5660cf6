"""coil: a PyTorch 2-style compiler, small enough to read.

``fast = coil.compile(model)`` captures the model's Python bytecode into FX graphs (:mod:`coil.capture`, Dynamo's role),
traces autograd ahead of time and partitions forward from backward (:mod:`coil.aot`), lowers each ATen graph to a
define-by-run loop IR (:mod:`coil.ir`), fuses (:mod:`coil.schedule`) and generates Triton or C++/OpenMP kernels with a
Python wrapper (:mod:`coil.codegen`, :mod:`coil.runtime`). Every stage writes to the compile log (:mod:`coil.trace`,
``COIL_TRACE=<dir>``).

See docs/architecture.md for the whole picture."""
from coil import config, exc, trace  # noqa: F401
from coil.api import (OptimizedModule, compile, cudagraph_mark_step_begin, disable, explain,  # noqa: F401
                      list_backends, mark_dynamic, mark_static, mark_unbacked, reset)

__version__ = "0.1.0"
__all__ = ["compile", "reset", "disable", "explain", "list_backends", "config", "exc", "trace", "OptimizedModule",
           "cudagraph_mark_step_begin", "mark_dynamic", "mark_static", "mark_unbacked"]
