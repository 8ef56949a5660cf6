"""Argument checks that eager kernels make and torch's meta (fake-tensor) kernels skip.

Capture runs every torch call on fake tensors to learn its result; an error there is the user's error, reported at the
user's line (:class:`~coil.capture.exceptions.UserCodeError`). A few meta kernels accept arguments eager refuses:
``index_add`` with a source of another dtype (an autocast region's bf16 into an fp32 buffer) gave a silently cast
result. :func:`check_call` raises eager's error for those, before the fake run. Add a check by adding a function to
:data:`CHECKS` under the op's name (no trailing ``_``); it receives the call's fake arguments. Ops whose eager kernels
refuse integer or bool dtypes are listed in :data:`_DTYPE_RESTRICTED` and probed (:func:`_probe_dtypes`); the probe's
result also gives eager's dtype where the meta kernel's differs (``bool ** True`` is bool in eager, int64 in the meta
kernel)."""
from __future__ import annotations

import functools
import math
import warnings
from typing import Callable, Optional

import torch
import torch._decomp
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

from coil import trace
from coil.exc import Unsupported


def _type_name(dtype: torch.dtype) -> str:
    """ATen's scalar-type name: torch.float32 -> "Float", torch.bfloat16 -> "BFloat16"."""
    return torch.empty(0, dtype=dtype, device="meta").type().rsplit(".", 1)[-1].replace("Tensor", "")


def _arg(args, kwargs, i: int, name: str):
    return args[i] if len(args) > i else kwargs.get(name)


def _same_dtype(message: str, at: int, name: str) -> Callable:
    """A check raising RuntimeError ``message`` (formatted with the ATen type names ``a`` and ``b``) when the op's
    input and its tensor argument ``name`` (position ``at``) differ in dtype."""
    def check(args, kwargs) -> None:
        self, other = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, at, name)
        if isinstance(self, torch.Tensor) and isinstance(other, torch.Tensor) and self.dtype != other.dtype:
            raise RuntimeError(message.format(a=_type_name(self.dtype), b=_type_name(other.dtype)))
    return check


_index_copy = _same_dtype("index_copy_(): self and source expected to have the same dtype, but got (self) {a} and "
                          "(source) {b}", 3, "source")
_index_put_dtype = _same_dtype("Index put requires the source and destination dtypes match, got {a} for the "
                               "destination and {b} for the source.", 2, "values")


def _index_put(args, kwargs, index=None) -> None:
    """The dtype check, and the values' shape: the meta kernel accepted values that do not broadcast to the indexing
    result (``x[i] = v``, 3 indices and 2 values) and the kernel read past them. Bool masks select data-dependently."""
    _index_put_dtype(args, kwargs)
    self, value = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 2, "values")
    if index is None:
        index = tuple(slice(None) if i is None else i for i in _arg(args, kwargs, 1, "indices") or ())
    if not isinstance(self, torch.Tensor) or not isinstance(value, torch.Tensor) or any(
            isinstance(i, bool) or isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in pytree.tree_leaves(index)):
        return
    shape = self[index].shape
    if torch.broadcast_shapes(value.shape, shape) != shape:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(value.shape)} cannot be broadcast to "
                           f"indexing result of shape {list(shape)}")
_index_add_dtype = _same_dtype("index_add_(): self ({a}) and source ({b}) must have the same scalar type", 3, "source")


def _index_add(args, kwargs) -> None:
    _index_add_dtype(args, kwargs)
    x, dim, src = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 3, "source")
    if isinstance(x, torch.Tensor) and isinstance(src, torch.Tensor) and isinstance(dim, int) and x.dim() and src.dim():
        rest = [[n for i, n in enumerate(t.shape) if i != dim % x.dim()] for t in (x, src)]  # (the meta kernel
        if rest[0] != rest[1]:  # broadcast the source: fuzz_calls s102 #99)
            raise RuntimeError("source tensor shape must match self tensor shape, excluding the specified dimension. "
                               f"Got self.shape = {list(x.shape)} source.shape = {list(src.shape)}")


def _dim(args, kwargs) -> None:
    """``softmax`` / ``softmin`` / ``sort`` of a ``dim`` out of range: their meta kernels accept it, eager's IndexError.
    A symbolic ``dim`` (a Python int that changed between calls) is specialized, as the op does anyway."""
    x, dim = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim")
    if isinstance(x, torch.Tensor) and (type(dim) is int or isinstance(dim, torch.SymInt)):
        torch._prims_common.canonicalize_dim(x.dim(), int(dim))


