"""The lowering registry: one small function per ATen op, added with one decorator.

``@register_lowering(aten.add)`` registers a function that takes the op's arguments with tensors replaced by
:class:`~coil.ir.nodes.TensorBox` and returns a TensorBox (or a tuple of them). Ops without a lowering run as extern
kernels (the ATen op itself); the graph logs which ops fell back.

Lowerings know the node's output dtype/shape from fake-tensor metadata (:func:`out_meta`), so type promotion follows
eager exactly: arithmetic runs in ``compute_dtype(out_dtype)`` (fp32 for fp16/bf16) and the store rounds once.

Pointwise math is table-driven (:data:`UNARY`, :data:`BINARY`); views, indexing,
concatenation and creation ops live in :mod:`coil.ir.lowering_views`; reductions below."""
from __future__ import annotations

import functools
import math
from collections import Counter
from typing import Any, Callable, Optional, Sequence

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from coil import trace
from coil.config import config
from coil.ir.nodes import GenericView, Loops, Pointwise, Reduction, StorageBox, TensorBox, current_graph
from coil.ir.symbols import FloorDiv, Mod, _sign, as_expr, as_size, broadcasts, is_static, sym, unflatten
from coil.ir.virtualized import compute_dtype, ops, set_ops_handler
from coil.ir.handlers import DependencyRecorder

aten = torch.ops.aten

#: OpOverload (or OpOverloadPacket) -> lowering function.
LOWERINGS: dict[Any, Callable] = {}


def register_lowering(*ops_: Any) -> Callable:
    """Decorator: register ``fn`` as the lowering of every overload of each op given."""
    def deco(fn):
        for op in ops_:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    LOWERINGS.setdefault(getattr(op, name), fn)
            else:
                LOWERINGS[op] = fn
        return fn
    return deco


def require_scalars_fit(dtype, *values) -> None:
    """Raise FallbackToExtern when a Python number in ``values`` does not fit integer ``dtype``, or a size (symbolic)
    may not (``dtype`` narrower than int64): ops that store a scalar as it is (fill, full, masked_fill, where, clamp)
    raise in eager ("value cannot be converted to type uint8_t without overflow"), so the ATen op runs and raises at
    call time. (Arithmetic with a scalar wraps instead.)"""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return
    info = torch.iinfo(dtype)
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not info.min <= v <= info.max \
                or isinstance(v, sympy.Expr) and not v.is_number and dtype != torch.int64:
            raise FallbackToExtern()


class FallbackToExtern(Exception):
    """Raised by a lowering for argument combinations it does not handle natively."""


def out_meta():
    """Fake-tensor value of the FX node being lowered (tensor or tuple)."""
    return current_graph().current_node.meta.get("val")


def _first_out():
    v = out_meta()
    return v[0] if isinstance(v, (tuple, list)) else v


def out_dtype() -> torch.dtype:
    return _first_out().dtype


def out_size() -> list:
    return [as_expr(s) for s in _first_out().shape]


def device() -> torch.device:
    return current_graph().device_for_node()


# ---------------------------------------------------------------------------- helpers

def is_box(x) -> bool:
    return isinstance(x, TensorBox)


def broadcast_loader(x, size: Sequence) -> Callable:
    """Loader of ``x`` (TensorBox or scalar) broadcast to ``size``; scalar -> None."""
    xs = list(x.get_size())
    off = len(size) - len(xs)
    inner = x.make_loader()
    bcast = [broadcasts(xs[d], size[d + off]) for d in range(len(xs))]
    return lambda index: inner([sympy.Integer(0) if bcast[d] else index[d + off] for d in range(len(xs))])


def loader_as(x, size, dtype, via: Optional[torch.dtype] = None) -> Callable:
    """Loader of tensor-or-scalar ``x`` broadcast to ``size`` and cast to ``dtype``; a tensor through ``via``
    first (eager's common dtype of a comparison or logical op: an fp32 0-dim operand beside fp16 is rounded
    to fp16, a float64 6e-308 beside float32 is 0 and so False: s208 #593; Python scalars: round_scalars)."""
    if is_box(x):
        load = broadcast_loader(x, size)
        src = x.get_dtype()
        if via is not None and via != src:
            return lambda index: ops.to_dtype(ops.to_dtype(load(index), via, compute_dtype(src)), dtype,
                                              compute_dtype(via))
        if compute_dtype(src) == dtype:
            return load
        return lambda index: ops.to_dtype(load(index), dtype, compute_dtype(src))
    value = x
    # a size (dynamic shapes), read in the kernel (its // and % printed with floor semantics: floor_safe) unless
    # int() must raise (an extern runs it): a data-dependent one is bound after kernels may run, and // or % by an int
    # argument that may be negative (17 // n) has no floor_safe form
    if isinstance(value, sympy.Expr) and not (value.is_number or free_unbacked_symbols(value)) and \
            all(_sign(t.args[1] - 1) > 0 for t in value.atoms(FloorDiv, Mod)):
        return lambda index: ops.to_dtype(ops.index_expr(value, torch.int64), dtype, torch.int64)
    if isinstance(value, torch.SymFloat) and value.node._expr in current_graph().float_externs:
        raise FallbackToExtern  # (``s % 2.0``: computed by an extern at run time; a guard on its value may not hold)
    value = bool(value) if dtype == torch.bool else \
        int(value) if not dtype.is_floating_point and not dtype.is_complex else float(value)
    return lambda index: ops.constant(value, dtype)


