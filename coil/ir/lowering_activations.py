"""Lowerings of activation functions kept whole by the decomposition table.

``aten.gelu`` and ``aten.gelu_backward`` reach the IR undecomposed (see :data:`coil.aot.decompositions.EXTRA_DECOMPOSE`)
so that the exact (erf) GELU can be written with ``ops.ndtr``, the standard normal CDF Φ: ``gelu(x) = x·Φ(x)``. The
decomposition torch ships, ``x·0.5·(1 + erf(x/√2))``, costs a two-range erf per element, and a bf16 ``gelu(x + b)``
kernel on an H200 is bound by instruction issue rather than memory with it (about 40 SASS instructions per element; with
``ops.ndtr`` as the Triton backend writes it, 27). The ``approximate="tanh"`` form follows torch's formula op by op.

Dtypes: arithmetic runs in ``compute_dtype(out)`` (fp32 for fp16/bf16), rounded once at
the store, like the other pointwise lowerings."""
from __future__ import annotations

import functools
import math

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from coil.ir.lowering import device, make_pointwise_box, out_dtype, out_size, register_lowering
from coil.ir.nodes import TensorBox
from coil.ir.virtualized import compute_dtype, ops

aten = torch.ops.aten

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)   # tanh-GELU's inner scale
_KAPPA = 0.044715                             # tanh-GELU's cubic coefficient
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # the normal density's peak φ(0)


def _c(v: float, dt: torch.dtype):
    return ops.constant(v, dt)


def _tanh_inner(x, dt):
    """``√(2/π)·(x + κ·x³)`` and ``tanh`` of it."""
    x3 = ops.mul(ops.mul(x, x), x)
    inner = ops.mul(_c(_SQRT_2_OVER_PI, dt), ops.add(x, ops.mul(_c(_KAPPA, dt), x3)))
    return inner, ops.tanh(inner)


def _pointwise(fn, args) -> TensorBox:
    """``fn(*loaded args, compute dtype)`` elementwise, in the node's output dtype."""
    odt, cdt = out_dtype(), compute_dtype(out_dtype())
    return make_pointwise_box(lambda *v: fn(*v, cdt), args, out_size(), odt, cdt)


@functools.cache
def _eager_cpu_gelu(dtype: torch.dtype, v: float) -> float:
    """Eager's CPU exact GELU of ``v`` in a contiguous tensor of ``dtype`` (the kernel depends on the CPU: below)."""
    with unset_fake_temporarily():
        return torch.nn.functional.gelu(torch.full((64,), v, dtype=dtype))[0].item()


def _eager_cpu_gelu_of_inf_is_nan(dtype: torch.dtype) -> bool:
    return dtype in (torch.float32, torch.bfloat16) and math.isnan(_eager_cpu_gelu(dtype, math.inf))


def _eager_cpu_gelu_zero_is_positive(dtype: torch.dtype) -> bool:
    return math.copysign(1.0, _eager_cpu_gelu(dtype, -0.0)) > 0


@register_lowering(aten.gelu)
def _gelu(x, approximate: str = "none"):
    """GELU: ``x·Φ(x)`` (exact) or ``0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))``. Eager's CPU kernel for contiguous fp32
    (and bf16 on AVX-512) tensors is oneDNN's, which differs from ATen's at the edges, by CPU; asked of eager once per
    dtype: NaN at +inf on AVX-512 (AVX2 gives inf, as ATen's kernel, fp16/fp64 and CUDA do), and +0.0, never -0.0, for a
    zero result (of -0.0, and of x below about -5.5, where it underflows) on AVX2 (ATen's kernel gives -0.0:
    x·0.5·(+0.0)). Eager's strided and one-element inputs take ATen's kernel: coil matches the contiguous case."""
    if approximate == "tanh":
        def body(v, dt):
            _, t = _tanh_inner(v, dt)
            return ops.mul(ops.mul(_c(0.5, dt), v), ops.add(_c(1.0, dt), t))
        return _pointwise(body, [x])
    cpu = device().type == "cpu"
    inf_nan = cpu and _eager_cpu_gelu_of_inf_is_nan(out_dtype())
    pos_zero = cpu and _eager_cpu_gelu_zero_is_positive(out_dtype())

    def body(v, dt):
        y = ops.mul(v, ops.ndtr(v))
        y = ops.where(ops.eq(v, _c(math.inf, dt)), _c(math.nan, dt), y) if inf_nan else y
        return ops.add(y, _c(0.0, dt)) if pos_zero else y  # -0.0 + 0.0 is +0.0; any other y is unchanged
    return _pointwise(body, [x])


@register_lowering(aten.gelu_backward)
def _gelu_backward(grad, x, approximate: str = "none"):
    """d gelu/dx · grad: exact ``Φ(x) + x·φ(x)``, ``φ(x) = exp(-x²/2)/√(2π)``; tanh form
    ``0.5·(1 + t) + 0.5·x·(1 - t²)·√(2/π)·(1 + 3κx²)`` with ``t`` the inner tanh."""
    if approximate == "tanh":
        def body(g, v, dt):
            _, t = _tanh_inner(v, dt)
            left = ops.mul(_c(0.5, dt), ops.add(_c(1.0, dt), t))
            sech2 = ops.sub(_c(1.0, dt), ops.mul(t, t))
            dinner = ops.mul(_c(_SQRT_2_OVER_PI, dt),
                             ops.add(_c(1.0, dt), ops.mul(_c(3.0 * _KAPPA, dt), ops.mul(v, v))))
            right = ops.mul(ops.mul(ops.mul(_c(0.5, dt), v), sech2), dinner)
            return ops.mul(g, ops.add(left, right))
    else:
        def body(g, v, dt):
            pdf = ops.mul(_c(_INV_SQRT_2PI, dt), ops.exp(ops.mul(_c(-0.5, dt), ops.mul(v, v))))
            return ops.mul(g, ops.add(ops.ndtr(v), ops.mul(v, pdf)))
    return _pointwise(body, [grad, x])
