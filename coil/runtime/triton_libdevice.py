"""``libdevice`` for generated Triton kernels: the real one on GPUs, a NumPy shim under
``TRITON_INTERPRET=1`` (the interpreter cannot run libdevice calls).

Generated kernels do ``from coil.runtime.triton_libdevice import libdevice`` and call
``libdevice.tanh(x)`` etc.; kernel source is the same on both paths."""
from __future__ import annotations

import importlib
import os
import types

import numpy as np
import torch

from coil.exc import KernelIndexError


def _patch_interpreter_bf16_rounding() -> None:
    """Make the Triton interpreter round fp32 -> bf16 to nearest even, like the GPU (``cvt.rn.bf16.f32``): its
    ``cast_impl`` truncates the mantissa (``x.bfloat16()`` of -8.4784 gave -8.4375, eager -8.5), so CPU tests of bf16
    kernels disagreed with eager by one bf16 ulp. bf16 -> fp32 is exact, as on the GPU (a 16-bit shift): the interpreter
    gave bf16 subnormals other values (4.0408e-39 became 4.4081e-39). A NaN becomes +NaN (0x7FC0), as eager's scalar
    conversion and the GPU's canonical NaN: torch's vectorized ``.to(bfloat16)`` gives 0xFFFF, whose sign bit
    ``copysign`` reads (fuzz seed 99 #656). Patched once, only under the interpreter (shims below)."""
    from triton.runtime import interpreter as interp
    import triton.language as tl
    builder = interp.InterpreterBuilder
    if getattr(builder, "_coil_bf16_rtne", False):
        return
    orig = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
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
    _patch_interpreter_fp16_atomic_add(builder)


def _patch_interpreter_fp16_atomic_add(builder) -> None:
    """An fp16 ``tl.atomic_add`` rounds each sum to fp16, past 65504 to inf, as the GPU:
    the interpreter's raised OverflowError('overflow to signed inf') (fuzz s102 #2906)."""
    from triton._C.libtriton import interpreter as native, ir
    orig = builder.create_atomic_rmw

    def create_atomic_rmw(self, op, ptr, val, mask, sem, scope):
        if val.data.dtype != np.float16 or op != ir.ATOMIC_OP.FADD:
            return orig(self, op, ptr, val, mask, sem, scope)
        p, v, m = (np.ravel(a) for a in np.broadcast_arrays(ptr.data, val.data, mask.data))
        old = np.zeros(v.shape, np.float16)
        for i in np.flatnonzero(m):  # one at a time: repeated addresses add in turn
            at = slice(i, i + 1)
            old[at] = native.load(p[at], m[at], old[at], old.dtype)
            with np.errstate(over="ignore"):
                native.store(p[at], (old[at] + v[at].astype(np.float64)).astype(np.float16), m[at])
        return type(val)(old.reshape(np.shape(val.data)), val.dtype.scalar)
    builder.create_atomic_rmw = create_atomic_rmw


def _patch_interpreter_device_assert() -> None:
    """Check coil's bounds checks of indirect indices (``tl.device_assert`` with an "index out of bounds"
    message, before the access) under the interpreter outside Triton's debug mode too (there they were no-ops,
    and the debug-mode check truth-tested a whole block): an index eager rejects then raises instead of
    reading or writing outside the tensor (an index_put at index 5 of a 2-element tensor corrupted the
    process's heap), as ``coil.exc.KernelIndexError``, what C++ kernels raise (not inside Triton's
    ``InterpreterError``). Other asserts (Triton's own overflow checks) keep Triton's behaviour."""
    from triton.runtime import interpreter as interp
    orig, run = interp.interpreter_semantic.device_assert, interp.GridExecutor.__call__

    def device_assert(cond, msg, mask=None):
        if not msg.startswith("index out of bounds"):
            return orig(cond, msg, mask)
        ok = np.asarray(cond.handle.data, dtype=np.bool_)
        if mask is not None:
            ok = ok | ~np.asarray(mask.handle.data, dtype=np.bool_)
        if not ok.all():
            raise KernelIndexError(msg)

    def launch(self, *args, **kwargs):
        try:
            return run(self, *args, **kwargs)
        except interp.InterpreterError as e:
            if isinstance(e.__cause__, KernelIndexError):
                raise KernelIndexError(f"{e.__cause__} (coil Triton kernel {self.fn.__name__})") from None
            raise
    interp.interpreter_semantic.device_assert, interp.GridExecutor.__call__ = device_assert, launch


