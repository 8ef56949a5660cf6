"""C++ spellings of the loop IR's math ops (one table per concern, STYLE.md §2).

Each entry maps an op name to a function ``(args: list[str], dtype) -> str`` that returns a C++ expression; ``dtype`` is
the compute dtype of the first operand. Float32 transcendental ops use the vectorizable versions of the prelude
(``coil_exp`` ...); float64 and the rest call ``<cmath>``."""
from __future__ import annotations

import torch

#: torch dtype → C++ storage type
CTYPES = {torch.float32: "float", torch.float64: "double", torch.float16: "coil_f16", torch.bfloat16: "coil_bf16",
          torch.int8: "int8_t", torch.uint8: "uint8_t", torch.int16: "int16_t", torch.int32: "int32_t",
          torch.int64: "int64_t", torch.bool: "bool", torch.uint16: "uint16_t", torch.uint32: "uint32_t",
          torch.uint64: "uint64_t"}


def ctype(dtype: torch.dtype) -> str:
    """C++ storage type of ``dtype``; raises NotImplementedError for unsupported ones."""
    try:
        return CTYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"C++ backend: dtype {dtype} is not supported") from None


def compute_ctype(dtype: torch.dtype) -> str:
    """C++ type arithmetic runs in (fp16/bf16 → float)."""
    return "float" if dtype in (torch.float16, torch.bfloat16) else ctype(dtype)


def _f32(dtype) -> bool:
    return dtype in (torch.float32, torch.float16, torch.bfloat16)


def _fn(f32name: str, stdname: str):
    def emit(a, dtype):
        return f"{f32name if _f32(dtype) else stdname}({a[0]})"
    return emit


def _std(name: str):
    return lambda a, dtype: f"cm::{name}({', '.join(a)})"


def _abs(a, dtype):
    if dtype.is_floating_point:
        return f"cm::fabs({a[0]})"
    return a[0] if dtype == torch.bool or not dtype.is_signed else f"({a[0]} < 0 ? -{a[0]} : {a[0]})"


def _sign(a, dtype):
    x = a[0]
    if dtype == torch.bool:
        return x
    if dtype.is_floating_point:
        t = compute_ctype(dtype)
        return f"({x} > 0 ? ({t})1 : ({x} < 0 ? ({t})-1 : ({t})0))"  # sign(nan) == 0 in torch
    return f"(({compute_ctype(dtype)})(({x} > 0) - ({x} < 0)))"


def _rsqrt(a, dtype):
    return f"({'1.0f' if _f32(dtype) else '1.0'} / cm::sqrt({a[0]}))"


def _reciprocal(a, dtype):
    return f"({'1.0f' if _f32(dtype) else '1.0'} / {a[0]})"


def _floor_int(f):
    return lambda a, dtype: f(a, dtype) if dtype.is_floating_point else a[0]


UNARY = {
    "abs": _abs, "neg": lambda a, d: f"(-{a[0]})", "exp": _fn("coil_exp", "cm::exp"), "exp2": _std("exp2"),
    "expm1": _fn("coil_expm1", "cm::expm1"), "log": _fn("coil_log", "cm::log"), "log2": _std("log2"),
    "log10": _std("log10"), "log1p": _std("log1p"), "sqrt": _std("sqrt"), "rsqrt": _rsqrt,
    "sin": _fn("coil_sin", "cm::sin"), "cos": _fn("coil_cos", "cm::cos"), "tan": _std("tan"), "asin": _std("asin"),
    "acos": _std("acos"), "atan": _std("atan"), "sinh": _std("sinh"), "cosh": _std("cosh"),
    "tanh": _fn("coil_tanh", "cm::tanh"), "asinh": _std("asinh"), "acosh": _std("acosh"), "atanh": _std("atanh"),
    "erfc": _std("erfc"),
    # float32: libm's double erf, rounded, as eager's within 1 ulp (coil_erf: GELU's ndtr)
    "erf": lambda a, d: f"(float)cm::erf((double){a[0]})" if _f32(d) else f"cm::erf({a[0]})",
    "erfinv": lambda a, d: f"coil_erfinv({a[0]})", "ndtr": lambda a, d: f"coil_ndtr({a[0]})",
    "sigmoid": lambda a, d: (f"coil_sigmoid({a[0]})" if _f32(d) else f"(1.0 / (1.0 + cm::exp(-{a[0]})))"),
    "floor": _floor_int(lambda a, d: f"cm::floor({a[0]})"), "ceil": _floor_int(lambda a, d: f"cm::ceil({a[0]})"),
    "round": _floor_int(lambda a, d: f"cm::nearbyint({a[0]})"), "trunc": _floor_int(lambda a, d: f"cm::trunc({a[0]})"),
    "sign": _sign, "reciprocal": _reciprocal,
    "bitwise_not": lambda a, d: f"(!{a[0]})" if d == torch.bool else f"(({compute_ctype(d)})~{a[0]})",
    "logical_not": lambda a, d: f"(!{a[0]})",
    "isnan": lambda a, d: f"({a[0]} != {a[0]})" if d.is_floating_point else "false",
    "isinf": lambda a, d: f"cm::isinf({a[0]})" if d.is_floating_point else "false", "lgamma": _std("lgamma"),
    "signbit": lambda a, d: f"coil_signbit({a[0]})" if d.is_floating_point else (f"({a[0]} < 0)" if d.is_signed else "false"),
}