def _celu(args, kwargs) -> None:
    """``celu`` with ``alpha`` 0 (symbolic: guarded): eager refuses; meta kernel and decomposition gave values."""
    if (alpha := _arg(args, kwargs, 1, "alpha")) is not None and alpha == 0:
        raise RuntimeError("ZeroDivisionError: alpha cannot be 0 for CELU")


_NUMBER = (int, float, torch.SymInt, torch.SymFloat)


def _bernoulli(args, kwargs, inplace: bool = False) -> None:
    """``bernoulli(x, p)`` / ``x.bernoulli_(p)`` of a number ``p`` outside [0, 1] (a symbolic one is guarded): eager
    refuses it, the graph drew with a clamped probability. (A tensor ``p`` is checked in the graph: aot.)
    ``bernoulli(x)`` of an integer or bool ``x`` (its own probabilities): eager has no kernel (NotImplementedError)."""
    p, x = _arg(args, kwargs, 1, "p"), _arg(args, kwargs, 0, "input")
    if isinstance(p, _NUMBER) and not isinstance(p, bool) and not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    if not inplace and p is None and isinstance(x, torch.Tensor) and not (x.is_floating_point() or x.is_complex()):
        raise NotImplementedError(f'"bernoulli" not implemented for {x.dtype}')


def _scatter(args, kwargs) -> None:
    """``scatter(x, dim, index, value)`` of an integer ``x`` and a number ``value`` it cannot hold (c10's
    ``overflows``: an unsigned type also takes down to ``-max``; a symbolic one is guarded): eager refuses it when
    ``index`` is not empty, the graph wrapped the value (the empty-tensor probe of aot never converts it)."""
    x, index, v = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 2, "index"), _arg(args, kwargs, 3, "value")
    if not (isinstance(x, torch.Tensor) and isinstance(index, torch.Tensor)) or x.is_floating_point() or \
            x.is_complex() or x.dtype is torch.bool or not isinstance(v, _NUMBER) or isinstance(v, bool):
        return
    info = torch.iinfo(x.dtype)
    if index.numel() != 0 and not (info.min or -info.max) <= v <= info.max:
        raise RuntimeError(f"value cannot be converted to type {x.dtype} without overflow")


def _lp_pool(args, kwargs) -> None:
    """``lp_pool1d/2d/3d`` of a ``norm_type`` 0 (a symbolic one is guarded): eager's Python divides by it
    (ZeroDivisionError), the captured functional's trace gave inf."""
    if isinstance(p := _arg(args, kwargs, 1, "norm_type"), _NUMBER) and not isinstance(p, bool) and p == 0:
        raise ZeroDivisionError("float division by zero")