def _patch_interpreter_compare_dtype(builder) -> None:
    """Give the interpreter's comparison results the dtype int1: its ``create_fcmp*`` / ``create_icmp*`` keep the
    operands' dtype on the value, so splatting a scalar comparison into a block made a float block (``(x != 0.0) &
    mask`` of a scalar ``x`` failed in NumPy's ``bitwise_and``; the GPU compiler has no such problem)."""
    import triton.language as tl
    from triton.runtime import interpreter as interp

    def fix(orig):
        def cmp(self, lhs, rhs):
            return interp.TensorHandle(np.asarray(orig(self, lhs, rhs).data, dtype=np.bool_), tl.int1)
        return cmp
    for name in dir(builder):
        if name.startswith(("create_fcmp", "create_icmp")):
            setattr(builder, name, fix(getattr(builder, name)))


def _make_shim():
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def wrap(npfn, out_bool=False):
        def f(*args):
            ref = next(a for a in args if isinstance(a, tl.core.tensor))
            datas = [a.handle.data if isinstance(a, tl.core.tensor) else a for a in args]
            if npfn is not np.nextafter:  # float32 in float64, rounded once (as tl.sin)
                datas = [d.astype(np.float64) if getattr(d, "dtype", None) == np.float32 else d for d in datas]
            with np.errstate(all="ignore"):
                out = npfn(*datas)
            # the result has the arguments' broadcast shape, as libdevice calls on a GPU
            # (pow(tl.full([1, 1], -3.0), x) is x's shape, not the first argument's)
            blocks = [a.type for a in args if isinstance(a, tl.core.tensor) and a.type.is_block()]
            elem = tl.int1 if out_bool else ref.type.scalar
            out = np.asarray(out, dtype=np.bool_ if out_bool else ref.handle.data.dtype)
            return tl.core.tensor(TensorHandle(out, elem), tl.block_type(elem, list(out.shape)) if blocks else elem)
        return f

    def f64(f):  # torch's float64 function (erfinv, lgamma of a pole: inf)
        return lambda d: f(torch.as_tensor(d, dtype=torch.float64)).numpy()
    table = {"tanh": np.tanh, "log1p": np.log1p, "expm1": np.expm1, "pow": np.power, "nearbyint": np.rint,
             "atan2": np.arctan2, "trunc": np.trunc, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
             "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
             "tan": np.tan, "exp2": np.exp2, "log2": np.log2, "log10": np.log10, "fmod": np.fmod, "hypot": np.hypot,
             "copysign": np.copysign, "nextafter": np.nextafter, "erfc": f64(torch.erfc), "lgamma": f64(torch.lgamma),
             "erf": f64(torch.erf), "erfinv": f64(torch.erfinv)}
    ns = types.SimpleNamespace(**{k: wrap(v) for k, v in table.items()})
    ns.signbit, ns.isinf, ns.isnan = (wrap(f, True) for f in (np.signbit, np.isinf, np.isnan))
    return ns


def _make_rng_shim():
    """``rand``/``randn`` of (seed, offset) under the interpreter: a NumPy generator per
    seed indexed by offset (a function of seed and offset, like Philox; other numbers)."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def make(kind):
        def f(seed, offset):
            sd = int(np.asarray(seed.handle.data if isinstance(seed, tl.core.tensor) else seed).reshape(-1)[0])
            off = offset.handle.data.astype(np.int64)
            gen = np.random.default_rng(sd & 0x7FFFFFFF)
            n = int(off.max()) + 1 if off.size else 1
            table = gen.random(n, np.float32) if kind == "rand" else gen.standard_normal(n)   # [0, 1) in float32
            out = table[off].astype(np.float32)
            return tl.core.tensor(TensorHandle(out, tl.float32), offset.type.with_element_ty(tl.float32)
                                  if offset.type.is_block() else tl.float32)
        return f
    return types.SimpleNamespace(rand=make("rand"), randn=make("randn"))


def _make_red_shim():
    """NumPy reductions over interpreter tensors (see coil.runtime.triton_reductions)."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def make(npfn):
        def f(x, axis):
            axis = int(getattr(axis, "value", axis))
            data = x.handle.data
            with np.errstate(all="ignore"):
                out = np.asarray(npfn(data, axis=axis)).astype(data.dtype)
            shape = [n for i, n in enumerate(x.type.shape) if i != axis]
            ty = tl.block_type(x.dtype, shape) if shape else x.dtype
            return tl.core.tensor(TensorHandle(out, x.handle.dtype.scalar), ty)
        return f
    return types.SimpleNamespace(sum=make(np.sum), prod=make(np.prod), max=make(np.max), min=make(np.min))


def __getattr__(name):
    if name not in ("red", "rng", "libdevice"):
        raise AttributeError(name)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):  # the CPU interpreter
        if name not in _SHIMS:
            _patch_interpreter_bf16_rounding()
            _SHIMS[name] = {"red": _make_red_shim, "rng": _make_rng_shim, "libdevice": _make_shim}[name]()
        return _SHIMS[name]
    return importlib.import_module({"red": "coil.runtime.triton_reductions", "rng": "triton.language",
                                    "libdevice": "triton.language.extra.libdevice"}[name])


_SHIMS: dict = {}  # name -> the interpreter shim module, made once