def _div(a, dtype):
    return f"({a[0]} / {a[1]})"


def _float_or_int(float_fn: str, int_fn: str):
    """A binary op: ``float_fn(a, b)`` for floats, ``int_fn<T>(a, b)`` for integers."""
    def emit(a, dtype):
        return float_fn.format(*a) if dtype.is_floating_point else f"{int_fn}<{compute_ctype(dtype)}>({a[0]}, {a[1]})"
    return emit


_floordiv = _float_or_int("cm::floor({} / {})", "coil_floordiv")
_truncdiv = _float_or_int("cm::trunc({} / {})", "coil_truncdiv")
_remainder = _float_or_int("coil_fmod_py({}, {})", "coil_mod")
_fmod = _float_or_int("cm::fmod({}, {})", "coil_fmod_int")
_pow = _float_or_int("cm::pow({}, {})", "coil_ipow")


def _minmax(fn):
    def emit(a, dtype):
        if dtype.is_floating_point:
            # NaN from either side; a tie (-0.0 vs 0.0) gives the first operand, as eager's clamp(x, min=0) keeps -0.0.
            # Eager's maximum/minimum (and clamp by a tensor) have no one answer there: the first operand from its
            # scalar loop (tensors under two vectors, tails), the second from its vector body (vmaxps/vminps)
            return f"{fn}_prop_({a[0]}, {a[1]})"
        op = ">" if fn == "coil_max" else "<"
        return f"coil_sel<{compute_ctype(dtype)}>({a[0]} {op} {a[1]}, {a[0]}, {a[1]})"
    return emit


def _binop(op):
    return lambda a, d: f"({a[0]} {op} {a[1]})"


def _logical(op):
    return lambda a, d: f"((bool){a[0]} {op} (bool){a[1]})"


def _shift(fn):
    return lambda a, d: f"{fn}<{compute_ctype(d)}>(({compute_ctype(d)})({a[0]}), {a[1]})"


BINARY = {"add": _binop("+"), "sub": _binop("-"), "mul": _binop("*"), "truediv": _div, "floordiv": _floordiv,
          "truncdiv": _truncdiv, "remainder": _remainder, "fmod": _fmod, "pow": _pow, "maximum": _minmax("coil_max"),
          "minimum": _minmax("coil_min"), "atan2": _std("atan2"), "hypot": _std("hypot"), "copysign": _std("copysign"),
          "nextafter": _std("nextafter"), "eq": _binop("=="), "ne": _binop("!="), "lt": _binop("<"), "le": _binop("<="),
          "gt": _binop(">"), "ge": _binop(">="), "logical_and": _logical("&&"), "logical_or": _logical("||"),
          "logical_xor": _logical("!="), "bitwise_and": _binop("&"), "bitwise_or": _binop("|"),
          "bitwise_xor": _binop("^"), "left_shift": _shift("coil_shl"), "right_shift": _shift("coil_shr")}

#: ops whose result is bool
BOOL_RESULT = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
               "logical_xor", "logical_not", "isnan", "isinf", "signbit"}

#: ops that wrap small integer types in C++ arithmetic: cast the result back
INT_WRAP = {"add", "sub", "mul", "neg", "bitwise_and", "bitwise_or", "bitwise_xor",
            "abs", "floordiv", "truncdiv", "remainder", "fmod"}