def make_pointwise_box(fn: Callable, args: Sequence, size, out_dt, in_dt, via=None) -> TensorBox:
    """A Pointwise TensorBox computing ``fn(*loaded args)`` with args cast to ``in_dt`` (through ``via``:
    :func:`loader_as`)."""
    loaders = [loader_as(a, size, in_dt, via) for a in args]
    return TensorBox.create(Pointwise(device(), out_dt, lambda index: fn(*[l(index) for l in loaders]), size))


def pointwise_lowering(op_name: str, kind: str = "arith") -> Callable:
    """A lowering that applies ``ops.<op_name>`` elementwise.

    kind: "arith" (inputs cast to the output's compute dtype), "compare" (inputs cast
    to the promoted compute dtype; bool out), "logical" (inputs cast to bool), "float"
    (inputs cast to the float output dtype: sin of an int tensor)."""
    def lower(*args, **kwargs):
        size, odt, via = out_size(), out_dtype(), None
        prom = _promote(args) if kind in ("compare", "logical") else None
        if kind == "compare":
            in_dt = compute_dtype(prom)
            via = prom if in_dt != prom else None  # (fp16/bf16: rounded first)
        elif kind == "logical":
            in_dt, via = torch.bool, prom if len(args) > 1 else None
        else:
            in_dt = compute_dtype(odt)
        f = getattr(ops, op_name)
        if kind in ("arith", "compare"):
            keep = (1,) if op_name in ("mul", "truediv") else ()
            args = round_scalars(args, odt if kind == "arith" else prom, keep)
        return make_pointwise_box(f, args, size, odt, in_dt, via)
    lower.__name__ = f"lower_{op_name}"
    return lower


def round_scalars(args: Sequence, dtype: torch.dtype, keep=()) -> list:
    """``args`` with each operand eager converts to fp16/bf16 ``dtype`` before the op rounded to it: an integer or
    bool tensor (``int64 + bf16``: 257 is 256 first; 70000 is inf in fp16), and on the CPU, where eager's kernels
    convert a scalar operand, each Python number but those at ``keep`` (``half + 70000`` is inf, ``70000 // half``
    NaN: s201 #5477; ``bf16 + 257`` adds 256) except mul's and the divisions' second, kept in float. A 0-dim tensor
    of another dtype is such a scalar too (``half + torch.tensor(0.1)`` adds fp16's 0.0999755859375). CUDA's
    kernels keep scalars in float, as coil does there."""
    if dtype not in (torch.float16, torch.bfloat16):
        return list(args)
    cpu = device().type == "cpu"

    def rounded(k, a):
        scalar = cpu and k not in keep     # a scalar operand eager converts
        if is_box(a) and a.get_dtype() != dtype and not a.get_dtype().is_complex and (
                scalar if not a.get_size() else not a.get_dtype().is_floating_point):
            return make_pointwise_box(lambda v: v, [a], a.get_size(), dtype, compute_dtype(dtype))
        if scalar and isinstance(a, (int, float)) and not isinstance(a, bool):
            return float(torch.tensor(float(a), dtype=dtype))
        return a
    return [rounded(k, a) for k, a in enumerate(args)]


def _promote(args) -> torch.dtype:
    tensors = [torch.empty((1,) * max(len(a.get_size()), 1) if a.get_size() else (), dtype=a.get_dtype(),
                           device="meta") for a in args if is_box(a)]
    scalars = [a for a in args if isinstance(a, (bool, int, float))] + [  # a symbolic number (dynamic shapes)
        1 if a.is_integer else 1.0 for a in args if isinstance(a, sympy.Expr)]  # (s409 #544: bool == s0 as bools)
    items = tensors + scalars
    dt = torch.result_type(items[0], items[1]) if len(items) > 1 else (
        items[0].dtype if isinstance(items[0], torch.Tensor) else torch.tensor(items[0]).dtype)
    for it in items[2:]:
        dt = torch.result_type(torch.empty((1,), dtype=dt, device="meta"), it)
    return dt


UNARY = {aten.abs: "abs", aten.neg: "neg", aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1", aten.log: "log",
         aten.log2: "log2", aten.log10: "log10", aten.log1p: "log1p", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt",
         aten.sin: "sin", aten.cos: "cos", aten.tan: "tan", aten.asin: "asin", aten.acos: "acos", aten.atan: "atan",
         aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh", aten.asinh: "asinh", aten.acosh: "acosh",
         aten.atanh: "atanh", aten.erf: "erf", aten.erfc: "erfc", aten.erfinv: "erfinv", aten.sigmoid: "sigmoid",
         aten.floor: "floor", aten.ceil: "ceil", aten.round: "round", aten.trunc: "trunc", aten.sign: "sign",
         aten.reciprocal: "reciprocal", aten.bitwise_not: "bitwise_not", aten.lgamma: "lgamma"}
BINARY = {aten.add: "add", aten.sub: "sub", aten.mul: "mul", aten.maximum: "maximum", aten.minimum: "minimum",
          aten.atan2: "atan2", aten.pow: "pow", aten.hypot: "hypot", aten.copysign: "copysign", aten.fmod: "fmod",
          aten.remainder: "remainder", aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or",
          aten.bitwise_xor: "bitwise_xor", aten.bitwise_left_shift: "left_shift",
          aten.bitwise_right_shift: "right_shift", aten.nextafter: "nextafter"}
COMPARE = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge"}
LOGICAL = {aten.logical_and: "logical_and", aten.logical_or: "logical_or",
           aten.logical_xor: "logical_xor", aten.logical_not: "logical_not"}
PREDICATES = {aten.isnan: "isnan", aten.isinf: "isinf", aten.signbit: "signbit"}