def _pad(args, kwargs) -> None:
    """``F.pad`` of an integer or bool tensor, probed (eager's reflect and replicate kernels refuse bools, which
    torch's decompositions compute: fuzz s228 #1978) on trailing dims long enough for the pads."""
    if isinstance(pad := _arg(args, kwargs, 1, "pad"), (list, tuple)) and pad and all(type(p) is int for p in pad):
        _probe_dtypes(torch.nn.functional.pad, trailing=(2 * max(map(abs, pad)) + 1,) * (len(pad) // 2))(args, kwargs)


def _squeeze(args, kwargs) -> None:
    """``squeeze`` of a dim of unbacked size: the meta kernel keeps it (assumed not 1), eager drops it where it is 1, a
    shape the graph cannot follow: a graph break (``x[mask].squeeze(0)`` of one selected row was (1, n), eager's (n,))."""
    x, dims = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim")
    if not isinstance(x, torch.Tensor) or not free_unbacked_symbols(x.shape):
        return
    dims = range(x.dim()) if dims is None else [dims] if isinstance(dims, int) else dims
    if any(type(d) is int and -x.dim() <= d < x.dim() and free_unbacked_symbols(x.shape[d])
           and not statically_known_true(x.shape[d] != 1) for d in dims):
        raise Unsupported("squeeze of a dim of data-dependent size", hint="the call runs outside the graph")


def _interpolate(args, kwargs) -> None:
    """``F.interpolate`` to or from an empty size (``scale_factor=0.5`` of one element): eager's upsampling kernels
    refuse it, and the modes coil decomposes (linear; under dynamic shapes bilinear, trilinear, nearest, bicubic)
    returned an empty tensor (fuzz s232 #73). ``area`` is adaptive pooling, which accepts it."""
    x, size = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "size")
    scale, mode = _arg(args, kwargs, 2, "scale_factor"), _arg(args, kwargs, 3, "mode") or "nearest"
    if not isinstance(x, torch.Tensor) or mode == "area" or not 3 <= x.dim() <= 5:
        return
    n, spatial = x.dim() - 2, list(x.shape[2:])
    if size is not None:
        out = list(size) if isinstance(size, (list, tuple)) else [size] * n
    elif scale is not None:
        scales = list(scale) if isinstance(scale, (list, tuple)) else [scale] * n
        out = [math.floor(d * float(s)) for d, s in zip(spatial, scales)]
    else:
        return
    if len(out) != n or not all(type(v) is int or isinstance(v, torch.SymInt) for v in spatial + out) or all(
            v > 0 for v in spatial + out):
        return
    names = "DHW"[3 - n:]
    shown = [", ".join(f"{a}: {v}" for a, v in zip(names, vs)) for vs in (spatial, out)]
    raise RuntimeError("Input and output sizes should be greater than 0, but got input "
                       + (f"({shown[0]}) and output ({shown[1]})" if n == 1 else f"({shown[0]}) output ({shown[1]})"))


def _tensors_in(index) -> list:
    items = index if isinstance(index, (tuple, list)) else [index]
    return [i for i in items if isinstance(i, torch.Tensor)]


def _setitem(args, kwargs) -> None:
    """``x[idx] = v`` with a tensor in ``idx`` is ``index_put_``, which refuses a ``v`` of another dtype; a
    0-d ``v`` with a lone bool mask is a masked fill (allowed), and basic indexing is a ``copy_`` (casts)."""
    if len(args) < 3:
        return
    self, index, value = args[0], args[1], args[2]
    if not (isinstance(self, torch.Tensor) and isinstance(value, torch.Tensor)):
        return
    if not (tensors := _tensors_in(index)) and not any(isinstance(i, list) for i in (
            index if isinstance(index, tuple) else (index,))):
        return
    lone_mask = len(tensors) == 1 and tensors[0].dtype == torch.bool and not isinstance(index, (tuple, list))
    if lone_mask and value.dim() == 0:
        return
    _index_put([self, None, value], {}, index)


def _probe_dtypes(target, mixed: bool = False, always: bool = False, trailing: tuple = ()):
    """A check for an op whose eager kernels refuse dtypes its meta kernel accepts (``var`` of ints, ``argmin`` of
    bools, ``silu`` of ints: "not implemented for 'Int'"): when an argument is an integer or bool tensor, the op runs on
    one-element real tensors of the arguments' dtypes, ranks and devices, and what it raises is raised (eager's own
    error, on the argument's device). These ops accept one-element inputs of any rank (no size conditions: not ``topk``,
    ``glu``, ``cross``), their dtype support does not depend on values, and none of them draws random numbers. Returns
    the probe's result (None when nothing was probed). ``trailing``: the probe's last dims' sizes, where an op's
    size conditions need more than one element (``pad``). With ``mixed``, the probe runs where floating tensor arguments
    differ in dtype instead, on zeros of the arguments' shapes (``mv`` refuses float and double, ``huber_loss`` returns
    the input's dtype); ``always``: whatever the dtypes (the caller knows eager refuses them)."""
    def check(args, kwargs):
        leaves = pytree.tree_leaves((args, kwargs))
        tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
        if mixed:  # (symbolic sizes: the call's own, their hints; s409 #145: matmul under dynamic=True)
            hints = {id(t): [d if isinstance(d, int) else d.node.hint for d in t.shape] for t in tensors}
            leaves += [d for h in hints.values() for d in h if d is None]
            needed = always or len({t.dtype for t in tensors if t.is_floating_point()}) > 1
        else:
            needed = any(not (a.is_floating_point() or a.is_complex()) for a in tensors)
        if not needed or any(isinstance(a, (torch.SymInt, torch.SymFloat)) for a in leaves):
            return None

        def real(a):
            if isinstance(a, torch.Tensor):
                last = trailing[len(trailing) - min(len(trailing), a.dim()):]
                shape = hints[id(a)] if mixed else (1,) * (a.dim() - len(last)) + last
                return torch.zeros(shape, dtype=a.dtype, device=a.device) + (not mixed)
            return a
        with unset_fake_temporarily(), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r_args, r_kwargs = pytree.tree_map(real, (list(args), dict(kwargs)))
            if isinstance(target, str):
                return getattr(r_args[0], target)(*r_args[1:], **r_kwargs)
            return target(*r_args, **r_kwargs)
    return check


#: ops whose eager CPU kernels refuse integer or bool inputs that fake tensors accept
_DTYPE_RESTRICTED = ("var std var_mean std_mean argmin argmax frac pow float_power silu gelu mish softplus elu celu "
                     "selu hardswish hardsigmoid hardshrink softshrink logsigmoid softmax log_softmax softmin "
                     "logaddexp logaddexp2 hypot nextafter igamma igammac logcumsumexp abs absolute ceil floor round "
                     "trunc fix fmod remainder mod sub subtract median nanmedian leaky_relu trace lcm gcd bitwise_and "
                     "bitwise_or bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift interpolate upsample "
                     "max_pool1d clamp clamp_min clamp_max clip lerp addcmul addcdiv dot vdot mv matmul").split()

#: ops whose eager kernels refuse floating arguments of different dtypes, or give another result dtype than
#: their meta kernels, that fake tensors accept (probed with ``mixed``)
_MIXED_RESTRICTED = ("mv addmv matmul heaviside cross linalg_cross batch_norm instance_norm layer_norm nll_loss "
                     "cross_entropy binary_cross_entropy huber_loss soft_margin_loss").split()

#: index ops whose meta kernels accept a floating index -> (position, name) of the index argument
_INDEXED = {"index_select": (2, "index"), "index_add": (2, "index"), "index_fill": (2, "index"),
            "index_copy": (2, "index"), "index_reduce": (2, "index"), "put": (1, "index"), "index_put": (1, "indices")}


def _cross(args, kwargs) -> None:
    """``cross`` / ``linalg.cross`` of integer or bool tensors, probed on 3 elements along every dim (any ``dim`` is
    then valid): eager refuses bools ("not implemented for 'Bool'"); the decomposition's bool subtraction raised
    another error at compile time."""
    rank = max((t.dim() for t in args[:2] if isinstance(t, torch.Tensor)), default=0)
    _probe_dtypes(torch.linalg.cross, trailing=(3,) * rank)(args, kwargs)


def _alpha(args, kwargs) -> None:
    """eager's alpha check of ``add`` / ``sub`` on the result dtype (fake tensors' fast path for ``add`` skips it; a
    symbolic alpha skips ``sub``'s probe): a bool alpha needs a bool result, a float one a floating one."""
    a, b, alpha = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "other"), _arg(args, kwargs, 2, "alpha")
    if alpha is None or not isinstance(a, torch.Tensor):
        return
    dtype = torch.result_type(a, {torch.SymInt: 1, torch.SymFloat: 1.0, torch.SymBool: True}.get(type(b), b))
    if isinstance(alpha, (bool, torch.SymBool)) and dtype is not torch.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if isinstance(alpha, (float, complex, torch.SymFloat)) and not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")


