"""The ``"coil"`` backend: AOT autograd, then coil's own kernels for each ATen graph.

``coil(gm, example_inputs)`` = ``aot_compile(gm, example_inputs, fw_compiler=K, bw_compiler=K)`` with ``K =
compile_aten_graph`` (loop IR → scheduler → Triton on CUDA tensors, C++/OpenMP on CPU tensors by default).

If code generation fails for one ATen graph (an internal error in coil), that graph runs through the FX interpreter
instead, and the compile log records why (event ``codegen_fallback``); results stay correct, only slower."""
from __future__ import annotations

import traceback
from typing import Callable

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from coil import trace
from coil.backends.registry import lookup_backend, register_backend
from coil.aot import aot_compile
from coil.aot.backend import run_graph
from coil.config import config
from coil.exc import refuse_fallback, warn_user


def _graph_device(example_inputs: list) -> torch.device:
    return next((x.device for x in example_inputs if isinstance(x, torch.Tensor) and x.device.type != "cpu"),
                torch.device("cpu"))


def kernel_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Compile one functional ATen graph to generated kernels, falling back to the
    FX interpreter (logged, with a warning) if code generation raises; with
    ``config.strict_codegen`` the failure raises ``coil.exc.StrictCodegenError``."""
    from coil.codegen import compile_aten_graph  # looked up per call: tests count the compiles
    try:
        return compile_aten_graph(gm, example_inputs, _graph_device(example_inputs))
    except Exception as e:  # an internal failure: stay correct, say so
        trace.log("codegen_fallback", stage="codegen", error=f"{type(e).__name__}: {e}",
                  traceback=traceback.format_exc())
        refuse_fallback("codegen_fallback", e)  # config.strict_codegen: an error instead
        warn_user(f"coil: code generation failed ({type(e).__name__}: {e}); "
                  "running this graph with the FX interpreter instead")
        return run_graph(gm, example_inputs)


@register_backend("coil")
def coil(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The whole pipeline's backend (see module docstring)."""
    if _graph_device(example_inputs).type == "cuda" and config.autotune:
        from coil.runtime import compile_pool
        compile_pool.prestart("a CUDA graph is compiling: Triton kernels follow")
    try:
        return aot_compile(gm, example_inputs, fw_compiler=kernel_compiler, bw_compiler=kernel_compiler)
    except GuardOnDataDependentSymNode as e:  # a traced formula (cumsum's backward) asked about a size marked unbacked
        trace.log("aot_fallback", stage="aot", error=f"{type(e).__name__}: {e}"[:4000])
        refuse_fallback("aot_fallback", e)
        warn_user(f"coil: AOT tracing needs an unbacked size ({str(e).splitlines()[0]}); running this graph eagerly")
        return lookup_backend("eager")(gm, example_inputs)
