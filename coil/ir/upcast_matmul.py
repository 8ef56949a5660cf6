"""A bf16 matmul whose only use is a float32 cast that the graph returns, as one float32-output matmul.

Under bf16 autocast a linear layer's weight gradient is a bf16 product ``g.t() @ x`` cast to float32 for the float32
parameter (``_to_copy``, often through ``permute``s that cancel): cuBLAS rounds its float32 accumulator to bf16, and a
kernel of its own reads that and writes float32. ``aten.mm.dtype(a, b, torch.float32)`` has cuBLAS write the
accumulator as float32: no cast kernel, 2 more bytes an element in the product's epilogue, and no bf16 rounding of the
gradient (its values are closer to the exact product than eager's; bf16 has float32's exponent range, so no value
overflows in one and not the other). fp16 products are left alone: their rounding to fp16 is where eager's gradients
overflow to inf, which ``GradScaler`` looks for. On unless ``config.matmul_float32_grads`` is False;
``benchmarks/mm_out_dtype.py`` times the two forms."""
from __future__ import annotations

import functools

import torch
import torch.fx

from coil import trace

aten = torch.ops.aten
#: devices whose ``aten.mm.dtype`` takes bf16 operands (tests add "cpu" with a kernel of their own)
DEVICES = ("cuda",)
_VIEWS = (aten.permute.default, aten.t.default, aten.transpose.int)
_CASTS = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def upcast_matmuls(gm: torch.fx.GraphModule) -> int:
    """Rewrite, in place, each ``_to_copy(v(mm(a, b)), dtype=float32)`` of backward graph ``gm`` (a user sees the
    outputs of forward and inference graphs, which keep eager's rounding; ``v``: zero or more transposes,
    each the only user of its input, composing to ``mm``'s own layout) whose result only the graph's output reads and
    whose bf16 ``mm`` on a ``DEVICES`` device has static sizes that are multiples of 8 (cuBLAS's aligned kernels),
    into ``aten.mm.dtype(a, b, torch.float32)``. Returns how many were rewritten (event ``matmul_float32_out``)."""
    if getattr(aten.mm, "dtype", None) is None or getattr(gm, "meta", {}).get("coil_aot_graph") != "backward":
        return 0
    graph, done = gm.graph, 0
    for cast in list(graph.nodes):
        if cast.op != "call_function" or cast.target not in _CASTS or any(u.op != "output" for u in cast.users):
            continue
        out, chain, src = cast.meta.get("val"), [], cast.args[0]
        while isinstance(src, torch.fx.Node) and src.target in _VIEWS and len(src.users) == 1:
            chain.append(src)
            src = src.args[0]
        if not (isinstance(src, torch.fx.Node) and src.target is aten.mm.default and len(src.users) == 1):
            continue
        mv, ops = src.meta.get("val"), [a.meta.get("val") for a in src.args]
        if not (isinstance(out, torch.Tensor) and isinstance(mv, torch.Tensor) and out.dtype == torch.float32
                and mv.dtype == torch.bfloat16 and mv.device.type in DEVICES and _works(mv.device)
                # only the dtype changes (the same device, sizes and strides: the transposes cancel)
                and out.device == mv.device and tuple(out.shape) == tuple(mv.shape)
                and tuple(out.stride()) == tuple(mv.stride())
                and all(isinstance(s, int) and s % 8 == 0 for t in ops for s in t.shape)):
            continue
        with graph.inserting_before(cast):
            new = graph.call_function(aten.mm.dtype, (src.args[0], src.args[1], torch.float32))
        new.meta = dict(src.meta, val=out)
        cast.replace_all_uses_with(new)
        for n in [cast, *chain, src]:
            graph.erase_node(n)
        done += 1
    if done:
        gm.recompile()
        trace.log("matmul_float32_out", stage="lowering", count=done)
    return done


@functools.lru_cache(maxsize=None)
def _works(device: torch.device) -> bool:
    """Whether this torch's ``aten.mm.dtype`` runs bf16 operands on ``device`` (probed once; logged where not)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    try:
        with unset_fake_temporarily():  # real tensors: a fake mode would answer from the op's meta kernel
            a = torch.ones(8, 8, dtype=torch.bfloat16, device=device)
            return bool(aten.mm.dtype(a, a, torch.float32).dtype == torch.float32)
    except (RuntimeError, NotImplementedError) as e:
        trace.log("matmul_float32_out", stage="lowering", count=0,
                  reason=f"aten.mm.dtype fails on {device}: {str(e).splitlines()[0][:200]}")
        return False