#: op name (method or function, no trailing ``_``) -> check of its fake arguments
CHECKS: dict[str, Callable] = {"index_add": _index_add, "index_copy": _index_copy, "index_put": _index_put,
                               "setitem": _setitem, "__setitem__": _setitem, "softmax": _dim, "softmin": _dim,
                               "sort": _dim, "pad": _pad, "squeeze": _squeeze, "interpolate": _interpolate,
                               "upsample": _interpolate, "celu": _celu, "bernoulli": _bernoulli, "scatter": _scatter,
                               "add": _alpha, "sub": _alpha,
                               "bernoulli_": lambda args, kwargs: _bernoulli(args, kwargs, inplace=True),
                               "cross": _cross, "linalg_cross": _cross, **{f"lp_pool{d}d": _lp_pool for d in (1, 2, 3)}}


def check_graph(gm: torch.fx.GraphModule) -> None:
    """:func:`check_call` on every call in a torch-level FX graph from another capture
    (``torch.compile(backend="coil")``: torch's capture runs meta kernels, so these
    checks never ran), with the nodes' example values. Raises RuntimeError."""
    def val(a):
        if isinstance(a, torch.fx.Node):
            return a.meta.get("example_value", a.meta.get("val"))
        return type(a)(val(x) for x in a) if isinstance(a, (tuple, list)) else a
    for node in list(gm.graph.nodes):
        if node.op in ("call_function", "call_method"):
            try:
                dtype = check_call(node.op, node.target, [val(a) for a in node.args],
                                   {k: val(v) for k, v in node.kwargs.items()})
            except Unsupported:  # (a graph break for coil's capture; torch's graph keeps the call)
                continue
            if isinstance(fake := val(node), torch.Tensor) and dtype not in (None, fake.dtype):
                cast, _ = cast_to_eager_dtype(gm.graph, node, fake, dtype)
                node.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not cast)
    gm.recompile()