def _integral_lowering(name: str) -> Callable:
    """A bitwise op: floating-point operands run as the ATen op, which raises eager's error (``float ^ 2.5``: a Triton
    kernel of it does not compile for a GPU, and an empty one raised nothing). ``nextafter`` of fp16 / bf16 too: its
    step is one of that dtype, which float32's step rounded back to the input lost."""
    lower = pointwise_lowering(name)

    def f(*args):
        if (dt := out_dtype()).is_floating_point and (name != "nextafter" or dt in (torch.float16, torch.bfloat16)):
            raise FallbackToExtern
        return lower(*args)
    return f


_BITWISE = {"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "nextafter"}
for _op, _name in [*UNARY.items(), *BINARY.items()]:
    register_lowering(_op)((_integral_lowering if _name in _BITWISE else pointwise_lowering)(_name))
for _table, _kind in ((COMPARE, "compare"), (LOGICAL, "logical"), (PREDICATES, "compare")):
    for _op, _name in _table.items():
        register_lowering(_op)(pointwise_lowering(_name, _kind))


@register_lowering(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add_sub(a, b, alpha=1):
    node = current_graph().current_node
    name = "add" if node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    if name == "sub" and any(isinstance(x, bool) or getattr(getattr(x, "meta", {}).get("val"), "dtype", None)
                             == torch.bool for x in node.args[:2]):
        raise FallbackToExtern  # ATen raises eager's error (a fake tensor does not: d ** bool's backward, s1012 #405)
    if alpha != 1:
        # eager's CPU kernel converts alpha to fp16/bf16 first (0.3 is 0.2998...), CUDA's keeps it in float
        alpha, = round_scalars([alpha], out_dtype())
        fn, dt, via = (lambda x, y, s: getattr(ops, name)(x, ops.mul(y, s))), compute_dtype(out_dtype()), None
        if out_dtype() == torch.float32:  # eager fuses a + alpha * b (fma), one rounding: exact in float64, rounded
            dt, via, b, alpha = torch.float64, torch.float32, *[
                float(torch.tensor(v, dtype=torch.float32)) if isinstance(v, (int, float)) else v for v in (b, alpha)]
            fn = (lambda f: lambda *v: ops.to_dtype(f(*v), torch.float32, torch.float64))(fn)  # (before a fused user)
        return make_pointwise_box(fn, [a, b, alpha], out_size(), out_dtype(), dt, via)
    return pointwise_lowering(name)(a, b)


@register_lowering(aten.pow.Tensor_Scalar)
def _pow_scalar(x, exponent):
    """``x ** -0.5`` is ``1 / sqrt(x)`` and ``x ** 0.5`` is ``sqrt(x)``, as ATen's kernels compute them (-0.0
    gives -inf and -0.0, -inf gives NaN, where ``pow`` gives inf and 0, 0 and inf), except fp16 on CPU (``pow``)."""
    dtype = out_dtype()
    if exponent in (-0.5, 0.5) and dtype.is_floating_point and not isinstance(exponent, bool) \
            and not (dtype == torch.float16 and x.get_device().type == "cpu"):
        return pointwise_lowering("rsqrt" if exponent < 0 else "sqrt")(x)
    if dtype == torch.bfloat16 and x.get_device().type == "cpu" and exponent in (3, -2):
        # eager's CPU kernel: ``x * x * x`` and ``1 / (x * x)`` in bfloat16 arithmetic, the square rounded first
        def f(v):
            sq = ops.to_dtype(ops.to_dtype(ops.mul(v, v), dtype, torch.float32), torch.float32, dtype)
            return ops.mul(sq, v) if exponent == 3 else ops.truediv(ops.constant(1.0, torch.float32), sq)
        return make_pointwise_box(f, [x], out_size(), dtype, torch.float32)
    return pointwise_lowering("pow")(x, exponent)


@register_lowering(aten.round.decimals)
def _round_decimals(x, *, decimals=0):
    """``round(x, decimals)`` as ATen computes it: ``rint(x * 10^d) / 10^d`` for ``d >= 0``, ``rint(x / 10^-d) * 10^-d``
    for ``d < 0`` (half to even), with the power of ten in the compute dtype (ATen's round_decimals_kernel)."""
    odt, cdt = out_dtype(), compute_dtype(out_dtype())
    if not odt.is_floating_point:
        raise FallbackToExtern
    if decimals == 0:
        return pointwise_lowering("round")(x)
    neg = decimals < 0
    p = float(10.0 ** abs(decimals))

    def f(v):
        c = ops.constant(p, cdt)
        return ops.mul(ops.round(ops.truediv(v, c)), c) if neg else ops.truediv(ops.round(ops.mul(v, c)), c)
    return make_pointwise_box(f, [x], out_size(), odt, cdt)


@register_lowering(aten.div.Tensor, aten.div.Scalar)
def _div(a, b):
    return pointwise_lowering("truediv")(a, b)


def _float_floordiv(cdt):
    """Python's float floor division, as eager computes it: ``floor(a / b)`` rounds the quotient first (``1.0 // 0.1``
    would be 10, Python and eager give 9; ``inf // 2`` would be inf, not NaN). With ``m = fmod(a, b)`` (exact), ``d =
    (a - m) / b`` is an integer up to rounding, corrected by 1 when ``m`` and ``b`` have opposite signs, then rounded to
    the nearest integer; a zero result takes the sign of ``a / b``, and ``b == 0`` gives IEEE ``a / b`` (CPython's
    ``float_floor_div``)."""
    def f(x, y):
        zero, one, half = (ops.constant(v, cdt) for v in (0.0, 1.0, 0.5))
        m = ops.fmod(x, y)
        d = ops.truediv(ops.sub(x, m), y)
        opposite = ops.logical_and(ops.ne(m, zero), ops.ne(ops.lt(y, zero), ops.lt(m, zero)))
        d = ops.where(opposite, ops.sub(d, one), d)
        fl = ops.floor(d)
        fl = ops.where(ops.gt(ops.sub(d, fl), half), ops.add(fl, one), fl)
        q = ops.truediv(x, y)
        r = ops.where(ops.eq(d, zero), ops.copysign(zero, q), fl)
        return ops.where(ops.eq(y, zero), q, r)
    return f


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(a, b, rounding_mode=None):
    odt = out_dtype()
    if rounding_mode is None:
        return pointwise_lowering("truediv")(a, b)
    if odt == torch.bool:
        raise FallbackToExtern  # ATen raises eager's error ("div_trunc_cpu" not implemented for 'Bool')
    if odt.is_floating_point:
        cdt = compute_dtype(odt)
        # eager truncates the quotient rounded to a half dtype (floor mode works in the compute dtype)
        f = _float_floordiv(cdt) if rounding_mode == "floor" else \
            (lambda x, y: ops.trunc(ops.to_dtype(ops.to_dtype(ops.truediv(x, y), odt), cdt)))
        return make_pointwise_box(f, round_scalars([a, b], odt, (1,)), out_size(), odt, cdt)
    return pointwise_lowering("floordiv" if rounding_mode == "floor" else "truncdiv")(a, b)


@register_lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(cond, a, b):
    size, odt = out_size(), out_dtype()
    require_scalars_fit(odt, a, b)
    cdt = compute_dtype(odt)
    c = loader_as(cond, size, torch.bool)
    la, lb = loader_as(a, size, cdt), loader_as(b, size, cdt)
    return TensorBox.create(Pointwise(device(), odt, lambda i: ops.where(c(i), la(i), lb(i)), size))


@register_lowering(aten.clamp, aten.clamp.Tensor)
def _clamp(x, min=None, max=None):
    size, odt = out_size(), out_dtype()
    require_scalars_fit(odt, min, max)
    cdt = compute_dtype(odt)
    lx = loader_as(x, size, cdt)
    lmin = loader_as(min, size, cdt) if min is not None else None
    lmax = loader_as(max, size, cdt) if max is not None else None
    # a Python-number bound is a select, so a tie of signed zeros resolves as the device's eager does, whatever the
    # backend's max/min make of it: on CPU a tie keeps x (eager's clamp(-0.0, min=0) is -0.0; numpy's maximum, which
    # Triton's interpreter uses, gives +0.0); on CUDA eager's clamp resolves it as IEEE max/min (max.f32): +0.0 against
    # a +0.0 lower bound, -0.0 against a -0.0 upper one (Triton's maximum kept -0.0 on the H200). A NaN x stays NaN. A
    # tensor bound keeps maximum/minimum (it may hold NaN, which eager propagates).
    cuda = device().type != "cpu"
    sel_min = isinstance(min, (int, float)) and not isinstance(min, bool) and min == min
    sel_max = isinstance(max, (int, float)) and not isinstance(max, bool) and max == max
    tie_min = cuda and sel_min and min == 0 and math.copysign(1.0, min) > 0
    tie_max = cuda and sel_max and max == 0 and math.copysign(1.0, max) < 0

    def inner(i):
        v = lx(i)
        if lmin is not None:
            v = ops.where((ops.le if tie_min else ops.lt)(v, lmin(i)), lmin(i), v) if sel_min \
                else ops.maximum(v, lmin(i))
        if lmax is not None:
            v = ops.where((ops.ge if tie_max else ops.gt)(v, lmax(i)), lmax(i), v) if sel_max \
                else ops.minimum(v, lmax(i))
        return v
    return TensorBox.create(Pointwise(device(), odt, inner, size))


@register_lowering(aten.relu)
def _relu(x):
    """ATen's relu is ``clamp_min(x, 0)``: -0.0 gives +0.0 on CUDA and stays -0.0 on the CPU
    (:func:`_clamp`'s tie rule; a ``where(x < 0, 0, x)`` kept -0.0 on the H200)."""
    return _clamp(x, 0)


@register_lowering(aten._to_copy, aten.clone, aten.alias, aten.lift_fresh_copy, aten.copy)
def _to_copy(x, *args, **kwargs):
    if current_graph().current_node.target == aten.copy.default:
        x = args[0]
    if not is_box(x):
        return _full(out_size(), x, out_dtype())
    size, odt = out_size(), out_dtype()
    if (alias := _clone_in_place(x, odt)) is not None:
        return alias
    # aten.copy(self, src) broadcasts src to self's shape (e.g. ``y[:, 0] = 0``)
    load = broadcast_loader(x, size) if list(x.get_size()) != list(size) else x.make_loader()
    if (src := x.get_dtype()) != odt and compute_dtype(src) != src and _unrounded(x):
        # an fp16/bf16 body computed here is still float32: eager converts the rounded value ((x.half() * 2).float() is
        # inf for x = 65504; 2.9999 rounds to 3 before .int())
        rounded = load
        load = lambda i: ops.to_dtype(rounded(i), src, compute_dtype(src))
    exact = src == odt or (compute_dtype(src) == compute_dtype(odt) and src.itemsize <= odt.itemsize)  # no rounding
    inner = load if exact else lambda i: ops.to_dtype(load(i), odt, compute_dtype(src))
    return TensorBox.create(Pointwise(device(), odt, inner, size))


def _clone_in_place(x, odt) -> Optional[TensorBox]:
    """``x`` itself for a ``clone`` of a view of a concat buffer laid out for that clone (``lowering_views._copy_strides``:
    the concatenation's one use is this clone, after reshapes and permutes) when the view already has the clone's
    strides: nothing else reads that storage, so the copy would only move every element once more."""
    from coil.ir.lowering_views import strided_base
    from coil.ir.nodes import ConcatBuffer
    node, base = current_graph().current_node, strided_base(x) if is_box(x) else None
    meta = node.meta.get("val")
    if node.target is not aten.clone.default or base is None or not isinstance(base[0], ConcatBuffer) \
            or not base[0].storage.for_copy or not isinstance(meta, torch.Tensor):
        return None
    lay = base[1]
    same = lay.dtype == odt and lay.offset == 0 and [as_expr(v) for v in meta.stride()] == list(lay.stride) \
        and [as_expr(v) for v in meta.shape] == list(lay.size)
    return x if same else None


def _unrounded(x) -> bool:
    """Whether reading ``x`` runs an unrealized body that is not a dtype conversion:
    its value is in the compute dtype, not yet rounded to ``x``'s dtype."""
    node = current_graph().current_node
    arg = node.args[1] if node.target == aten.copy.default else node.args[0]
    if isinstance(arg, torch.fx.Node) and arg.target == aten._to_copy.default:
        return False  # rounded by that conversion
    while isinstance(x, (TensorBox, StorageBox, GenericView)):
        x = x.data
    return isinstance(x, Loops)


def _full(size, value, dtype) -> TensorBox:
    return TensorBox.create(Pointwise(device(), dtype, loader_as(value, size, compute_dtype(dtype)), size))


# --------------------------------------------------------------------------- reductions

def _norm_dims(dims, ndim) -> list[int]:
    """Sorted non-negative reduction dims; none for a 0-d tensor (ATen allows its ``dim=0``/``-1``: reduces nothing)."""
    if ndim == 0:
        return []
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % max(ndim, 1) for d in dims})


