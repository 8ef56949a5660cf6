"""Run a lowered graph with the reference interpreter (no code generation).

``run_reference(graph, args)`` executes every buffer of a :class:`GraphLowering` in order: ComputedBuffers through
:class:`~coil.ir.handlers.ReferenceInterpreter` (torch ops over the whole iteration space), extern kernels with their
ATen op. It returns the graph outputs. Tests compare it with eager PyTorch for every lowering, which checks the IR
independently of any backend."""
from __future__ import annotations

import torch

from coil.ir.handlers import ReferenceInterpreter
from coil.ir.nodes import (Buffer, ComputedBuffer, ConcatBuffer, ConcatSlice, ExternKernel, Layout, MultiOutput,
                           ReinterpretView, ScatterBuffer)


def _flat(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    return t.as_strided((int(layout.storage_numel()),), (1,), t.storage_offset())


def _view(flat: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``flat``'s memory as ``layout`` (or anything with its ``size``, ``stride`` and ``offset``) lays it out."""
    return flat.as_strided([int(s) for s in layout.size], [int(s) for s in layout.stride],
                           flat.storage_offset() + int(layout.offset))


def run_reference(graph, args: list) -> tuple:
    """Outputs of ``graph`` on ``args`` computed by the reference interpreter."""
    env: dict[str, torch.Tensor] = {}      # name -> flat storage
    tensors: dict[str, torch.Tensor] = {}  # name -> tensor as laid out
    tensor_args = iter(a for a in args)
    for name in graph.placeholder_names:
        a = next(tensor_args)
        if name in graph.graph_inputs:
            tensors[name] = a
            env[name] = _flat(a, graph.graph_inputs[name].layout)
    if graph.seed_count:
        env["seeds"] = torch.randint(2 ** 31 - 1, (graph.seed_count,), dtype=torch.int64)
    for name, c in graph.constants.items():
        tensors[name] = c
        env[name] = _flat(c, graph.name_to_buffer[name].layout)

    def arg(a):
        if isinstance(a, ReinterpretView):
            return _view(tensors[a.data.get_name()], a.layout)
        if isinstance(a, Buffer):
            return tensors[a.get_name()]
        return type(a)(arg(x) for x in a) if isinstance(a, (list, tuple)) else a
    for b in graph.buffers:
        if isinstance(b, ComputedBuffer):
            if isinstance(b, ScatterBuffer):
                env[b.name] = env[b.target.get_name()]  # writes into its target's storage
            elif isinstance(b, ConcatSlice):  # writes into its slice of the concatenation's storage
                if (st := b.storage).name not in env:
                    env[st.name] = torch.empty(int(st.layout.storage_numel()), dtype=st.get_dtype(),
                                               device=st.get_device())
                env[b.name] = env[st.name][int(b.view_offset):]
            ReferenceInterpreter.run(b, env)
            tensors[b.name] = _view(env[b.name], b.layout)
        elif isinstance(b, ExternKernel):
            out = b.op(*[arg(a) for a in b.args], **{k: arg(v) for k, v in b.kwargs.items()})
            tensors[b.name] = out
            if isinstance(out, torch.Tensor):
                out = out.contiguous() if b.layout is None else out
                env[b.name] = _flat(_restride(out, b.layout), b.layout)
                tensors[b.name] = _view(env[b.name], b.layout)
        elif isinstance(b, ConcatBuffer):  # a view of its storage
            env[b.name] = env[b.storage.name]
            tensors[b.name] = _view(env[b.name], b.layout)
        elif isinstance(b, MultiOutput):
            v = tensors[b.parent.name]
            for i in b.path:
                v = v[i]
            tensors[b.name] = v = _restride(v, b.layout)
            env[b.name] = _flat(v, b.layout)
    return tuple(tensors[o.name] if o.kind == "buffer" else _view(tensors[o.name], o) if o.kind == "view" else o.value
                 for o in graph.outputs)


def _restride(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    size, stride = [int(s) for s in layout.size], [int(s) for s in layout.stride]
    if all(a == b or n == 1 for a, b, n in zip(t.stride(), stride, size)):
        return t
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)
