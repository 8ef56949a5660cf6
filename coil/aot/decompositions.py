"""The decomposition table: which ATen ops reach coil's IR, and in what form.

Core ATen (``torch._decomp.core_aten_decompositions()``), further decomposed where a fused loop-level lowering beats a
library call (softmax, layer_norm, silu, dropout...), minus :data:`KEEP_WHOLE` (matrix products, convolutions,
attention, sorting, scans, ``_to_copy``), plus coil's own :data:`COIL_DECOMPOSITIONS` (``@register``, aten ops only,
two-pass mean/variance that fuses), so that **no ``prims.*`` op reaches a compiler**. With ``config.fallback_random``
the :data:`RANDOM_OPS` are not decomposed (eager's numbers). docs/aot.md, "Decompositions", lists the sets.
"""
from __future__ import annotations

import functools
import keyword
import math
import struct
from typing import Callable, Optional, Sequence

import torch
import torch._decomp as _decomp
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
from torch.fx.experimental.symbolic_shapes import statically_known_true

import coil.capture.meta_checks  # noqa: F401  (eager's layout in some ops' decompositions, before a table is built)
from coil.config import config

aten = torch.ops.aten

#: Core ATen ops that are decomposed further for fusion.
EXTRA_DECOMPOSE = [aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
                   aten.native_layer_norm_backward, aten.silu, aten.silu_backward, aten.native_dropout,
                   aten.native_dropout_backward, aten.hardtanh, aten.hardswish, aten.hardsigmoid, aten.mish,
                   aten.softplus, aten.leaky_relu, aten.elu, aten.native_batch_norm, aten._native_batch_norm_legit,
                   aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit_functional,
                   aten.native_batch_norm_backward, aten.embedding_dense_backward, aten.nll_loss_forward,
                   aten.nll_loss_backward, aten.rsub, aten.addcmul, aten.addcdiv, aten.lerp, aten.logsumexp,
                   aten.tanh_backward, aten.sigmoid_backward, aten.threshold_backward, aten.linalg_vector_norm]

#: Ops never decomposed: they run as extern kernels or have their own lowering.
KEEP_WHOLE = [
    aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution, aten.convolution_backward,
    aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_flash_attention_for_cpu, aten.sort, aten.topk,
    aten.cumsum, aten.cumprod, aten._to_copy, aten.multilabel_margin_loss_forward,
    aten.select_scatter,  # torch's decomposition (a where) promotes src's dtype; the lowering casts it to x's
    aten.gelu_backward,  # core ATen decomposes it with erf: libm's scalar double erf per element on CPU; the lowering's ndtr vectorizes
]

#: Random ops kept as ATen calls under ``fallback_random`` (bit-exact with eager).
RANDOM_OPS = [aten.native_dropout, aten.bernoulli, aten.bernoulli_, aten.rand, aten.rand_like, aten.randn,
              aten.randn_like, aten.randint, aten.randint_like, aten.rrelu, aten.normal, aten.uniform, aten.exponential,
              aten.multinomial]

# FX prints an op as `torch.ops.aten.random.from`, a SyntaxError where the overload name is a keyword: an op whose
# module is not torch's it names through a global of the generated code instead
for _s in (s for s in torch._C._jit_get_all_schemas() if keyword.iskeyword(s.overload_name)):
    _ns, _name = _s.name.split("::")
    getattr(getattr(getattr(torch.ops, _ns), _name), _s.overload_name).__module__ = __name__

# multilabel_margin_loss runs as the ATen op (KEEP_WHOLE; torch's decomposition, also its Autograd kernel under
# the Python dispatcher of symbolic traces, counts the targets after the first -1), its backward given a meta
_MLML, _LIB = aten.multilabel_margin_loss_forward.default, torch.library.Library("aten", "IMPL")
_MLML.py_kernels.pop(torch._C.DispatchKey.Autograd, None)
_MLML._dispatch_cache.clear()
_LIB.impl("multilabel_margin_loss_backward", lambda g, x, *a: torch.empty_like(x), "Meta")

# decomposed above autograd under the Python dispatcher (symbolic traces): the ATen backward needs concrete sizes
aten.affine_grid_generator.default.py_impl(torch._C.DispatchKey.Autograd)(
    _decomp.decomposition_table[aten.affine_grid_generator.default])

# dropout that draws nothing (eval, p = 0, empty) is the input itself in eager's composite; torch's kernel under the
# Python dispatcher (symbolic traces) a clone, so dynamic=True lost an in-place write through it to the input
_TORCH_DROPOUT = _decomp.decompositions.dropout
for _key in (torch._C.DispatchKey.CompositeImplicitAutograd, torch._C.DispatchKey.Autograd):
    aten.dropout.default.py_kernels.pop(_key, None)
    aten.dropout.default.py_impl(_key)(
        lambda x, p, train: x if not train or p == 0 or x.numel() == 0 else _TORCH_DROPOUT(x, p, train))
