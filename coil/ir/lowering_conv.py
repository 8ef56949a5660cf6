"""Lowerings around convolutions: the kernels a CNN runs between its convolutions.

Loop-level values the scheduler fuses with their neighbours instead of ATen's kernels (docs/ir.md, "Convolution
epilogues"): a CUDA convolution's ``+ bias`` (``config.conv_bias_epilogue``), a 1x1 convolution of a 1x1 image as a
generated reduction (``config.conv_matvec_max_macs``), ``max_pool2d_with_indices`` as the window max and its index, and
its backward as a gather of the gradients whose index a pixel is (``config.lower_max_pool``), and the average pool of
windows inside the image with its backward where windows do not overlap (``config.lower_avg_pool``). Each raises
:class:`~coil.ir.lowering.FallbackToExtern` where it does not apply, and the ATen op runs."""
from __future__ import annotations

import functools

import sympy
import torch

from coil import trace
from coil.config import config
from coil.ir.lowering import (FallbackToExtern, device, is_box, loader_as, make_pointwise_box,
                              make_reduction, out_dtype, out_size, register_lowering)
from coil.ir.lowering_views import _c, view_reshape
from coil.ir.nodes import Pointwise, TensorBox, current_graph
from coil.ir.symbols import FloorDiv, Mod, _sign
from coil.ir.virtualized import compute_dtype, ops

aten = torch.ops.aten


def _matvec_conv(x, weight, rest):
    """A 1x1 convolution of a 1x1 image (squeeze-excitation's FC layers, a head on pooled features) small enough to be
    latency-bound, as a generated reduction over input channels (fp32 sums, as cuDNN accumulates); else None."""
    stride, padding, dilation, transposed, output_padding, groups = rest
    try:
        n, cin, h, w = (int(v) for v in x.get_size())
        cout, _, kh, kw = (int(v) for v in weight.get_size())
    except (TypeError, ValueError):
        return None
    if (transposed or groups != 1 or any(padding) or (h, w, kh, kw) != (1, 1, 1, 1)
            or n * cout * cin > config.conv_matvec_max_macs):
        return None
    odt = out_dtype()
    prod = make_pointwise_box(lambda a, b: ops.mul(a, b), [view_reshape(x, [n, 1, cin]),
                                                           view_reshape(weight, [cout, cin])],
                              [n, cout, cin], odt, compute_dtype(odt))
    trace.log("conv_matvec", stage="lowering", node=current_graph().current_node.name,
              macs=n * cout * cin, reason="a 1x1 convolution of a 1x1 image: one reduction kernel")
    return view_reshape(make_reduction(prod, [2], False, "sum", odt), [n, cout, 1, 1])


@register_lowering(aten.convolution.default)
def _convolution(x, weight, bias, *rest):
    from coil.ir.graph import _CHANNELS_LAST_DEVICES
    g = current_graph()
    if device().type not in _CHANNELS_LAST_DEVICES:
        raise FallbackToExtern()
    if (conv := _matvec_conv(x, weight, rest)) is None and not (config.conv_bias_epilogue and is_box(bias)):
        raise FallbackToExtern()
    if conv is None:
        g.fallbacks[str(aten.convolution.default)] += 1
        conv = g.make_extern(aten.convolution.default, (x, weight, None) + tuple(rest), {})
        trace.log("conv_bias_epilogue", stage="lowering", node=g.current_node.name,
                  reason="cuDNN adds a bias with a kernel of its own; the add joins the next kernel")
    if not is_box(bias):
        return conv
    size, odt, cdt = out_size(), out_dtype(), compute_dtype(out_dtype())
    load_conv, load_bias = loader_as(conv, size, cdt), loader_as(bias, [size[1]], cdt)
    return TensorBox.create(Pointwise(device(), odt, lambda i: ops.add(load_conv(i), load_bias([i[1]])), size))


def _pair(v) -> tuple:
    v = [v] if isinstance(v, int) else list(v)
    return int(v[0]), int(v[-1])


def _max_pool_geometry(x, kernel_size, stride, padding, dilation) -> list:
    """``[(k, s, p, d, extent)]`` for rows and columns of a ``max_pool2d`` (or its backward) of ``x`` (an extent may
    be symbolic), or raises FallbackToExtern (config off, not 4-D, not floating point)."""
    if not config.lower_max_pool or len(x.get_size()) != 4 or not x.get_dtype().is_floating_point:
        raise FallbackToExtern()
    k = _pair(kernel_size)
    return list(zip(k, _pair(stride) if stride else k, _pair(padding), _pair(dilation), x.get_size()[2:]))