def cast_to_eager_dtype(graph: torch.fx.Graph, node: torch.fx.Node, fake: torch.Tensor, dtype: torch.dtype) -> tuple:
    """Add ``node.to(dtype)`` after ``node``, a call whose meta kernel gives ``fake`` (its result) another dtype than
    eager's ``dtype``: ``bool ** True`` is bool in eager, int64 (with eager's values, 0 and 1) in the meta kernel.
    Logged (``meta_dtype_cast``). Returns the cast node and its fake value; the caller rewires ``node``'s users."""
    with graph.inserting_after(node):
        cast = graph.create_node("call_method", "to", (node, dtype), {})
    value = fake.to(dtype)
    node.meta.setdefault("example_value", fake)
    cast.meta.update({k: value for k in ("example_value", "val") if k in node.meta})
    trace.log("meta_dtype_cast", stage="capture", op=str(node.target), meta_dtype=str(fake.dtype),
              eager_dtype=str(dtype), reason="the meta kernel's result dtype differs from eager's")
    return cast, value


def check_call(kind: str, target, args: list, kwargs: dict) -> Optional[torch.dtype]:
    """Raise eager's error if ``target(*args, **kwargs)`` (fake arguments; ``kind`` is the FX node kind,
    ``args[0]`` the tensor for a method) is refused by eager but not by its meta kernel. Returns eager's
    result dtype where a probe learnt it (None otherwise). Raises RuntimeError."""
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if name and (check := CHECKS.get(name) or CHECKS.get(name.rstrip("_"))) is not None:
        check(args, kwargs)
    base = name.strip("_") if name else ""
    if base in _INDEXED and any(isinstance(t, torch.Tensor) and t.is_floating_point()
                                for t in pytree.tree_leaves(_arg(args, kwargs, *_INDEXED[base]))):
        _probe_dtypes(target, mixed=True, always=True)(args, kwargs)  # eager's error for a float index
    # operator.ipow / __rpow__ / add_: the op itself
    ints = base and (base in _DTYPE_RESTRICTED or base[:1] in "ir" and base[1:] in _DTYPE_RESTRICTED)
    real = _probe_dtypes(target)(args, kwargs) if ints else None
    if real is None and base in _MIXED_RESTRICTED:  # (mv, matmul: both)
        real = _probe_dtypes(target, mixed=True)(args, kwargs)
    return real.dtype if isinstance(real, torch.Tensor) else None


#: TensorIterator ops whose meta kernels are torch's references or decompositions, which lay the result out as their
#: last op does (``copysign`` is a ``where`` on ``signbit(b)``): ``copysign`` of a (2, 2, 1) and a permuted (2, 2, 2)
#: had strides (2, 4, 1), eager's (4, 2, 1), and a ``view`` of it failed (fuzz s232 #369)
EAGER_LAYOUT_OPS = [getattr(getattr(torch.ops.aten, n.split(".")[0]), n.split(".")[1]) for n in (
    "floor_divide.default div.Tensor_mode copysign.Tensor xlogy.Tensor special_xlog1py.default heaviside.default "
    "logaddexp.default logaddexp2.default logical_and.default logical_or.default logical_xor.default").split()]
#: ops whose eager result is laid out as ``empty_like(self)`` (its clone with preserve_format), where torch's
#: decompositions gave a contiguous one: ``index_fill`` of a permuted non-dense input, ``channel_shuffle`` of a
#: channels-last one (FINDINGS_77 #3, #4b)
LIKE_SELF_OPS = [torch.ops.aten.index_fill.int_Scalar, torch.ops.aten.index_fill.int_Tensor,
                 torch.ops.aten.channel_shuffle.default]
