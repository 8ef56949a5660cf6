"""The ``"aot_eager"`` backend: coil's AOT autograd with the ATen halves run as
Python (``GraphModule.forward``, i.e. each ATen op called eagerly).

Use it to check tracing, functionalization, decompositions and partitioning apart from code generation:
``torch.compile(fn, backend=coil.aot.backend.aot_eager)`` or ``coil.compile(fn, backend="aot_eager")``."""
from __future__ import annotations

from typing import Callable

import torch

from coil.aot.compile import aot_compile


def run_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """A fw/bw compiler that runs the ATen graph as it is (``operator.pow`` of a negative constant base called as the
    builtin ``pow``: FX's code prints the operator as ``-2 ** s``, which Python reads as ``-(2 ** s)``)."""
    from coil.capture.frame import print_negative_bases_as_calls
    if print_negative_bases_as_calls(gm.graph):
        gm.recompile()
    return gm.forward


def aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Backend: ``aot_compile(gm, example_inputs, run_graph, run_graph)``."""
    return aot_compile(gm, example_inputs, fw_compiler=run_graph, bw_compiler=run_graph)
