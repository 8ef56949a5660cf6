"""``libdevice`` for generated Triton kernels: the real one on GPUs, a NumPy shim under
``TRITON_INTERPRET=1`` (the interpreter cannot run libdevice calls).

Generated kernels do ``from coil.runtime.triton_libdevice import libdevice`` and call
``libdevice.tanh(x)`` etc.; kernel source is the same on both paths.
"""
from __future__ import annotations

import os
import types

import numpy as np


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _patch_interpreter_bf16_rounding() -> None:
    """Make the Triton interpreter round fp32 -> bf16 to nearest even, like the GPU
    (``cvt.rn.bf16.f32``): its ``cast_impl`` truncates the mantissa (``x.bfloat16()`` of
    -8.4784 gave -8.4375, eager -8.5), so CPU tests of bf16 kernels disagreed with eager
    by one bf16 ulp. bf16 -> fp32 is exact, as on the GPU (a 16-bit shift): the
    interpreter's conversion gave bf16 subnormals other values (4.0408e-39 became
    4.4081e-39). A NaN becomes +NaN (0x7FC0), as eager's scalar conversion and the GPU's
    canonical NaN: torch's vectorized ``.to(bfloat16)`` gives 0xFFFF, whose sign bit
    ``copysign`` reads (fuzz seed 99 #656). Patched once, only under the interpreter (the shims below)."""
    from triton.runtime import interpreter as interp
    import triton.language as tl

    builder = interp.InterpreterBuilder
    if getattr(builder, "_coil_bf16_rtne", False):
        return
    orig = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            import torch
            data = np.asarray(src.data, dtype=np.float32)
            t = torch.from_numpy(data.reshape(-1).copy()).to(torch.bfloat16)
            out = t.view(torch.int16).numpy().view(np.uint16).reshape(data.shape)
            out = np.where(np.isnan(data), np.uint16(0x7FC0), out)  # torch's gave 0xFFFF
            return interp.TensorHandle(out, dst_type.scalar)
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:
            bits = np.asarray(src.data, dtype=np.uint16).astype(np.uint32) << 16
            return interp.TensorHandle(bits.view(np.float32), dst_type.scalar)
        return orig(self, src, dst_type)

    builder.cast_impl = cast_impl
    builder._coil_bf16_rtne = True
    # float32 sin/cos/exp/log in float64, rounded once: NumPy's are an ulp off more (s90 #2138)
    for name in ("sin", "cos", "exp", "log"):
        setattr(builder, "create_" + name, lambda self, arg, f=getattr(np, name): self.unary_op(
            arg, lambda d: f(d.astype(np.float64)).astype(d.dtype)))
    _patch_interpreter_compare_dtype(builder)
    _patch_interpreter_device_assert()


def _patch_interpreter_device_assert() -> None:
    """Check coil's bounds checks of indirect indices (``tl.device_assert`` with an
    "index out of bounds" message, before the access) under the interpreter outside
    Triton's debug mode too (there they were no-ops, and the debug-mode check
    truth-tested a whole block): an index eager rejects then raises instead of reading
    or writing outside the tensor (an index_put at index 5 of a 2-element tensor
    corrupted the process's heap). Other asserts (Triton's own overflow checks) keep
    Triton's behaviour."""
    from triton.runtime import interpreter as interp

    orig = interp.interpreter_semantic.device_assert

    def device_assert(cond, msg, mask=None):
        if not msg.startswith("index out of bounds"):
            return orig(cond, msg, mask)
        ok = np.asarray(cond.handle.data, dtype=np.bool_)
        if mask is not None:
            ok = ok | ~np.asarray(mask.handle.data, dtype=np.bool_)
        if not ok.all():
            raise IndexError(msg)

    interp.interpreter_semantic.device_assert = device_assert


def _patch_interpreter_compare_dtype(builder) -> None:
    """Give the interpreter's comparison results the dtype int1: its ``create_fcmp*`` /
    ``create_icmp*`` keep the operands' dtype on the value, so splatting a scalar
    comparison into a block made a float block (``(x != 0.0) & mask`` of a scalar ``x``
    failed in NumPy's ``bitwise_and``; the GPU compiler has no such problem)."""
    import triton.language as tl
    from triton.runtime import interpreter as interp

    def fix(orig):
        def cmp(self, lhs, rhs):
            out = orig(self, lhs, rhs)
            return interp.TensorHandle(np.asarray(out.data, dtype=np.bool_), tl.int1)
        return cmp

    for name in dir(builder):
        if name.startswith(("create_fcmp", "create_icmp")):
            setattr(builder, name, fix(getattr(builder, name)))