aten.dropout.default._dispatch_cache.clear()

_TORCH_INDEX_ADD = _decomp.decomposition_table[aten.index_add.default]  # (core's: the same; indexing it built it)
_TORCH_INDEX_COPY = _decomp.decomposition_table[aten.index_copy.default]

#: coil's own decompositions: ``{OpOverload: fn}``; each fn uses aten ops only.
COIL_DECOMPOSITIONS: dict = {}


def register(*ops: torch._ops.OpOverload) -> Callable:
    """Decorator: ``@register(aten.var.correction) def var(...)`` adds a decomposition."""

    def deco(fn: Callable) -> Callable:
        COIL_DECOMPOSITIONS.update(dict.fromkeys(ops, fn))
        return fn
    return deco


def _reduction_dims(x: torch.Tensor, dim: Optional[Sequence[int]]) -> list[int]:
    if x.dim() == 0:
        return []  # dim=0 / -1 of a 0-d tensor reduces over nothing
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    return [d % max(x.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    """Accumulation dtype of mean/variance statistics (see docs/ir.md, "Numerics"). On CPU float64, as eager's CPU
    var/std kernels accumulate in double: the squares of float32 values above ~1.8e19 overflow in float32 while
    ``x.std()`` of them is finite (``torch.std(torch.tensor([1e20, -1e20]))`` is 1.41e20). Elsewhere float32 for half
    inputs, else x's dtype, as eager's CUDA kernels do."""
    return torch.float64 if x.device.type == "cpu" and x.dtype.is_floating_point else _acc_dtype(x.dtype)


def _mean(x, dims: list, n):
    """``sum(x - p) / n + p`` with ``p`` the first element along ``dims``: exact for a row of equal values, as
    eager's Welford mean is (``sum(x) / n`` of six 1e30 is an ulp off, which a layer_norm then scales to ±1
    instead of 0). Plain ``sum(x) / n`` where a reduced dim may be empty."""
    p = x
    for d in dims:
        if not statically_known_true(x.shape[d] > 0):
            return aten.div.Scalar(aten.sum.dim_IntList(x, dims, True), n)
        p = aten.slice.Tensor(p, d, 0, 1)
    return aten.add.Tensor(aten.div.Scalar(aten.sum.dim_IntList(aten.sub.Tensor(x, p), dims, True), n), p) \
        if dims else x


def _var_and_mean(x, dim, correction, keepdim, take_sqrt=False):
    """Two-pass variance: mean (:func:`_mean`); var = sum((x - mean)^2) / max(n - c, 0). Computed in
    :func:`_stat_dtype` (float64 on CPU); returns (var, mean) in x's dtype, the standard deviation instead of the
    variance with ``take_sqrt`` (taken before rounding to x's dtype, so a variance beyond float32's range still gives a
    finite standard deviation, as eager)."""
    dims = _reduction_dims(x, dim)
    c = 1 if correction is None else correction
    n = math.prod(x.shape[d] for d in dims)
    sdt = _stat_dtype(x)
    xa = aten._to_copy.default(x, dtype=sdt) if sdt != x.dtype else x
    mean = _mean(xa, dims, n)
    centered = aten.sub.Tensor(xa, mean)
    if x.is_complex():  # |x - mean|^2: the variance of a complex tensor is real
        centered = aten.abs.default(centered)
    sq = aten.sum.dim_IntList(aten.mul.Tensor(centered, centered), dims, keepdim)
    # eager returns nan/inf for n - c <= 0 (division by zero); match it (a symbolic count too: var(correction=3) of
    # 2 rows was -0.5, not inf; fresh-user trial)
    denom = max(n - c, 0) if isinstance(n - c, (int, float)) else torch.sym_max(n - c, 0)
    var = aten.sqrt.default(aten.div.Scalar(sq, denom)) if take_sqrt else aten.div.Scalar(sq, denom)
    mean = aten.squeeze.dims(mean, dims) if dims and not keepdim else mean
    if xa.dtype != x.dtype:
        var = aten._to_copy.default(var, dtype=x.dtype.to_real())
        mean = aten._to_copy.default(mean, dtype=x.dtype)
    return var, mean


def _index_scatter(x, dim, index, source, *, alpha=1, copy=False):
    """``x.index_add(dim, index, source)`` (``copy``: ``index_copy``) as ``scatter_add`` (``scatter``) of ``source``
    at ``index`` expanded along ``dim``: eager rejects a negative index, and torch's decompositions to ``index_put``
    wrapped it (fresh-user trials; trial 62 finding 2). A 0-d operand takes torch's decomposition."""
    if x.dim() == 0 or source.dim() == 0 or index.dim() != 1:
        return _TORCH_INDEX_COPY(x, dim, index, source) if copy else _TORCH_INDEX_ADD(x, dim, index, source, alpha=alpha)
    if x.dim() > 1 and any(type(n) is int and n == 0 for n in x.shape):  # no elements: eager's kernel returns
        return aten.clone.default(x)  # before it checks the indices (fuzz_calls s103 #102)
    dim = dim % x.dim()
    source = aten.mul.Tensor(source, alpha) if alpha != 1 else source
    shape = [-1 if d == dim else 1 for d in range(source.dim())]
    index = aten.expand.default(aten.view.default(index, shape), list(source.shape))
    return (aten.scatter.src if copy else aten.scatter_add.default)(x, dim, index, source)


register(aten.index_add.default)(_index_scatter)
register(aten.index_copy.default)(functools.partial(_index_scatter, copy=True))


@register(aten.any.dims)
def _any_dims(x, dim=None, keepdim=False):
    """any / all over no dims reduce nothing in eager (x != 0, contiguous as a reduction's result); the lowering read
    ``[]`` as every dim (an error, or shape (1, 1) with keepdim)."""
    if dim is None or len(dim):
        return NotImplemented
    ne = aten._to_copy.default(aten.ne.Scalar(x, 0), dtype=torch.uint8 if x.dtype == torch.uint8 else torch.bool)
    return aten.clone.default(ne, memory_format=torch.contiguous_format)


_TORCH_ADDCMUL = _decomp.decomposition_table[aten.addcmul.default]


@register(aten.addcmul.default)
def _addcmul(x, t1, t2, *, value=1):
    """eager converts an integer operand to a float16 / bfloat16 result dtype first (int64 257 beside bf16 is 256:
    FINDINGS_71 1); torch's decomposition converts it straight to float32."""
    dt = elementwise_dtypes(x, t1, t2, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]
    if dt in (torch.float16, torch.bfloat16):
        x, t1, t2 = (t if t.dtype.is_floating_point else aten._to_copy.default(t, dtype=dt) for t in (x, t1, t2))
    return _TORCH_ADDCMUL(x, t1, t2, value=value)


_TORCH_LOG_SOFTMAX = _decomp.decomposition_table[aten._log_softmax.default]


@register(aten._log_softmax.default)
def _log_softmax(x, dim, half_to_float):
    """torch's decomposition, but over the last dim of fp16 / bf16 on CPU as eager's kernel: the sum of exponentials
    and its log rounded to x's dtype (torch's, in float32 throughout, differed by an ulp in a fifth of the values)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float16, torch.bfloat16) or half_to_float or x.dim() == 0 \
            or dim % x.dim() != x.dim() - 1 or x.numel() == 0:  # (amax of an empty row raises; eager gives empty)
        return _TORCH_LOG_SOFTMAX(x, dim, half_to_float)
    xf = aten._to_copy.default(x, dtype=torch.float32)
    shifted = aten.sub.Tensor(xf, aten.amax.default(xf, [dim], True))
    rounded = lambda t: aten._to_copy.default(aten._to_copy.default(t, dtype=x.dtype), dtype=torch.float32)  # noqa
    log_sum = rounded(aten.log.default(rounded(aten.sum.dim_IntList(aten.exp.default(shifted), [dim], True))))
    return aten._to_copy.default(aten.sub.Tensor(shifted, log_sum), dtype=x.dtype, memory_format=torch.contiguous_format)


_TORCH_LOGSUMEXP = _decomp.decomposition_table[aten.logsumexp.default]


@register(aten.logsumexp.default)
def _logsumexp(x, dim, keepdim=False):
    """torch's decomposition, but fp16 / bf16 on CPU in x's dtype, rounded after each op as eager's composite is
    (torch's computed in float32: an ulp off in a fifth of the values)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float16, torch.bfloat16) or x.numel() == 0:
        return _TORCH_LOGSUMEXP(x, dim, keepdim)
    m = aten.amax.default(x, dim, True)
    m = aten.where.self(aten.eq.Scalar(aten.abs.default(m), math.inf), aten.zeros_like.default(m), m)
    s = aten.sum.dim_IntList(aten.exp.default(aten.sub.Tensor(x, m)), dim, keepdim)
    return aten.add.Tensor(aten.log.default(s), m if keepdim else aten.squeeze.dims(m, dim))


_TORCH_LOGIT, _TORCH_LOGIT_BW = map(_decomp.decomposition_table.get, (aten.logit.default, aten.logit_backward.default))


def _logit_bounds(x, eps) -> Optional[tuple]:
    """(lo, hi): eager's logit kernels clamp to ``eps`` and ``1 - eps`` taken in x's dtype (bf16 ``eps=1e-3``: hi is
    1.0, so logit(1.0) is inf), torch's decompositions to the unrounded numbers (6.9); None: no clamp."""
    if type(eps) in (int, float) and x.dtype.is_floating_point and eps >= 0:
        with torch.utils._python_dispatch._disable_current_modes():  # (numbers, not graph nodes)
            lo = torch.tensor(eps, dtype=x.dtype).item()
            return lo, torch.tensor(1 - lo, dtype=x.dtype).item()


register(aten.logit.default)(lambda x, eps=None: _TORCH_LOGIT(x, eps) if (b := _logit_bounds(x, eps)) is None
                             else _TORCH_LOGIT(aten.clamp.default(x, *b), None))
register(aten.logit_backward.default)(lambda dy, x, eps=None: _TORCH_LOGIT_BW(dy, x, eps) if (
    b := _logit_bounds(x, eps)) is None else aten.where.self(aten.logical_and.default(aten.ge.Scalar(
        x, b[0]), aten.le.Scalar(x, b[1])), _TORCH_LOGIT_BW(dy, x, None), aten.zeros_like.default(dy)))
# eager's soft_margin_loss: log1p(exp(-x * target)) an op at a time in x's dtype (fp16 exp(12) is inf; torch's: 12.0)
register(aten.soft_margin_loss.default)(lambda x, t, reduction=1: _decomp.decompositions.apply_loss_reduction(
    aten.log1p.default(aten.exp.default(aten._to_copy.default(aten.mul.Tensor(aten.neg.default(x), t), dtype=x.dtype))),
    reduction))
# an unbatched input's multi_margin_loss without reduction is 0-d in eager; torch's decomposition (also the op's
# Autograd kernel under the Python dispatcher, replaced there too) kept the batch dim it adds: shape (1,)
_TORCH_MML = aten.multi_margin_loss.default.py_kernels.pop(torch._C.DispatchKey.Autograd, None) or \
    _decomp.decomposition_table[aten.multi_margin_loss.default]   # (a torch without that kernel)
register(aten.multi_margin_loss.default)(aten.multi_margin_loss.default.py_impl(torch._C.DispatchKey.Autograd)(
    lambda x, t, p=1, margin=1, weight=None, reduction=1: _TORCH_MML(x, t, p, margin, weight, reduction) if x.dim() > 1
    or reduction != 0 else aten.squeeze.dims(_TORCH_MML(x, t, p, margin, weight, reduction), [0])))
aten.multi_margin_loss.default._dispatch_cache.clear()
# a ZeroTensor (sgn's derivative of a real input) has no storage: a gradient made of it failed the backward's checks
register(aten._efficientzerotensor.default)(lambda size, **kwargs: aten.zeros.default(size, **kwargs))
# torch's ``x.reshape(-1)[index]`` reads a 0-d index's value at trace time (Python indexing): a compile failure
register(aten.take.default)(lambda x, index: aten.index.Tensor(aten.reshape.default(x, [-1]), [index]))


def _variance(take_sqrt: bool, with_mean: bool) -> Callable:
    """var / std (``with_mean``: var_mean / std_mean) as :func:`_var_and_mean`, for the ``correction`` overloads and
    the ``unbiased`` ones (``.dim``)."""
    def decomposition(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
        out = _var_and_mean(x, dim, correction if unbiased is None else (1 if unbiased else 0), keepdim, take_sqrt)
        return out if with_mean else out[0]
    return decomposition


register(aten.var_mean.correction, aten.var_mean.dim)(_variance(False, True))
register(aten.var.correction, aten.var.dim)(_variance(False, False))
register(aten.std.correction)(_variance(True, False))
register(aten.std_mean.correction)(_variance(True, True))


@register(aten.native_layer_norm.default)
@coil.capture.meta_checks.cpu_mixed_norm
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    """out = (x - mean) * rsqrt(var + eps) * w + b over the trailing dims. Returns (out, mean, rstd); mean/rstd have
    x's shape with the normalized dims set to 1, in float32 (x's dtype for half inputs on CPU without float32 weights,
    as ATen does). Computed in :func:`_stat_dtype` (float64 on CPU): float32 rows of values near 1e20 and beyond, whose
    squares overflow float32, normalize to finite values close to float64's where eager's CPU kernel gives NaN
    (docs/ir.md, "Numerics")."""
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    acc, sdt = _acc_dtype(x.dtype), _stat_dtype(x)
    xs = aten._to_copy.default(x, dtype=sdt) if sdt != x.dtype else x
    n = math.prod(x.shape[d] for d in dims)
    mean = _mean(xs, dims, n)
    centered = aten.sub.Tensor(xs, mean)
    var = aten.div.Scalar(aten.sum.dim_IntList(aten.mul.Tensor(centered, centered), dims, True), n)
    rstd = aten.rsqrt.default(aten.add.Scalar(var, eps))
    if sdt != acc:
        # the statistics in float64, the normalization in float32 (twice as fast on CPU; rstd stays a normal
        # float32 up to |x| ~ 1e37). The mean is a float32 head plus tail: x - head is exact for x near the
        # mean, so rows of nearly equal large values (1e4 + 0.01 * randn) keep float64's accuracy
        xa = aten._to_copy.default(x, dtype=acc) if acc != x.dtype else x
        head = aten._to_copy.default(mean, dtype=acc)
        tail = aten._to_copy.default(aten.sub.Tensor(mean, head), dtype=acc)
        rstd = aten._to_copy.default(rstd, dtype=acc)
        centered = aten.sub.Tensor(aten.sub.Tensor(xa, head), tail)
        mean = head
    out = aten.mul.Tensor(centered, rstd)
    out = aten.mul.Tensor(out, weight) if weight is not None else out
    # no bias: + 0.0, so zeros are +0 as eager's x * scale + shift (-0 at a 0 mean: s82 #447)
    out = aten.add.Tensor(out, bias) if bias is not None else aten.add.Scalar(out, 0.0)
    out = aten._to_copy.default(out, dtype=x.dtype) if out.dtype != x.dtype else out
    if not out.is_contiguous():
        # ATen's layer_norm returns a contiguous result whatever x's layout; the
        # pointwise ops above follow x's (e.g. transposed) layout instead
        out = aten.clone.default(out, memory_format=torch.contiguous_format)
    stat_dtype = x.dtype if x.device.type == "cpu" else acc
    return (out, *(aten._to_copy.default(t, dtype=stat_dtype) if t.dtype != stat_dtype else t for t in (mean, rstd)))


def _in_input_format(out, x, always: bool = False):
    """``out`` in x's suggested memory format (eager's upsampling keeps channels-last); with ``always`` also a
    contiguous one (a tuple's first). Free where out is pointwise: the clone computes it."""
    fmt = torch._prims_common.suggest_memory_format(x)
    if always and fmt == torch.contiguous_format and x.ndim == 4 and not x.is_contiguous() \
            and x.is_contiguous(memory_format=torch.channels_last):  # batch norm: as ATen, whatever a size-1 dim's stride
        fmt = torch.channels_last
    if isinstance(out, tuple):
        return (_in_input_format(out[0], x, always), *out[1:])
    return out if fmt == torch.contiguous_format and not always else aten.clone.default(out, memory_format=fmt)


def _source_index(n_in, n_out, align_corners, scale, acc, device):
    """eager's source positions along a dim (UpSample.h's ``area_pixel_compute_scale`` and
    ``area_pixel_compute_source_index``) in ``acc``, eager's opmath (float, double for double): the scale (``1 /
    scale`` of a ``scale_factor``, else ``n_in / n_out``, with ``align_corners`` ``(n_in - 1) / (n_out - 1)``), then
    ``scale * i`` or ``max(scale * (i + 0.5) - 0.5, 0)``, which eager's kernels, built with FMA contraction, round
    once: at ``scale_factor=3`` the float ``1/3 * 1.5 - 0.5`` is 1.49e-8, not 0, and an element of 3.3e38 beside it
    weighs 5e30 (fuzz s315 #432). Taken in float64: for a float ``acc`` the products are exact; for a double one the
    scale is split into two halves whose products are exact, and the position is their sum, rounded once."""
    f64 = torch.float64
    i = aten.arange.start(0, n_out, dtype=f64, device=device)
    if align_corners:
        s = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        s = 1.0 / scale if scale is not None and scale > 0 else n_in / n_out
    if isinstance(s, (int, float)):  # static sizes or a scale factor: split in Python
        s = struct.unpack("f", struct.pack("f", float(s)))[0] if acc != f64 else float(s)
        c = s * 134217729.0  # Veltkamp: 26 bits and the rest (0 for a float)
        hi = c - (c - s)
        parts = [hi, s - hi]
    else:  # a symbolic scale: a 0-d tensor, rounded to float, or split by its bits (27 of the significand's)
        t = aten.scalar_tensor.default(s, dtype=acc, device=device)
        if acc != f64:
            parts = [aten._to_copy.default(t, dtype=f64), 0.0]
        else:
            hi = aten.view.dtype(aten.bitwise_and.Scalar(aten.view.dtype(t, torch.int64), -(1 << 26)), f64)
            parts = [hi, aten.sub.Tensor(t, hi)]
    if align_corners:  # scale * i: exact for a float scale, one rounding in double
        return aten.mul.Tensor(i, s) if isinstance(s, float) else aten.mul.Tensor(
            i, parts[0] if acc != f64 else aten.add.Tensor(parts[0], parts[1]))
    h = aten.add.Tensor(i, 0.5)  # h * hi - 0.5 is exact, + h * lo rounds once
    pos = aten.sub.Tensor(aten.mul.Tensor(h, parts[0]), 0.5)
    if not isinstance(parts[1], float) or parts[1] != 0.0:
        pos = aten.add.Tensor(pos, aten.mul.Tensor(h, parts[1]))
    return aten.clamp_min.default(pos, 0.0)


def _upsample_linear(x, output_size, align_corners, scales):
    """Linear interpolation over x's trailing dims as eager's CPU kernel (UpSampleKernel.cpp's ``Interpolate``):
    along each dim, last first, ``x[i0] * (1 - t) + x[i1] * t`` in float (double for double), ``t`` the source
    position's fraction (:func:`_source_index`), ``i1 = i0`` where the dim keeps its size. Eager's kernels are built
    with FMA contraction: the float sum is ``fma(x[i0], 1 - t, x[i1] * t)``, taken here in float64 (the product exact;
    rounded twice where the sum lands on a float midpoint, within an ulp); the double sum rounds its product first
    (a few ulps where the terms cancel: docs/fuzzing.md, open). torch's decomposition's ``a + (b - a) * t`` overflowed where ``b - a`` does (values
    near ±2e38: inf for -6.25e37, NaN at ``t = 0``; fuzz s228 #2211), and interpolated where a size is kept
    (``scale_factor=1.1`` of 5 elements)."""
    acc = _acc_dtype(x.dtype)
    out = aten._to_copy.default(x, dtype=acc) if acc != x.dtype else x

    def rnd(w):  # eager's fp16/bf16 weights: t, then 1 - t, rounded to x's dtype (its 2-d kernel's stay float)
        return aten._to_copy.default(aten._to_copy.default(w, dtype=x.dtype), dtype=acc) if acc != x.dtype and \
            x.dim() != 4 else w
    for d in reversed(range(2, x.dim())):
        n_in, n_out, sc = x.shape[d], output_size[d - 2], scales[d - 2]
        if n_in == n_out:
            pos = aten.arange.start(0, n_out, dtype=acc, device=x.device)
        else:  # (float64, exact for a float acc, rounded once for a double one)
            pos = aten._to_copy.default(_source_index(n_in, n_out, align_corners, sc, acc, x.device), dtype=acc)
        # floorf: a double position rounded to float first (0.9999999999999999 is row 1, at weight 0)
        row = aten._to_copy.default(pos, dtype=torch.float32) if acc != torch.float32 else pos
        i0 = aten.clamp_max.default(aten._to_copy.default(row, dtype=torch.int64), n_in - 1)
        i1 = i0 if n_in == n_out else aten.clamp_max.default(aten.add.Tensor(i0, 1), n_in - 1)
        t = aten.view.default(aten.clamp.default(aten.sub.Tensor(pos, i0), 0.0, 1.0), [n_out] + [1] * (x.dim() - 1 - d))
        t = rnd(t)
        w0 = rnd(aten.add.Tensor(aten.neg.default(t), 1.0))
        near, far = aten.index_select.default(out, d, i0), aten.index_select.default(out, d, i1)
        if acc == torch.float32:  # fma(near, w0, far * t): near * w0 is exact in float64
            out = aten._to_copy.default(aten.add.Tensor(
                aten.mul.Tensor(aten._to_copy.default(near, dtype=torch.float64), aten._to_copy.default(
                    w0, dtype=torch.float64)), aten._to_copy.default(aten.mul.Tensor(far, t), dtype=torch.float64)),
                dtype=acc)
        else:
            out = aten.add.Tensor(aten.mul.Tensor(near, w0), aten.mul.Tensor(far, t))
    return _in_input_format(aten._to_copy.default(out, dtype=x.dtype) if acc != x.dtype else out, x)


def _eager_cpu_format(op, when: Callable = lambda *args: True, always: bool = False) -> None:
    """torch's decomposition of ``op``, its result in x's memory format on CPU where ``when(*args)``, as eager's CPU
    kernel allocates it (channels-last in, channels-last out; torch's gave NCHW strides; ``always``: batch norm of a
    transposed input is contiguous in eager, its decomposition kept the input's strides)."""
    torchs = _decomp.decomposition_table[op]
    register(op)(lambda x, *args: _in_input_format(torchs(x, *args), x, always)
                 if x.device.type == "cpu" and when(*args) else torchs(x, *args))


_eager_cpu_format(aten.max_unpool2d.default)
_eager_cpu_format(aten.roll.default, lambda shifts, dims=(): dims not in ((), []))
for _bn in (aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
            aten._native_batch_norm_legit.no_stats, aten._native_batch_norm_legit_no_training.default,
            aten._native_batch_norm_legit_functional.default):
    _eager_cpu_format(_bn, always=True)


def _checked(op, *checks: tuple) -> None:
    """``op``'s decomposition after ``aten._assert_async`` that each ``(argument position, message)`` is in [0, 1], as
    eager's kernel checks the values (bernoulli of p = 1.5, binary_cross_entropy of an input or target > 1: the
    decompositions returned numbers). (``fallback_random`` keeps a random op whole: eager's kernel checks.)"""
    torchs = _decomp.decomposition_table[op]

    def decomp(*args, **kwargs):
        for k, msg in checks:
            aten._assert_async.msg(aten.logical_and(aten.ge.Scalar(args[k], 0), aten.le.Scalar(args[k], 1)).all(), msg)
        return torchs(*args, **kwargs)
    register(op)(decomp)


_checked(aten.bernoulli.default, (0, "Expected p_in >= 0 && p_in <= 1 to be true, but got false."))
_checked(aten.binary_cross_entropy.default, (0, "all elements of input should be between 0 and 1"),
         (1, "all elements of target should be between 0 and 1"))


def _fill_value(x, value):
    """The 0-d tensor ``value`` of ``masked_fill`` / ``index_fill`` in ``x``'s dtype. Where its dtype holds numbers
    ``x``'s cannot (float32 70000 for a float16 ``x``, a float or 300 for int8), eager converts it and raises (c10's
    ``overflows``: a float ``x`` takes inf and NaN, an unsigned one down to ``-max`` of a signed value); torch's
    decompositions saturated it (``masked_fill``) or failed (``index_fill``). An ``aten._assert_async`` checks it where
    the dtypes allow such values (not for float32 into float32: FINDINGS_73 7)."""
    d, v = x.dtype, value.dtype
    if not (d.is_complex or v.is_complex or torch.bool in (d, v)):
        r, rv = (torch.finfo(t) if t.is_floating_point else torch.iinfo(t) for t in (d, v))
        lo = r.min if v.is_floating_point or r.min or not v.is_signed else -r.max
        if rv.max > r.max or rv.min < lo or v.is_floating_point and not d.is_floating_point:
            w = aten._to_copy.default(value, dtype=torch.float64)
            ok = aten.logical_and(aten.ge.Scalar(w, lo), aten.le.Scalar(w, r.max))
            ok = aten.logical_or(ok, aten.logical_not(aten.isfinite.default(w))) if d.is_floating_point else ok
            name = {torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16", torch.float32: "float",
                    torch.float64: "double", torch.int32: "int"}.get(d, f"{str(d)[6:]}_t")
            aten._assert_async.msg(ok, f"value cannot be converted to type {name} without overflow")
    return aten._to_copy.default(value, dtype=d) if v != d and not v.is_complex else value


register(aten.masked_fill.Tensor)(lambda x, mask, value: _decomp.decomposition_table[aten.masked_fill.Tensor](
    x, mask, _fill_value(x, value)))
for _op in (aten.index_fill.int_Tensor, aten.index_fill.int_Scalar):  # a negative index wraps, as eager's kernel
    register(_op)(lambda x, dim, index, value, op=_op: _decomp.decomposition_table[op](x, dim, aten.where.self(
        aten.lt.Scalar(index, 0), aten.add.Tensor(index, x.shape[dim] if x.dim() else 1), index),
        _fill_value(x, value) if isinstance(value, torch.Tensor) else value))


_TORCH_LOGSPACE = _decomp.decomposition_table[aten.logspace.default]
# torch's reference refuses a negative base (NotImplementedError); eager's kernel computes it: the op stays whole
register(aten.logspace.default)(lambda start, end, steps, base=10.0, **kw: NotImplemented if base < 0
                                else _TORCH_LOGSPACE(start, end, steps, base, **kw))
# an integer linspace stays whole: eager's kernel converts start and end to the dtype, steps in double (by vectors of
# the CPU's width) and truncates; torch's reference stepped from the unconverted ends (-3.3 to 7.9: FINDINGS_73 6)
for _op in (getattr(aten.linspace, k) for k in ("default", "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor")):
    register(_op)(lambda *a, _t=_decomp.decomposition_table[_op], dtype=None, **kw: NotImplemented if dtype is not None
                  and not (dtype.is_floating_point or dtype.is_complex) else _t(*a, dtype=dtype, **kw))


register(aten.upsample_linear1d.default)(lambda x, size, corners, s=None: _upsample_linear(x, size, corners, [s]))


def _upsample_linear_vec(x, output_size, align_corners, scale_factors):
    size = _decomp.decompositions.upsample_compute_output_size(x.size(), output_size, scale_factors)
    return _upsample_linear(x, size, align_corners, scale_factors or [None] * len(size))


def _nearest_index(n_in, n_out, scale, device):
    """eager's 2-d nearest source index (UpSampleKernel.cpp's ``nearest_idx``): the index where the size is kept,
    ``i >> 1`` where it doubles, else ``min(floor(i * s), n_in - 1)`` in float; torch's decomposition only the last
    (``scale_factor=1.1`` of 5 rows read row 0 twice)."""
    i = aten.arange.start(0, n_out, dtype=torch.int64, device=device)
    if n_out == n_in or n_out == 2 * n_in:
        return i if n_out == n_in else aten.div.Tensor_mode(i, 2, rounding_mode="floor")
    s = 1.0 / scale if scale is not None and scale > 0 else n_in / n_out
    pos = aten.mul.Tensor(aten._to_copy.default(i, dtype=torch.float32), s)
    return aten.clamp_max.default(aten._to_copy.default(pos, dtype=torch.int64), n_in - 1)


@register(aten.upsample_nearest2d.default)
def upsample_nearest2d(x, output_size, scales_h=None, scales_w=None):
    out = x
    for d, sc in ((2, scales_h), (3, scales_w)):
        out = aten.index_select.default(out, d, _nearest_index(x.shape[d], output_size[d - 2], sc, x.device))
    return _in_input_format(out, x)


def _upsample_nearest2d_vec(x, output_size, scale_factors):
    size = _decomp.decompositions.upsample_compute_output_size(x.size(), output_size, scale_factors)
    return upsample_nearest2d(x, size, *(scale_factors or [None, None]))


# the python dispatcher (symbolic traces) runs torch's decompositions of these as their
# CompositeImplicitAutograd and Autograd kernels, before the table is consulted: coil's instead
_LINEAR_VEC = (aten.upsample_linear1d.vec, aten.upsample_bilinear2d.vec, aten.upsample_trilinear3d.vec)
for _op, _fn in [(op, _upsample_linear_vec) for op in _LINEAR_VEC] + [
        (aten.upsample_nearest2d.vec, _upsample_nearest2d_vec), (aten.upsample_nearest2d.default, upsample_nearest2d)]:
    for _key in (torch._C.DispatchKey.CompositeImplicitAutograd, torch._C.DispatchKey.Autograd):
        _op.py_kernels.pop(_key, None)
        _op.py_impl(_key)(_fn)
    _op._dispatch_cache.clear()


_TORCH_LN_BACKWARD = _decomp.decomposition_table[aten.native_layer_norm_backward.default]


@register(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(dy, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """torch's decomposition, given the statistics in float32: it divides a half ``rstd`` (CPU's, as ATen saves
    it) by N in half precision, 2-4 ulps from eager's kernel, which reads them as floats (fuzz s1011 #422)."""
    mean, rstd = (aten._to_copy.default(t, dtype=torch.float32) if t.dtype in (torch.float16, torch.bfloat16)
                  else t for t in (mean, rstd))
    return _TORCH_LN_BACKWARD(dy, x, normalized_shape, mean, rstd, weight, bias, output_mask)


@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(dy, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, mask):
    """BatchNorm's gradients by torch's formulas in its op order (the same kernels), each per-channel vector broadcast
    by one ``view`` where torch's unsqueezes it a dim at a time: 20 traced ops, not 28 (docs/aot.md)."""
    acc, shape = _acc_dtype(x.dtype), [1, x.shape[1]] + [1] * (x.dim() - 2)
    dy, xa, w, mean, invstd = (t if t is None else t.to(acc) for t in (dy, x, weight, save_mean, save_invstd))
    if not train:
        mean, invstd = running_mean.to(acc), aten.rsqrt.default(aten.add.Tensor(running_var.to(acc), eps))
    dims, norm = [0] + list(range(2, x.dim())), 1.0 / (math.prod(x.shape) / x.shape[1])
    mean = aten.view.default(mean, shape)
    dy_sum = aten.sum.dim_IntList(dy, dims)
    dot = aten.sum.dim_IntList(aten.mul.Tensor(dy, aten.sub.Tensor(xa, mean)), dims)
    dy_mean = aten.view.default(aten.mul.Tensor(dy_sum, norm), shape)
    proj = aten.view.default(aten.mul.Tensor(aten.mul.Tensor(dot, norm), aten.mul.Tensor(invstd, invstd)), shape)
    scale = aten.mul.Tensor(aten.view.default(invstd, shape), 1.0) if w is None else \
        aten.view.default(aten.mul.Tensor(invstd, w), shape)
    dx = aten.mul.Tensor(aten.sub.Tensor(aten.sub.Tensor(dy, aten.mul.Tensor(aten.sub.Tensor(xa, mean), proj)),
                                         dy_mean), scale) if train else aten.mul.Tensor(dy, scale)
    wdt = x.dtype if weight is None else weight.dtype
    return dx.to(x.dtype), aten.mul.Tensor(dot, invstd).to(wdt) if mask[1] else None, \
        dy_sum.to(wdt) if mask[2] else None


def get_decompositions(fallback_random: Optional[bool] = None) -> dict:
    """The table ``{OpOverload: decomposition}`` that ``make_fx`` applies in aot/. ``fallback_random`` (default:
    ``coil.config.config.fallback_random``) keeps the random ops of :data:`RANDOM_OPS` whole."""
    if (key := bool(config.fallback_random if fallback_random is None else fallback_random)) not in _TABLES:
        table = dict(_decomp.core_aten_decompositions().items())
        table.update(_decomp.get_decompositions(EXTRA_DECOMPOSE))
        table.update(COIL_DECOMPOSITIONS)  # (none for a KEEP_WHOLE op)
        for op in {getattr(p, name) for p in KEEP_WHOLE + (RANDOM_OPS if key else []) for name in p.overloads()}:
            table.pop(op, None)
        _TABLES[key] = table
    return _TABLES[key]


_TABLES: dict = {}
