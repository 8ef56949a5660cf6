"""coil's ahead-of-time autograd (AOTAutograd's role).

In: a torch-level ``torch.fx.GraphModule`` and example inputs (real or fake), from coil's capture or from
``torch.compile``. Out: a callable with the same calling convention that behaves like eager PyTorch, autograd included,
whose work is done by functional ATen graphs handed to a fw/bw compiler.

Modules, in pipeline order:

- :mod:`coil.aot.decompositions`: the op set graphs are decomposed to (no prims).
- :mod:`coil.aot.functional`: fake-tensor analysis of mutations and aliasing; tracing
  to functional ATen (inference graph or joint forward+backward graph).
- :mod:`coil.aot.partition`: joint graph → forward + backward graphs
  (:func:`min_cut_partition`, :func:`default_partition`).
- :mod:`coil.aot.runtime`: the autograd.Function and the epilogue that replays
  input mutations and regenerates aliased outputs.
- :mod:`coil.aot.compile`: :func:`aot_compile`, the driver.
- :mod:`coil.aot.backend`: the ``"aot_eager"`` backend.

Invariants: graphs given to compilers have no mutation, no written aliases, no
``prims.*`` ops, and ``meta["val"]`` on every node. docs/aot.md has the details."""
from coil.aot.compile import aot_compile
from coil.aot.partition import Partition, default_partition, min_cut_partition

__all__ = ["aot_compile", "min_cut_partition", "default_partition", "Partition"]