def make_reduction(x: TensorBox, dims, keepdim: bool, reduction_type: str,
                   dtype: torch.dtype, src_dtype: Optional[torch.dtype] = None) -> TensorBox:
    """Reduce ``x`` over ``dims``; the result is realized (a ComputedBuffer).

    Arg reductions return int64 positions within the reduced dims (row-major)."""
    if x.get_dtype() == torch.bool and reduction_type in ("max", "min", "argmax", "argmin"):
        # reduced as uint8 0/1 (the same order): code generators need the identity of
        # max/min in the value's dtype, and bool has none (no iinfo)
        as_u8 = make_pointwise_box(lambda v: v, [x], list(x.get_size()), torch.uint8, torch.uint8)
        r = make_reduction(as_u8, dims, keepdim, reduction_type,
                           torch.uint8 if dtype == torch.bool else dtype, src_dtype)
        if dtype != torch.bool:
            return r
        return make_pointwise_box(lambda v: v, [r], list(r.get_size()), torch.bool, torch.bool)
    size = list(x.get_size())
    nd = len(size)
    dims = _norm_dims(dims, nd)
    kept = [d for d in range(nd) if d not in dims]
    ranges, rranges = [size[d] for d in kept], [size[d] for d in dims]
    sdt = src_dtype or compute_dtype(dtype if reduction_type not in ("argmax", "argmin", "any") else x.get_dtype())
    load = x.make_loader()
    xdt = x.get_dtype()

    def inner(index, rindex):
        full = [None] * nd
        for d, i in zip(kept + dims, list(index) + list(rindex)):
            full[d] = i
        v = load(full)
        if compute_dtype(xdt) != sdt and reduction_type != "any":
            v = ops.to_dtype(v, sdt, compute_dtype(xdt))
        return v
    dev = x.get_device()
    numel_r = math.prod(as_size(r) for r in rranges)  # an int; a size expression with dynamic shapes
    if numel_r == 1 and reduction_type in ("argmax", "argmin"):
        return _full(_kept_size(size, dims, keepdim), 0, dtype)
    if numel_r == 1:
        # a reduction over one element is that element, converted as the reduction's
        # result would be (``any`` of -3 is True, not -3)
        vdt = compute_dtype(xdt) if reduction_type == "any" else sdt
        red = Pointwise(dev, dtype, lambda index: _cast(inner(index, [0] * len(dims)), vdt, dtype, reduction_type), ranges)
        box = TensorBox(StorageBox(red))
    elif numel_r == 0:
        if reduction_type not in ("sum", "prod", "any"):
            # max/min/arg* of an empty dim: eager raises "Expected reduction dim to have non-zero size" at run time (the
            # ATen op, run as an extern kernel, does; some meta kernels, e.g. bool max.dim, let capture through)
            raise FallbackToExtern(f"{reduction_type} over an empty dim")
        return _full(_kept_size(size, dims, keepdim), {"sum": 0, "prod": 1, "any": False}[reduction_type], dtype)
    else:
        # "leading": the reduction is not over the innermost dim, so the kernel tiles
        # many outputs along contiguous memory (x.sum(0), x[a, r, c].sum(1))
        leading = dims[-1] < (kept[0] if kept else nd) or (kept[-1] == nd - 1 if kept else False)
        if kept and reduction_type in SPLITTABLE and is_static(numel_r) and numel_r >= 2048:
            inner_dim = _memory_inner_dim(x, size, kept)  # a channels-last or transposed input
            leading = leading if inner_dim is None else inner_dim in kept
        if not all(is_static(r) for r in list(ranges) + [numel_r]):
            split, reason = 1, "symbolic_sizes"  # one kernel for every size: never split
        else:
            split, reason = _split_decision(ranges, numel_r, reduction_type, leading, dev)
        if split > 1:
            box = _split_reduction(dev, dtype, sdt, inner, ranges, rranges, numel_r, split,
                                   reduction_type, leading=leading)
        else:
            box = TensorBox(StorageBox(Reduction(dev, dtype, inner, ranges, rranges, reduction_type, sdt)))
            box.data.realize()
        if reason not in _UNLOGGED_SPLIT_REASONS + ("symbolic_sizes",) and trace.enabled():
            _log_split(box, dev, reduction_type, ranges, numel_r, leading, split, reason)
    if keepdim:
        from coil.ir.lowering_views import view_reshape
        box = view_reshape(box, _kept_size(size, dims, True))
    return box