def _within(e, low: bool, high, top) -> list:
    """Checks that index ``e`` is >= 0 (``low``) and < ``high``, unless ``top`` (the largest ``e``) is below it for
    every size (ints, or the ShapeEnv's ranges of symbolic ones, no guard; ``a // b`` as ``(a - a % b) / b``, so a
    ceil_mode window's first tap ``2 * ((h + 1) // 2 - 1) < h`` needs no check)."""
    gap = sympy.expand(sympy.sympify(high - 1 - top).replace(
        lambda v: isinstance(v, FloorDiv), lambda v: (v.args[0] - Mod(*v.args)) / v.args[1]))
    high = None if _sign(gap) > 0 else high
    v = ops.index_expr(e, torch.int64) if low or high is not None else None
    return ([ops.ge(v, ops.constant(0, torch.int64))] if low else []) + ([ops.lt(v, _c(high))] if high is not None else [])


def _all(checks):
    return functools.reduce(ops.logical_and, checks) if checks else None


@register_lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """The window max and the flat index ``r * W + s`` of its tap in the input plane, as ATen's kernels pick it: the
    first maximum in row-major tap order, the last NaN (``val > best || isnan(val)``), never a padding tap (a window
    of -inf gives its first tap inside the image). Two pointwise values with the same loads: fused into one kernel."""
    (kh, sh, ph, dh, h), (kw, sw, pw, dw, w) = geo = _max_pool_geometry(x, kernel_size, stride, padding, dilation)
    size, odt = out_size(), out_dtype()
    load = loader_as(x, list(x.get_size()), compute_dtype(odt))
    last = [v - 1 for v in size[2:]]

    def window(index):
        n, c, oh, ow = index
        best = at = unset = None
        for i in range(kh):
            for j in range(kw):
                r, s = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                cond = _all([chk for e, t, o, (_, st, p, d, ext) in ((r, i, last[0], geo[0]), (s, j, last[1], geo[1]))
                             for chk in _within(e, t * d < p, ext, o * st - p + t * d)])
                v = load([n, c, r, s]) if cond is None else ops.masked(cond, lambda r=r, s=s: load([n, c, r, s]),
                                                                       float("-inf"))
                flat = ops.index_expr(r * w + s, torch.int64)
                if best is None:  # ATen starts from -inf at the first tap inside the image
                    best, at, unset = v, flat, None if cond is None else ops.logical_not(cond)
                    continue
                take = ops.logical_or(ops.gt(v, best), ops.isnan(v))
                take = take if unset is None else ops.logical_or(take, unset)
                take = take if cond is None else ops.logical_and(take, cond)
                best, at = ops.where(take, v, best), ops.where(take, flat, at)
                unset = None if unset is None or cond is None else ops.logical_and(unset, ops.logical_not(cond))
        return best, at
    node = current_graph().current_node
    trace.log("max_pool_lowered", stage="lowering", node=node.name, kernel=[kh, kw], stride=[sh, sw], backward=False,
              reason="the window max and its index: pointwise values fused with the input's producer")
    return (TensorBox.create(Pointwise(device(), odt, lambda i: window(i)[0], size)),
            TensorBox.create(Pointwise(device(), torch.int64, lambda i: window(i)[1], size)))