def _make_shim():
    _patch_interpreter_bf16_rounding()
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def wrap(npfn, out_bool=False):
        def f(*args):
            ref = next(a for a in args if isinstance(a, tl.core.tensor))
            datas = [a.handle.data if isinstance(a, tl.core.tensor) else a for a in args]
            if npfn is not np.nextafter:  # float32 in float64, rounded once (as tl.sin)
                datas = [d.astype(np.float64) if getattr(d, "dtype", None) == np.float32 else d
                         for d in datas]
            with np.errstate(all="ignore"):
                out = npfn(*datas)
            # the result has the arguments' broadcast shape, as libdevice calls on a GPU
            # (pow(tl.full([1, 1], -3.0), x) is x's shape, not the first argument's)
            blocks = [a.type for a in args if isinstance(a, tl.core.tensor) and a.type.is_block()]
            elem = tl.int1 if out_bool else ref.type.scalar
            out = np.asarray(out, dtype=np.bool_ if out_bool else ref.handle.data.dtype)
            ty = tl.block_type(elem, list(out.shape)) if blocks else elem
            return tl.core.tensor(TensorHandle(out, elem), ty)
        return f

    def vec(f):
        def safe(x):
            try:
                return f(x)
            except (ValueError, OverflowError):
                return math.inf
        return np.vectorize(safe, otypes=[np.float64])
    import math
    table = {
        "tanh": np.tanh, "log1p": np.log1p, "expm1": np.expm1, "pow": np.power,
        "nearbyint": np.rint, "atan2": np.arctan2, "trunc": np.trunc, "asin": np.arcsin,
        "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
        "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "tan": np.tan,
        "exp2": np.exp2, "log2": np.log2, "log10": np.log10, "fmod": np.fmod,
        "hypot": np.hypot, "copysign": np.copysign, "nextafter": np.nextafter,
        "erfc": vec(math.erfc), "lgamma": vec(math.lgamma), "erf": vec(math.erf),
        "erfinv": vec(_erfinv), "signbit": None, "isinf": None, "isnan": None,
    }
    ns = types.SimpleNamespace()
    for k, v in table.items():
        if v is not None:
            setattr(ns, k, wrap(v))
    ns.signbit = wrap(np.signbit, True)
    ns.isinf = wrap(np.isinf, True)
    ns.isnan = wrap(np.isnan, True)
    return ns


def _erfinv(y: float) -> float:
    """Inverse error function by Newton iterations (interpreter only)."""
    import math
    if y <= -1:
        return -math.inf if y == -1 else math.nan
    if y >= 1:
        return math.inf if y == 1 else math.nan
    a = 0.147
    ln = math.log(1 - y * y)
    t = 2 / (math.pi * a) + ln / 2
    x = math.copysign(math.sqrt(math.sqrt(t * t - ln / a) - t), y)
    for _ in range(3):
        x -= (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def _make_rng_shim():
    """``rand``/``randn`` of (seed, offset) under the interpreter: a NumPy generator per
    seed indexed by offset (a function of seed and offset, like Philox; other numbers)."""
    _patch_interpreter_bf16_rounding()
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def make(kind):
        def f(seed, offset):
            sd = int(np.asarray(seed.handle.data if isinstance(seed, tl.core.tensor) else seed).reshape(-1)[0])
            off = offset.handle.data.astype(np.int64)
            gen = np.random.default_rng(sd & 0x7FFFFFFF)
            n = int(off.max()) + 1 if off.size else 1
            table = gen.random(n) if kind == "rand" else gen.standard_normal(n)
            out = table[off].astype(np.float32)
            return tl.core.tensor(TensorHandle(out, tl.float32), offset.type.with_element_ty(tl.float32)
                                  if offset.type.is_block() else tl.float32)
        return f

    mod = types.ModuleType("coil_rng_shim")
    mod.rand, mod.randn = make("rand"), make("randn")
    return mod


def _make_red_shim():
    """NumPy reductions over interpreter tensors (see coil.runtime.triton_reductions)."""
    _patch_interpreter_bf16_rounding()
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def make(npfn):
        def f(x, axis):
            axis = int(getattr(axis, "value", axis))
            data = x.handle.data
            with np.errstate(all="ignore"):
                out = np.asarray(npfn(data, axis=axis)).astype(data.dtype)
            shape = list(x.type.shape)
            del shape[axis]
            ty = tl.block_type(x.dtype, shape) if shape else x.dtype
            return tl.core.tensor(TensorHandle(out, x.handle.dtype.scalar), ty)
        return f

    mod = types.ModuleType("coil_red_shim")
    mod.sum, mod.prod, mod.max, mod.min = make(np.sum), make(np.prod), make(np.max), make(np.min)
    return mod


def __getattr__(name):
    if name not in ("red", "rng", "libdevice"):
        raise AttributeError(name)
    if interpreting():
        if name not in _SHIMS:
            _SHIMS[name] = {"red": _make_red_shim, "rng": _make_rng_shim, "libdevice": _make_shim}[name]()
        return _SHIMS[name]
    if name == "red":
        import coil.runtime.triton_reductions as red
        return red
    if name == "rng":
        import triton.language as tl
        return tl
    from triton.language.extra import libdevice as real
    return real


_SHIMS: dict = {}  # name -> the interpreter shim module, made once