def _memory_inner_dim(x: TensorBox, size: list, kept: list) -> Optional[int]:
    """The dim of ``x`` that most of its loads step through contiguously (index coefficient 1), or None when no load
    says: the memory order a split reduction's partials follow (:func:`_split_reduction`). A channels-last ``(N, C, H,
    W)`` input gives 1, so BatchNorm's statistics over ``(N, H, W)`` split as a leading reduction (partials along C,
    loads coalesced), not as rows of stride-C loads. Loads the same for every output (no kept dim in their index, such
    as LayerNorm's per-token mean and rstd in its weight gradient) do not vote: they are short and broadcast along
    the outputs, as the Triton kernel's outer-reduction test also counts them (codegen/triton/kernel.py)."""
    idx, h = [sym(f"i{d}") for d in range(len(size))], DependencyRecorder()
    with set_ops_handler(h):
        x.make_loader()(idx)
    varying = {idx[d] for d in kept if size[d] != 1}
    votes = Counter(d for _, e in h.loads if isinstance(e, sympy.Expr) and e.free_symbols & varying
                    for d, s in enumerate(idx) if size[d] != 1 and sympy.expand(e).coeff(s) == 1)
    return votes.most_common(1)[0][0] if votes else None


#: Reductions that combine associatively, so they can be split in two stages.
SPLITTABLE = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "any": "any"}


