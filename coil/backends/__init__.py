"""Backends: ``backend(gm: torch.fx.GraphModule, example_inputs: list) -> callable``.

This is torch.compile's contract, so coil's capture can hand graphs to any torch.compile backend and torch.compile can
use coil's (``backend="coil"`` through the ``torch_dynamo_backends`` entry point).

Registered here:

- ``"eager"``: run the captured graph as it is (``gm.forward``).
- ``"aot_eager"``: coil's AOT autograd with FX-interpreted ATen halves.
- ``"coil"``: capture → AOT → loop IR → fused kernels (the whole pipeline).
- ``"inductor"``: hand the graph to torch's own Inductor, to compare against.

Add one with :func:`register_backend`."""
from coil.backends.registry import (  # noqa: F401
    list_backends,
    lookup_backend,
    register_backend,
)