#: ops whose eager result is contiguous whatever the inputs' layout, where torch's meta kernel kept the input's:
#: ``pow.Scalar`` (a number to a tensor's powers; ``(2 ** x.t()).view(-1)`` failed, FINDINGS_77 #2)
CONTIGUOUS_OPS = [torch.ops.aten.pow.Scalar]


def eager_layout(fn: Callable, like: str = "args") -> Callable:
    """``fn`` (an op's meta kernel or decomposition) with its result laid out as eager's kernel lays it out, copied
    (``aten.copy``, one fused loop in a trace) where the strides differ: ``like`` "args", as TensorIterator lays out
    the op's tensor arguments; "self", its first argument alone; "contiguous", row-major whatever the inputs'."""
    def laid_out(*args, **kwargs):
        out = fn(*args, **kwargs)
        want = torch._prims_common.make_contiguous_strides_for(out.shape) if like == "contiguous" else \
            torch._prims_common.compute_elementwise_output_strides(
                *(a.expand(out.shape) for a in args[:1 if like == "self" else None] if isinstance(a, torch.Tensor)))
        if all(statically_known_true(n == 1) or statically_known_true(s == w)
               for n, s, w in zip(out.shape, out.stride(), want)):
            return out
        empty = torch.ops.aten.empty_strided.default(out.shape, want, dtype=out.dtype, device=out.device)
        return torch.ops.aten.copy.default(empty, out)
    return laid_out


def cpu_mixed_norm(fn: Callable) -> Callable:
    """``fn`` (a norm's meta or decomposition) run as eager's CPU "mixed type" kernel (half input, float32 weights or
    stats: float32 statistics, where torch's gave the input's dtype): on the input in float32, the output cast back."""
    def mixed(x, *args, **kwargs):  # (a fake tensor's device is "meta" inside a meta kernel: its fake_device)
        if getattr(x, "fake_device", x.device).type != "cpu" or x.dtype not in (torch.float16, torch.bfloat16) or \
                not any(isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in args):
            return fn(x, *args, **kwargs)
        out = fn(_aten._to_copy.default(x, dtype=torch.float32), *args, **kwargs)
        return (_aten._to_copy.default(out[0], dtype=x.dtype), *out[1:])
    return mixed


_aten = torch.ops.aten
MIXED_NORM_OPS = [_aten.native_group_norm.default, _aten.native_layer_norm.default, _aten.native_batch_norm.default,
                  _aten._native_batch_norm_legit.default, _aten._native_batch_norm_legit.no_stats,
                  _aten._native_batch_norm_legit_functional.default]  # (_no_training calls _native_batch_norm_legit)
_LIB, _TABLE = torch.library.Library("aten", "IMPL"), torch._decomp.decomposition_table
_FAKE = torch._subclasses.fake_impls.op_implementations_dict
for _op, _wrap in [(op, functools.partial(eager_layout, like=like)) for like, ops in (
        ("args", EAGER_LAYOUT_OPS), ("self", LIKE_SELF_OPS), ("contiguous", CONTIGUOUS_OPS)) for op in ops] + \
        [(op, cpu_mixed_norm) for op in MIXED_NORM_OPS]:
    if (_meta := _op.py_kernels.get(torch._C.DispatchKey.Meta)) is not None:  # (torch versions differ)
        _meta = _wrap(_meta)
        try:
            _LIB.impl(_op, _meta, "Meta")  # (fake tensors)
        except RuntimeError:  # a torch that refuses the override: the op keeps torch's layout (import must not fail)
            continue
        _op.py_kernels[torch._C.DispatchKey.Meta] = _meta  # (the python dispatcher: symbolic traces)
        _op._dispatch_cache.clear()
    if _op in _TABLE:  # (fake tensors under symbolic shapes, and core ATen's decompositions, so coil's)
        _TABLE[_op] = _wrap(_TABLE[_op])
    if _op in _FAKE:  # (fake tensors' own rule: native_layer_norm's runs its reference, as the table does)
        _FAKE[_op] = lambda mode, func, *args, **kwargs: _TABLE[func](*args, **kwargs)