def _split_factor(ranges, numel_r: int, reduction_type: str, leading: bool = False,
                  device: Optional[torch.device] = None) -> int:
    """How many partial reductions to run per output (1: no split); see :func:`_split_decision`."""
    return _split_decision(ranges, numel_r, reduction_type, leading, device)[0]


def _split_decision(ranges, numel_r: int, reduction_type: str, leading: bool = False,
                    device: Optional[torch.device] = None) -> tuple[int, str]:
    """``(S, reason)``: ``S`` partial reductions per output (1: no split) and why. Few outputs with long reductions (a
    full ``x.sum()``, ``bias_grad = g.sum(0)``) would run on too few programs: split the reduction in ``S`` chunks (a
    power of two) so there are ~8k partials of >= 512 elements. ``leading`` (reduced dims first, the kernel tiles 64-256
    outputs per program): 1k-32k outputs split up to 64k partials of >= 1024 rows (>= 512 under 4k partials), and on a
    GPU fewer than 4096 outputs over 256-2047 rows split to about one program per SM, and 256-32k outputs over >= 2048
    rows split into chunks of 256 rows (at most 32k partials). Leading reductions and at most
    :data:`RAGGED_SPLIT_MAX_OUTPUTS` outputs may end in a ragged chunk. On a GPU a row reduction (one program per row)
    splits only with fewer rows than SMs and rows of >= :data:`GPU_SPLIT_MIN_RNUMEL`. docs/codegen.md ("Split reductions
    on a GPU") has the measurements behind each rule."""
    if reduction_type not in SPLITTABLE:
        return 1, "not_splittable"
    numel_out = _numel(ranges)
    if leading and _gpu_split_rule(device) and numel_out < 4096 and 256 <= numel_r < 2048:
        # bias / LayerNorm weight gradients of 8 x 128 tokens: 2-16 programs unsplit
        programs, s = max(1, numel_out // 64), 1
        while programs * s * 2 <= gpu_sm_count(device) and numel_r // (s * 2) >= 64:
            s *= 2
        return (s if s >= 2 else 1), "gpu_leading_few_programs"
    if numel_r < (2048 if leading else 4096):
        return 1, "short_reduction"
    if leading and _gpu_split_rule(device) and 256 <= numel_out < 32768:
        # chunks of 256 rows, at most 32k partials: on the H200 1.2-1.6x faster than chunks of 512-1024 rows
        # (benchmarks/gpu_leading_split.py; LLaMA's RMSNorm weight gradients, 2048 outputs over 2048 rows)
        s = 1
        while numel_r // (s * 2) >= 256 and numel_out * s * 2 <= 32768:
            s *= 2
        return (s if s >= 2 else 1), "gpu_leading_rows"
    if leading and 1024 <= numel_out < 32768:
        s = 1
        while numel_out * s * 2 <= 65536 and numel_r // (s * 2) >= 1024:
            s *= 2
        # fewer than ~4k partial results (about 128 programs of 32 outputs): partials of >= 512 rows. LLaMA's RMSNorm
        # weight gradients (1024 outputs over 2048 rows) ran unsplit on 32 programs of a 132-SM H200 (~0.9 TB/s)
        while numel_out * s < 4096 and numel_r // (s * 2) >= 512:
            s *= 2
        return (s if s >= 2 else 1), "leading_few_programs"
    if numel_out >= 4096:
        return 1, "many_outputs"
    if not leading and _gpu_split_rule(device):
        if numel_out >= gpu_sm_count(device):
            return 1, "gpu_rows_fill_sms"
        if numel_r < GPU_SPLIT_MIN_RNUMEL:
            return 1, "gpu_rows_short"
    # chunks of equal size; a ragged last chunk only for full reductions (one output: unsplit, one program does all the
    # work). A few long rows keep the exact rule, so their reductions stay fused (softmax's max and sum in one kernel)
    exact, s = numel_out > RAGGED_SPLIT_MAX_OUTPUTS, 1
    while (not exact or numel_r % (s * 2) == 0) and numel_out * s * 2 <= 8192 and numel_r // (s * 2) >= 512:
        s *= 2
    return (s if s >= 4 else 1), "few_outputs"


def _numel(ranges) -> int:
    return math.prod(int(r) for r in ranges)


#: Device types whose reductions follow the GPU split rule (:func:`_split_decision`);
#: tests add "cpu" to plan a CPU graph like a CUDA one.
_GPU_SPLIT_DEVICES = ("cuda",)

#: On a GPU, rows shorter than this are not split even when there are fewer rows than SMs: the unsplit kernel is then
#: latency-bound and a split costs mostly its launches (the break-even estimate is in docs/codegen.md).
GPU_SPLIT_MIN_RNUMEL = 16384

#: SMs assumed when no CUDA device can be asked (an H200; ``config.gpu_sm_count``).
DEFAULT_SM_COUNT = 132

#: Decisions not logged as ``reduction_split`` events (every small reduction has one).
_UNLOGGED_SPLIT_REASONS = ("not_splittable", "short_reduction")


def _log_split(box, dev, reduction_type, ranges, numel_r, leading, split, reason) -> None:
    """The ``reduction_split`` compile-log event of one reduction (``box``: its result)."""
    gpu = _gpu_split_rule(dev)
    trace.log("reduction_split", stage="lowering", buffer=box.data.realize().get_name(), device=str(dev),
              reduction_type=reduction_type, outputs=_numel(ranges), rnumel=numel_r, leading=leading, split=split,
              chunk=-(-numel_r // split), rule="gpu" if gpu else "cpu", sm_count=gpu_sm_count(dev) if gpu else None,
              reason=reason)


def _gpu_split_rule(device: Optional[torch.device]) -> bool:
    return device is not None and torch.device(device).type in _GPU_SPLIT_DEVICES


def gpu_sm_count(device: Optional[torch.device]) -> int:
    """The SM count the GPU split rule plans ``device``'s reductions for."""
    if config.gpu_sm_count > 0:
        return config.gpu_sm_count
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda" or not torch.cuda.is_available():
        return DEFAULT_SM_COUNT
    return _cuda_sm_count(dev.index if dev.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


#: Non-leading reductions with at most this many outputs may split into a ragged last chunk (see :func:`_split_factor`).
RAGGED_SPLIT_MAX_OUTPUTS = 1


def _split_reduction(dev, dtype, sdt, inner, ranges, rranges, numel_r, split, reduction_type,
                     leading: bool) -> TensorBox:
    """Two-stage reduction: ``split`` partial results per output, then reduce those. With ``leading`` (the reduced dims
    come before the kept ones, e.g. ``sum(0)``) the chunk index is the outer dim of the partial buffer so that
    neighbouring programs read neighbouring memory."""
    chunk = -(-numel_r // split)
    ragged = chunk * split != numel_r
    nk = len(ranges)
    part_ranges = ([split] + list(ranges)) if leading else (list(ranges) + [split])
    acc_dt = sdt if reduction_type != "any" else torch.bool
    identity = _identity(reduction_type, sdt)

    def stage1(index, rindex):
        s, idx = (index[0], index[1:]) if leading else (index[nk], index[:nk])
        flat = s * chunk + rindex[0]
        if not ragged:
            return inner(list(idx), unflatten(flat, rranges))
        # the last chunk runs past the reduction: those lanes give the identity
        idt = torch.int32 if numel_r < 2 ** 31 - 1 else torch.int64
        valid = ops.lt(ops.index_expr(flat, idt), ops.constant(numel_r, idt))
        return ops.masked(valid, lambda: inner(list(idx), unflatten(flat, rranges)), identity)
    part = Reduction(dev, acc_dt, stage1, part_ranges, [chunk], reduction_type, sdt)
    load = TensorBox(StorageBox(part)).data.realize().make_loader()

    def stage2(index, rindex):
        return load(([rindex[0]] + list(index)) if leading else (list(index) + [rindex[0]]))
    final = Reduction(dev, dtype, stage2, ranges, [split], reduction_type, compute_dtype(acc_dt)
                      if reduction_type != "any" else torch.bool)
    box = TensorBox(StorageBox(final))
    box.data.realize()
    return box


def _identity(reduction_type: str, dtype: torch.dtype):
    """The neutral element of a splittable reduction in ``dtype`` (a Python scalar)."""
    if reduction_type == "sum":
        return 0.0 if dtype.is_floating_point else 0
    if reduction_type == "prod":
        return 1.0 if dtype.is_floating_point else 1
    if reduction_type == "any":
        return False
    if dtype.is_floating_point:
        return float("-inf") if reduction_type == "max" else float("inf")
    if dtype == torch.bool:
        return reduction_type == "min"
    info = torch.iinfo(dtype)
    return info.min if reduction_type == "max" else info.max


def _cast(v, sdt, dtype, reduction_type):
    """The result of reducing one element ``v`` (of compute dtype ``sdt``) to ``dtype``."""
    if reduction_type == "any":
        return ops.ne(v, ops.constant(0, sdt)) if sdt != torch.bool else v
    if reduction_type == "sum" and sdt.is_floating_point:
        v = ops.add(v, ops.constant(0.0, sdt))  # 0 + v, as a sum starts: -0.0 sums to +0.0
    return ops.to_dtype(v, dtype, sdt) if compute_dtype(dtype) != sdt else v


def _kept_size(size, dims, keepdim):
    if keepdim:
        return [sympy.Integer(1) if d in dims else s for d, s in enumerate(size)]
    return [s for d, s in enumerate(size) if d not in dims]


@register_lowering(aten.sum.dim_IntList)
def _sum(x, dim=None, keepdim=False, *, dtype=None):
    return make_reduction(_converted(x, dtype), dim, keepdim, "sum", out_dtype())


def _converted(x: TensorBox, dtype: Optional[torch.dtype]) -> TensorBox:
    """``x.to(dtype)``: a reduction's ``dtype=`` converts the input first, so ``x.sum(dtype=torch.float16)`` adds
    fp16-rounded elements (inf + -inf is NaN for 70000 and -70000) even though the sum itself runs in float32."""
    if dtype is None or x.get_dtype() == dtype:
        return x
    load, src = x.make_loader(), x.get_dtype()
    return TensorBox.create(Pointwise(x.get_device(), dtype, lambda i: ops.to_dtype(load(i), dtype, compute_dtype(src)),
                                      list(x.get_size())))


@register_lowering(aten.prod.dim_int, aten.prod.default)
def _prod(x, dim=None, keepdim=False, *, dtype=None):
    """On CPU a float32/fp16/bf16 product accumulates in float64 (docs/ir.md, Numerics): partial products of another
    order than eager's overflowed in one lane and underflowed in another, and inf * 0 gave NaN where eager gave inf."""
    x, odt = _converted(x, dtype), out_dtype()
    if device().type != "cpu" or odt not in (torch.float32, torch.float16, torch.bfloat16):
        return make_reduction(x, dim, keepdim, "prod", odt)
    r = make_reduction(x, dim, keepdim, "prod", torch.float64)
    return make_pointwise_box(lambda v: v, [r], out_size(), odt, compute_dtype(odt))


@register_lowering(aten.amax, aten.amin)
def _amax_amin(x, dim=(), keepdim=False):
    is_max = current_graph().current_node.target.overloadpacket is aten.amax
    return make_reduction(x, dim, keepdim, "max" if is_max else "min", out_dtype())


@register_lowering(aten.max.default, aten.min.default)
def _max_min_all(x):
    if any(int(d) == 0 for d in x.get_size()):
        raise FallbackToExtern()  # eager raises (no identity for max/min): run the ATen op, which does at call time
    is_max = current_graph().current_node.target == aten.max.default
    return make_reduction(x, None, False, "max" if is_max else "min", out_dtype())


@register_lowering(aten.max.dim, aten.min.dim)
def _max_min_dim(x, dim, keepdim=False):
    is_max = current_graph().current_node.target == aten.max.dim
    idx = make_reduction(x, dim, keepdim, "argmax" if is_max else "argmin", torch.int64)
    if not x.get_dtype().is_floating_point or not x.get_size():
        return make_reduction(x, dim, keepdim, "max" if is_max else "min", x.get_dtype()), idx
    # eager's value is the element at the index: of tied -0.0 and 0.0 the first (a tree
    # reduction's min may be either: b / v gave -inf for inf, fuzz s213 #7447)
    d = dim % len(x.get_size())
    xl, il, n = x.make_loader(), idx.make_loader(), x.get_size()[d]

    def at_index(i):
        j = list(i)
        k = ops.indirect_indexing(il(j), n, wrap_neg=False)
        return xl(j[:d] + [k] + j[d + 1:] if keepdim else j[:d] + [k] + j[d:])
    return TensorBox.create(Pointwise(device(), x.get_dtype(), at_index, list(idx.get_size()))), idx


@register_lowering(aten.argmax, aten.argmin)
def _argmax(x, dim=None, keepdim=False):
    t = "argmax" if current_graph().current_node.target == aten.argmax.default else "argmin"
    if dim is None:
        from coil.ir.lowering_views import view_reshape
        x = view_reshape(x, [x.get_numel()])
        r = make_reduction(x, [0], False, t, torch.int64)
        return view_reshape(r, out_size()) if keepdim else r
    return make_reduction(x, [dim], keepdim, t, torch.int64)


@register_lowering(aten.any.dim, aten.any.default, aten.any.dims)
def _any(x, dim=None, keepdim=False):
    r = make_reduction(x, dim, keepdim, "any", torch.bool, src_dtype=torch.bool)
    odt = out_dtype()  # eager's any/all of a uint8 tensor is uint8 (0/1)
    return r if odt == torch.bool else make_pointwise_box(lambda v: v, [r], out_size(), odt, compute_dtype(odt))


@register_lowering(aten.mean.dim, aten.mean.default)
def _mean(x, dim=None, keepdim=False, *, dtype=None):
    odt, size = out_dtype(), x.get_size()
    dims = _norm_dims(dim, len(size))
    n = math.prod((size[d] for d in dims), start=sympy.Integer(1))  # a symbolic count is read in the kernel (loader_as)
    cdt = compute_dtype(odt)
    # the sum stays in the compute dtype (fp32 for fp16/bf16) until divided, as eager's
    # accumulation does: an fp16 sum of 4096 values ~16 is inf before the division
    s = make_reduction(x, dims, keepdim, "sum", cdt if odt.is_floating_point else odt)
    return make_pointwise_box(ops.truediv, [s, n], out_size(), odt, cdt)
