"""The decomposition table: which ATen ops reach coil's IR, and in what form.

Graphs handed to code generators contain only *core ATen* ops
(``torch._decomp.core_aten_decompositions()``), further decomposed where a fused
loop-level lowering beats a library call: softmax, log_softmax, layer_norm,
gelu, silu, dropout... become pointwise ops and reductions that the scheduler fuses.

Kept whole (extern kernels, or lowered directly by the IR), listed in
:data:`KEEP_WHOLE`: matrix products, convolutions, scaled-dot-product attention,
sorting, and the random ops the IR lowers itself. docs/aot.md lists the set.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch._decomp as _decomp

aten = torch.ops.aten

#: Core ATen ops that are decomposed further for fusion.
EXTRA_DECOMPOSE = [
    aten._softmax, aten._log_softmax, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.native_layer_norm,
    aten.native_layer_norm_backward, aten.gelu, aten.gelu_backward,
    aten.silu, aten.silu_backward, aten.native_dropout, aten.native_dropout_backward,
    aten.hardtanh, aten.hardswish, aten.hardsigmoid, aten.mish, aten.softplus,
    aten.leaky_relu, aten.elu, aten.var_mean, aten.native_batch_norm,
    aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
    aten._native_batch_norm_legit_functional, aten.native_batch_norm_backward,
    aten.embedding_dense_backward, aten.nll_loss_forward, aten.nll_loss_backward,
    aten.rsub, aten.addcmul, aten.addcdiv, aten.lerp, aten.logsumexp,
    aten.tanh_backward, aten.sigmoid_backward, aten.threshold_backward,
    aten._to_copy, aten.linalg_vector_norm,
]

#: Ops never decomposed: they run as extern kernels or have their own lowering.
KEEP_WHOLE = [
    aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution,
    aten.convolution_backward, aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_cudnn_attention,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten.sort, aten.topk, aten.cumsum, aten.cumprod,
]


def get_decompositions() -> dict[torch._ops.OpOverload, Callable]:
    """The table ``{OpOverload: decomposition}`` that ``make_fx`` applies in aot/."""
    table = dict(_decomp.core_aten_decompositions().items())
    table.update(_decomp.get_decompositions(EXTRA_DECOMPOSE))
    keep = set()
    for packet in KEEP_WHOLE:
        for name in packet.overloads():
            keep.add(getattr(packet, name))
    for op in keep:
        table.pop(op, None)
    return table
