"""The virtualized ``ops`` namespace that define-by-run loop bodies call.

A loop body is a Python function of its index (a list of sympy expressions) that calls ``ops.load(name, index)``,
``ops.add(a, b)``, ``ops.store(name, index, v)`` ... Which code runs depends on the *handler* installed with
:func:`set_ops_handler`: the Triton code generator emits Triton source, the reference interpreter computes with torch
ops, the dependency recorder collects reads and writes, the text printer prints the body.

:class:`OpsHandler` documents every op a body may call (the loop IR's instruction set). Values passed between ops are
whatever the current handler returns. Dtype rules: lowerings insert explicit ``to_dtype`` so binary ops see operands of
one dtype, except that comparisons return bool and ``where`` takes a bool condition."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch

#: Unary math ops: ``ops.<name>(x)``; same dtype out as in (float ops on float inputs). ``ndtr`` is the
#: standard normal CDF Φ(x) = (1 + erf(x/√2))/2 (exact GELU is x·Φ(x)); backends may compute it to within a
#: few fp32 ulp of the true value rather than through erf.
UNARY_OPS = ["abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos",
             "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv",
             "sigmoid", "floor", "ceil", "round", "trunc", "sign", "reciprocal", "bitwise_not", "logical_not", "isnan",
             "isinf", "lgamma", "signbit", "ndtr"]
#: Binary ops: ``ops.<name>(a, b)``; comparisons and logical ops return bool.
BINARY_OPS = ["add", "sub", "mul", "truediv", "floordiv", "truncdiv", "fmod", "remainder", "pow", "maximum",
              "minimum", "atan2", "hypot", "copysign", "nextafter", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
              "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"]
REDUCTION_TYPES = ["sum", "prod", "max", "min", "argmax", "argmin", "any"]


class OpsHandler:
    """The loop-IR instruction set. Subclasses implement what they need.

    Memory:
      load(name, index) -> value          element ``index`` (sympy expr, in elements,
                                           offset included) of buffer ``name``
      store(name, index, value)           write value at ``index``
      reduction(dtype, src_dtype, reduction_type, value) -> value
                                           reduce ``value`` over the reduction dims
      store_reduction(name, index, value)  store a reduction result at (output) ``index``
    Values:
      constant(value, dtype) -> value; index_expr(expr, dtype) -> value (the integer
      value of a sympy index expression); to_dtype(x, dtype, src_dtype=None) -> value
      (rounds to ``dtype``, fp16/bf16 included, then holds it in compute_dtype(dtype));
      indirect_indexing(x, size, check=True, wrap_neg=True) -> sympy.Symbol: use the
      integer value ``x`` inside index expressions; with ``wrap_neg`` negative values wrap
      by ``size`` (advanced indexing ``x[idx]``), without it they are out of range
      (index_select, gather, scatter: eager raises); with ``check`` out of range values
      are an error where the backend can tell.
      masked(mask, body, other) -> value: ``body()`` evaluated only where ``mask`` (loads
      inside are masked), ``other`` elsewhere.
      where(cond, a, b), clamp via maximum/minimum, and UNARY_OPS / BINARY_OPS.
    Random:
      load_seed(name, offset) -> value (int64 seed); rand(seed, offset) -> float32 in
      [0, 1); randn(seed, offset) -> float32 N(0, 1); ``offset`` from index_expr."""

    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement ops.{name}")


class _HandlerState(threading.local):
    def __init__(self) -> None:
        self.stack: list[OpsHandler] = []


_state = _HandlerState()


@contextlib.contextmanager
def set_ops_handler(handler: OpsHandler) -> Iterator[OpsHandler]:
    """Install ``handler`` as the target of ``ops.*`` inside the block (nests)."""
    _state.stack.append(handler)
    try:
        yield handler
    finally:
        _state.stack.pop()


def current_handler() -> OpsHandler:
    if not _state.stack:
        raise RuntimeError("ops.* called outside set_ops_handler(...)")
    return _state.stack[-1]


class _OpsProxy:
    """``ops.foo(*args)`` → ``current_handler().foo(*args)``."""

    def __getattr__(self, name: str) -> Callable:
        def call(*args, **kwargs):
            return getattr(current_handler(), name)(*args, **kwargs)
        call.__name__ = name
        return call


ops = _OpsProxy()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic runs in: fp16/bf16 (and fp8) compute in fp32."""
    if dtype in (torch.float16, torch.bfloat16) or (dtype.is_floating_point and dtype.itemsize == 1):
        return torch.float32
    return dtype