@register_lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each input pixel gathers the output gradients of the windows covering it whose index is that pixel, in window
    order, summed in float32 from 0 (as ATen's CUDA kernel). Indices are assumed in their window (the forward's are)."""
    geo = _max_pool_geometry(x, kernel_size, stride, padding, dilation)
    size, odt, gsize = out_size(), out_dtype(), list(grad.get_size())
    cdt = compute_dtype(odt)
    load_g, load_i = loader_as(grad, gsize, cdt), loader_as(indices, gsize, torch.int64)
    outs = gsize[2:]
    # windows oh with oh * s - p <= y <= oh * s - p + (k - 1) * d: oh = (y + p) // s - t for t < (k - 1) * d // s + 1
    spans = [range((k - 1) * d // st, -1, -1) for k, st, p, d, _ in geo]

    def inner(index):
        n, c, y, x_ = index
        here = ops.index_expr(y * geo[1][4] + x_, torch.int64)
        total = ops.constant(0.0, cdt)
        for t in spans[0]:
            for u in spans[1]:
                oh, ow = FloorDiv(y + geo[0][2], geo[0][1]) - t, FloorDiv(x_ + geo[1][2], geo[1][1]) - u
                cond = _all([chk for e, m, o, (_, st, p, d, ext) in ((oh, t, outs[0], geo[0]), (ow, u, outs[1], geo[1]))
                             for chk in _within(e, m > 0, o, FloorDiv(ext - 1 + p, st) - m)])
                pick = lambda oh=oh, ow=ow: ops.where(ops.eq(load_i([n, c, oh, ow]), here),  # noqa: E731
                                                      load_g([n, c, oh, ow]), ops.constant(0.0, cdt))
                total = ops.add(total, pick() if cond is None else ops.masked(cond, pick, 0.0))
        return total
    trace.log("max_pool_lowered", stage="lowering", node=current_graph().current_node.name, backward=True,
              kernel=[geo[0][0], geo[1][0]], stride=[geo[0][1], geo[1][1]],
              reason="each pixel gathers the gradients of the windows whose index it is")
    return TensorBox.create(Pointwise(device(), odt, inner, size))


def _avg_pool_plan(x, kernel_size, stride, padding, ceil_mode, divisor_override, backward: bool):
    """``(kh, kw, sh, sw, divisor)`` of an ``avg_pool2d`` (or its backward) whose windows all lie inside the image, or
    raises FallbackToExtern: padding (a divisor per window under ``count_include_pad=False``), a partial last window
    of ``ceil_mode``, symbolic sizes, and for the backward windows that overlap (stride below kernel)."""
    if not config.lower_avg_pool or len(x.get_size()) != 4 or not x.get_dtype().is_floating_point:
        raise FallbackToExtern()
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride) if stride else (kh, kw)
    try:
        h, w = (int(v) for v in x.get_size()[2:])
    except (TypeError, ValueError):
        raise FallbackToExtern() from None
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    if ceil_mode:  # the same windows unless ceil mode adds a partial one
        if -(-(h - kh) // sh) + 1 != oh or -(-(w - kw) // sw) + 1 != ow:
            raise FallbackToExtern()
    if any(_pair(padding)) or (backward and (sh < kh or sw < kw)) or oh < 1 or ow < 1:
        raise FallbackToExtern()
    trace.log("avg_pool_lowered", stage="lowering", node=current_graph().current_node.name, backward=backward,
              kernel=[kh, kw], stride=[sh, sw], reason="every window inside the image: a pointwise value fused with "
              "its neighbours")
    return kh, kw, sh, sw, divisor_override or kh * kw


@register_lowering(aten.avg_pool2d.default)
def _avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    """The window mean as a pointwise value fused with its input (fp32 sum in eager's window order, then one
    division, as ATen's kernel computes it)."""
    kh, kw, sh, sw, div = _avg_pool_plan(x, kernel_size, stride, padding, ceil_mode, divisor_override, False)
    size, odt = out_size(), out_dtype()
    load = loader_as(x, list(x.get_size()), compute_dtype(odt))

    def inner(index):
        n, c, oh, ow = index
        total = None
        for i in range(kh):
            for j in range(kw):
                v = load([n, c, oh * sh + i, ow * sw + j])
                total = v if total is None else ops.add(total, v)
        return ops.truediv(total, ops.constant(float(div), compute_dtype(odt)))
    return TensorBox.create(Pointwise(device(), odt, inner, size))


@register_lowering(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """Each input pixel's gradient is its one window's output gradient over the divisor (windows that do not
    overlap), 0 in the rows and columns no window covers."""
    kh, kw, sh, sw, div = _avg_pool_plan(x, kernel_size, stride, padding, ceil_mode, divisor_override, True)
    size, odt, cdt = out_size(), out_dtype(), compute_dtype(out_dtype())
    oh, ow = (int(v) for v in grad.get_size()[2:])
    load = loader_as(grad, list(grad.get_size()), cdt)

    def inner(index):
        n, c, y, x_ = index
        r, s = FloorDiv(y, sh), FloorDiv(x_, sw)
        inside = []
        for q, ext, k, st, in_ext in ((y, oh, kh, sh, int(size[2])), (x_, ow, kw, sw, int(size[3]))):
            if (ext - 1) * st + k < in_ext:  # rows / columns past the last window
                inside.append(ops.lt(ops.index_expr(q, torch.int64), ops.constant((ext - 1) * st + k, torch.int64)))
            if st > k:  # the gap between two windows
                inside.append(ops.lt(ops.index_expr(q - FloorDiv(q, st) * st, torch.int64),
                                     ops.constant(k, torch.int64)))
        value = lambda: ops.truediv(load([n, c, r, s]), ops.constant(float(div), cdt))  # noqa: E731
        return ops.masked(_all(inside), value, 0.0) if inside else value()
    return TensorBox.create(Pointwise(device(), odt, inner, size))
