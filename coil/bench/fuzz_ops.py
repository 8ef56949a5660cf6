"""Op families and inputs for coil's differential fuzzer (docs/fuzzing.md).

An op generator ``gen(ctx) -> str | list[str]``, registered with :func:`op`, reads the program's live eager values
(``ctx.env``) and returns lines of source; it raises :class:`Skip` when it does not apply. The builder keeps only lines
eager accepts, so a generator may be loose about validity, but it must check the live values for anything whose eager
result is undefined (integer division by zero, out-of-range float-to-int casts, duplicate scatter indices, sources
overlapping the target of an in-place op).
"""
from __future__ import annotations

import math
import random
from typing import Callable, Optional

import torch

#: family name -> list of (weight, generator)
FAMILIES: dict = {}
#: how often the program builder picks each family
FAMILY_WEIGHTS = {"pointwise": 4, "reduction": 3, "view": 2, "mutation": 2, "metadata": 1,
                  "indexing": 2, "cat": 1, "nn": 1, "order": 1, "spatial": 1}
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.uint8, torch.int32, torch.int64)
DTYPES = FLOATS + INTS + (torch.bool,)


class Skip(Exception):
    """An op generator does not apply to the program's current values."""


def op(family: str, weight: int = 1) -> Callable:
    """Register an op generator ``gen(ctx) -> str | list[str]`` under ``family``."""
    def deco(fn):
        FAMILIES.setdefault(family, []).append((weight, fn))
        return fn
    return deco


def dname(dt: torch.dtype) -> str:
    """``torch.float16`` -> ``'torch.float16'`` (source text)."""
    return "torch." + str(dt).split(".")[1]


def literal(t: torch.Tensor) -> str:
    """Source text that rebuilds ``t``'s values exactly (contiguous); uses ``nan``/``inf``."""
    dt = dname(t.dtype)
    if t.numel() == 0:
        return f"torch.empty({tuple(t.shape)}, dtype={dt})"
    if not t.is_floating_point():
        return f"torch.tensor({t.tolist()!r}, dtype={dt})"
    return f"torch.tensor({_short(t.tolist(), t.dtype)}, dtype={dt})"


def _short(v, dtype: torch.dtype) -> str:
    """Nested list source with each float in the fewest digits that round-trip in ``dtype``."""
    if isinstance(v, list):
        return "[" + ", ".join(_short(x, dtype) for x in v) + "]"
    if v != v or v in (math.inf, -math.inf):
        return repr(v)
    for p in range(3, 18):
        s = f"{v:.{p}g}"
        if torch.tensor(float(s), dtype=dtype).item() == v:
            return s if any(ch in s for ch in ".en") else s + ".0"
    return repr(v)


def is_int(v) -> bool:
    """An integer or bool tensor (or Python int/bool)."""
    if isinstance(v, torch.Tensor):
        return not (v.is_floating_point() or v.is_complex())
    return isinstance(v, (int, bool))


class Ctx:
    """What an op generator sees: ``rng``, the live eager values ``env`` and the input names."""

    def __init__(self, rng: random.Random, env: dict, inputs: list):
        self.rng, self.env, self.inputs = rng, env, inputs
        self.counter = sum(1 for k in env if k.startswith("v"))

    def names(self, pred: Optional[Callable] = None) -> list:
        return [k for k, v in self.env.items() if isinstance(v, torch.Tensor) and (pred is None or pred(v))]

    def pick(self, pred: Optional[Callable] = None) -> str:
        """A random live tensor name satisfying ``pred``; :class:`Skip` if none."""
        c = self.names(pred)
        if not c:
            raise Skip
        return self.rng.choice(c)

    def fresh(self) -> str:
        while f"v{self.counter}" in self.env:
            self.counter += 1
        self.counter += 1
        return f"v{self.counter - 1}"

    def value(self, expr: str):
        """Evaluate ``expr`` against the live values (no side effects expected)."""
        return eval(expr, self.env)

    def dim(self, name: str, extra: int = 0) -> int:
        """A valid dim of ``name`` (``extra=1``: of its unsqueezed result), sometimes negative."""
        n = max(self.env[name].dim() + extra, 1)
        d = self.rng.randrange(n)
        return d - n if self.rng.random() < 0.3 else d

    @staticmethod
    def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()

    def aliases_input(self, v: torch.Tensor) -> bool:
        ptrs = {self.env[i].untyped_storage().data_ptr() for i in self.inputs if i in self.env}
        return v.untyped_storage().data_ptr() in ptrs and v.untyped_storage().nbytes() > 0

    def scalar(self, integral: bool = False) -> str:
        """A Python scalar literal: small ints/floats mostly, then -0.0, inf, nan, bools, big."""
        r = self.rng.random()
        if integral or r < 0.35:
            return self.rng.choice(["2", "-3", "1", "0", "7"])
        if r < 0.75:
            return self.rng.choice(["2.5", "-0.5", "0.25", "1.0", "-3.0"])
        return self.rng.choice(["-0.0", "torch.inf", "-torch.inf", "torch.nan", "True", "300", "1e30", "1e-40"])

    def broadcastable_to(self, shape) -> list:
        def ok(v):
            try:
                return tuple(torch.broadcast_shapes(v.shape, shape)) == tuple(shape)
            except RuntimeError:
                return False
        return self.names(ok)

    def source(self, shape, dtype: torch.dtype, avoid: Optional[torch.Tensor] = None) -> str:
        """An expression of ``shape``: an env tensor broadcast to it, else a constant.

        ``avoid``: the tensor an in-place op writes; a source sharing its memory would
        make eager's result depend on the kernel's order, so none is picked."""
        c = [n for n in self.broadcastable_to(shape) if avoid is None or not self.same_memory(self.env[n], avoid)]
        if c and self.rng.random() < 0.8:
            y = self.rng.choice(c)
            e = f"{y}.expand({tuple(shape)})" if tuple(self.env[y].shape) != tuple(shape) else y
            return e if self.env[y].dtype == dtype else f"{e}.to({dname(dtype)})"
        return f"torch.full({tuple(shape)}, {self.scalar(is_int(torch.empty((), dtype=dtype)))}, dtype={dname(dtype)})"

    def index(self, n: int, k: int, unique: bool = False, negative: bool = False) -> list:
        """``k`` indices into a dim of size ``n`` (unique ones when asked)."""
        if n == 0:
            return []
        if unique:
            return self.rng.sample(range(n), min(k, n))
        return [self.rng.randrange(-n if negative else 0, n) for _ in range(k)]

    def perm_index(self, shape, dim: int) -> torch.Tensor:
        """An int64 index of ``shape`` whose entries along ``dim`` are distinct."""
        g = torch.Generator().manual_seed(self.rng.getrandbits(31))
        full = list(shape)
        full[dim] = max(full[dim], 1)
        return torch.rand(full, generator=g).argsort(dim=dim).narrow(dim, 0, shape[dim])


# ------------------------------------------------------------------ inputs

def gen_values(rng: random.Random, shape, dtype: torch.dtype, kind: str) -> torch.Tensor:
    """Contiguous values: kind is normal, special (NaN/inf/-0.0), extreme or ints."""
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    pick = torch.rand(shape, generator=g)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
        if kind == "ints":
            x = x.round()
        elif kind == "special":
            specials = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.0], dtype=torch.float64)
            which = torch.randint(0, 5, shape, generator=g)
            x = torch.where(pick < 0.35, specials[which], x)
        elif kind == "extreme":
            fi = torch.finfo(dtype)
            big = x.sign() * fi.max * (0.25 + 0.75 * torch.rand(shape, generator=g, dtype=torch.float64))
            x = torch.where(pick < 0.5, big, torch.where(pick < 0.7, x * fi.tiny, x))
        return x.to(dtype)
    lo, hi = (0, 10) if dtype is torch.uint8 else (-5, 6)
    x = torch.randint(lo, hi, shape, generator=g, dtype=torch.int64)
    if kind == "extreme":
        ii = torch.iinfo(dtype)
        x = torch.where(pick < 0.3, ii.max - x.abs(), torch.where(pick < 0.6, ii.min + x.abs(), x))
    return x.to(dtype)


def gen_layout(rng: random.Random, shape: list):
    """(base shape, suffix) so that ``base[suffix]`` has ``shape`` and a chosen layout."""
    nd, r = len(shape), rng.random()
    base = list(shape)
    if r < 0.15 and nd >= 2:
        perm = list(range(nd))
        while perm == sorted(perm):
            rng.shuffle(perm)
        for i, p in enumerate(perm):
            base[p] = shape[i]
        return base, ".t()" if nd == 2 else f".permute({', '.join(map(str, perm))})"
    if r < 0.3 and nd >= 1:
        d = rng.randrange(nd)
        off, step = rng.randint(0, 2), rng.choice([1, 2])
        base[d] = off + shape[d] * step
        return base, "[" + ":, " * d + f"{off}:{off + shape[d] * step}:{step}]".replace(":1]", "]")
    big = [i for i, s in enumerate(shape) if s > 1]
    if r < 0.45 and big:
        for i in rng.sample(big, rng.randint(1, len(big))):
            base[i] = 1
        if nd >= 2 and rng.random() < 0.3:
            base = base[1:]
        return base, f".expand({', '.join(map(str, shape))})"
    return base, ""


#: the sizes ``gen_shapes(big=True)`` gives one or two dims: vector bodies with and without tails, several blocks
BIG_SIZES = (7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 129)


def gen_shapes(rng: random.Random, n: int, big: bool = False) -> list:
    """``n`` mutually broadcast-friendly shapes (≤ 4 dims, ≤ 6 a dim, some 0-d/size-1/empty). ``big``: 1-4 dims,
    one or two of them from :data:`BIG_SIZES`, at most 3,000 elements (the largest dim halved until then)."""
    nd = rng.choice([1, 1, 2, 2, 2, 3, 3, 4] if big else [0, 1, 1, 2, 2, 2, 3, 3, 4])
    full = [rng.randint(1, 6) for _ in range(nd)]
    if big:
        for i in rng.sample(range(nd), min(nd, rng.choice([1, 1, 2]))):
            full[i] = rng.choice(BIG_SIZES)
        while math.prod(full) > 3000:
            k = full.index(max(full))
            full[k] = max(1, full[k] // 2)
    if nd and rng.random() < (0.04 if big else 0.06):
        full[rng.randrange(nd)] = 0
    shapes = []
    for _ in range(n):
        s = list(full)
        if s and rng.random() < 0.25:
            s = s[rng.randint(1, len(s)):]
        s = [1 if rng.random() < (0.1 if big else 0.15) else x for x in s]
        shapes.append(s)
    return shapes


# --------------------------------------------------------------- pointwise

_DIVS = ("//", "%", "torch.fmod", "torch.remainder", "torch.floor_divide")
BINARY = ("+", "-", "*", "/", "**", "&", "|", "^", "torch.maximum", "torch.minimum", "torch.atan2", "torch.hypot",
          "torch.copysign", "torch.logical_and", "torch.logical_xor", "torch.eq", "torch.ne", "torch.lt", "torch.le",
          "torch.gt", "torch.ge") + _DIVS
UNARY = ("abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin",
         "cos", "tan", "tanh", "atan", "asin", "sinh", "sigmoid", "erf", "floor", "ceil",
         "round", "trunc", "frac", "sign", "signbit", "reciprocal", "relu", "square", "isnan",
         "isinf", "isfinite", "logical_not", "bitwise_not", "nan_to_num",
         "nn.functional.gelu", "nn.functional.silu", "nn.functional.softplus")


def _apply(fn: str, x: str, y: str) -> str:
    return f"{x} {fn} {y}" if not fn[0].isalpha() else f"{fn}({x}, {y})"


def _safe(fn: str, xv, yv) -> bool:
    """False when eager's result is undefined or would trap (integer division by 0), or depends on the element's
    position: eager's vectorized float fmod/remainder compute ``a - trunc(a / b) * b``, NaN where ``a / b`` overflows (a
    subnormal ``b``), while its scalar tail and fmod itself give the exact remainder."""
    y = torch.as_tensor(yv)
    if fn in ("%", "torch.fmod", "torch.remainder") and torch.result_type(xv, yv).is_floating_point:
        x, y = torch.as_tensor(xv).double(), y.double()
        big = torch.finfo(torch.float64 if torch.result_type(xv, yv) == torch.float64 else torch.float32).max
        return not bool((x.isfinite() & (y != 0) & (x.abs() > y.abs() * big)).any())
    if not (is_int(xv) and is_int(yv)):
        return True
    if fn in _DIVS:
        x = torch.as_tensor(xv)
        low = x.numel() > 0 and x.to(torch.int64).min().item() <= -2 ** 31
        return not bool((y == 0).any()) and not (low and bool((y == -1).any()))
    if fn == "**":
        return not bool((y < 0).any())
    return True


@op("pointwise", 3)
def binary(c: Ctx):
    x = c.pick()
    fn = c.rng.choice(BINARY)
    if c.rng.random() < 0.5:
        y = c.pick(lambda v: _broadcasts(v.shape, c.env[x].shape))
        yv = c.env[y]
    else:
        y = c.scalar(integral=fn in _DIVS and c.rng.random() < 0.5)
        yv = eval(y, {"torch": torch})
        y = f"({y})" if y.startswith("-") else y
    a, b = (x, y) if c.rng.random() < 0.75 or not fn[0] in "+-*/%" else (y, x)
    av, bv = (c.env[x], yv) if a == x else (yv, c.env[x])
    if not _safe(fn, av, bv):
        raise Skip
    return f"{c.fresh()} = {_apply(fn, a, b)}"


def _broadcasts(s1, s2) -> bool:
    try:
        torch.broadcast_shapes(s1, s2)
        return True
    except RuntimeError:
        return False


@op("pointwise", 2)
def unary(c: Ctx):
    x, fn = c.pick(), c.rng.choice(UNARY)
    if fn.endswith("gelu") and (v := c.env[x]).is_floating_point() and \
            bool((v.abs() >= torch.finfo(v.dtype).max / 2).any()):  # eager: at +inf NaN (fp32/
        raise Skip  # bf16, oneDNN) or inf; from max/2 inf in vector lanes, x in the tail (s81 #2280)
    return f"{c.fresh()} = torch.{fn}({x})"


@op("pointwise")
def cast(c: Ctx):
    x, dt = c.pick(), c.rng.choice(DTYPES)
    xv = c.env[x]
    if xv.is_floating_point() and dt in INTS and xv.numel():
        ii = torch.iinfo(dt)
        x64 = xv.double()
        if not (torch.isfinite(x64).all() and (x64 > float(ii.min) - 1).all() and (x64 < min(ii.max, 2 ** 62)).all()):
            raise Skip  # out-of-range float -> int casts are undefined
    return f"{c.fresh()} = {x}.to({dname(dt)})"


@op("pointwise")
def compare_where(c: Ctx):
    x = c.pick()
    cmp = c.rng.choice([">", "<", ">=", "==", "!="])
    cond = x if c.env[x].dtype is torch.bool and c.rng.random() < 0.5 else f"{x} {cmp} {c.scalar(is_int(c.env[x]))}"
    other = c.pick(lambda v: _broadcasts(v.shape, c.env[x].shape))
    r = c.rng.random()
    if r < 0.4:
        return f"{c.fresh()} = torch.where({cond}, {other}, {c.scalar()})"
    if r < 0.7:
        return f"{c.fresh()} = torch.where({cond}, {x}, {other})"
    lo = c.scalar(is_int(c.env[x]))
    return f"{c.fresh()} = torch.clamp({x}, min={lo}, max={c.rng.choice(['4', '2.5', lo])})"


# --------------------------------------------------------------- reductions

REDUCTIONS = ("sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "any", "all", "std",
              "var", "logsumexp", "nansum", "max", "min", "cumsum", "count_nonzero")


@op("reduction", 4)
def reduction(c: Ctx):
    x, fn = c.pick(), c.rng.choice(REDUCTIONS)
    xv, rng = c.env[x], c.rng
    nd = xv.dim()
    args, r = [], rng.random()
    multi = fn in ("sum", "mean", "amax", "amin", "any", "all", "std", "var", "logsumexp", "nansum", "count_nonzero")
    if fn in ("cumsum", "logsumexp") or (r < 0.55 and nd > 0) or fn in ("max", "min") and r < .7:
        d = c.dim(x)
        if multi and nd >= 2 and rng.random() < 0.3:
            d2 = c.dim(x)
            if (d - d2) % nd == 0:
                raise Skip
            d = (d, d2)
        args.append(f"dim={d}")
        if fn not in ("cumsum", "count_nonzero") and rng.random() < 0.4:
            args.append("keepdim=True")
    if fn in ("std", "var") and rng.random() < 0.6:
        args.append(f"correction={rng.choice([0, 1, 2])}")
    if fn in ("sum", "prod", "cumsum", "mean") and (rng.random() < 0.2 or fn == "mean" and is_int(xv)):
        args.append(f"dtype={dname(rng.choice([torch.float32, torch.float64, torch.int64]))}")
    if fn in ("argmax", "argmin", "max", "min") and xv.is_floating_point() and x not in c.inputs and \
            bool(((u := xv.unique(return_counts=True))[1] > 1).logical_and(u[0] != u[0].round()).any()):
        raise Skip  # computed non-integer ties: another correct rounding may break them (s81 #2967)
    call = f"torch.{fn}({', '.join([x] + args)})"
    if fn in ("max", "min") and any(a.startswith("dim") for a in args):
        return f"{c.fresh()}, {c.fresh()} = {call}"
    return f"{c.fresh()} = {call}"


# -------------------------------------------------------------------- views

def view_expr(c: Ctx, x: str) -> str:
    """An expression that is a view of ``x`` (slice, permute, expand, view, diagonal, ...)."""
    xv, rng = c.env[x], c.rng
    shape, nd = list(xv.shape), xv.dim()
    k = rng.choice(["slice", "slice", "transpose", "permute", "expand", "unsqueeze", "squeeze", "reshape", "narrow",
                    "diagonal", "as_strided", "select", "flatten", "view_dtype", "unflatten"])
    if k == "slice" and nd:
        d = rng.randrange(nd)
        n = shape[d]
        a, b = rng.randint(-n, n), rng.choice([None, rng.randint(-n, n + 1)])
        step = rng.choice(["", "", ":2", ":3"])
        piece = f"{a}:{'' if b is None else b}{step}" if rng.random() < 0.8 else str(rng.randint(-n, n - 1) if n else 0)
        return f"{x}[{':, ' * d}{piece}]" if rng.random() < 0.7 else f"{x}[..., {piece}]"
    if k == "transpose" and nd >= 2:
        return f"{x}.transpose({c.dim(x)}, {c.dim(x)})" if rng.random() < 0.6 else f"{x}.mT"
    if k == "permute" and nd >= 2:
        p = list(range(nd))
        rng.shuffle(p)
        return f"{x}.permute({', '.join(map(str, p))})"
    if k == "expand":
        new = [rng.randint(1, 4) if s == 1 else -1 for s in shape]
        if rng.random() < 0.4 or not new:
            new = [rng.randint(1, 3)] + new
        return f"{x}.expand({', '.join(map(str, new))})"
    if k == "unsqueeze":
        return f"{x}.unsqueeze({c.dim(x, extra=1)})"
    if k == "squeeze":
        return f"{x}.squeeze({c.dim(x)})" if nd and rng.random() < 0.6 else f"{x}.squeeze()"
    if k in ("reshape", "flatten", "unflatten"):
        n = xv.numel()
        if k == "flatten" and nd >= 2:
            return f"{x}.flatten({rng.randrange(nd - 1)})"
        divs = [d for d in range(1, 7) if n and n % d == 0] or [1]
        if k == "unflatten" and nd:
            d = c.dim(x)
            f = rng.choice([q for q in range(1, 7) if shape[d] and shape[d] % q == 0] or [1])
            return f"{x}.unflatten({d}, ({f}, -1))"
        return f"{x}.{rng.choice(['view', 'reshape'])}({rng.choice(divs)}, -1)"
    if k == "narrow" and nd and shape[0] >= 0:
        d = c.dim(x)
        s = rng.randint(0, shape[d])
        return f"{x}.narrow({d}, {s}, {rng.randint(0, shape[d] - s)})"
    if k == "diagonal" and nd >= 2:
        return f"torch.diagonal({x}, offset={rng.randint(-2, 2)}, dim1={c.dim(x)}, dim2={c.dim(x)})"
    if k == "as_strided" and c.aliases_input(xv):
        n = xv.untyped_storage().nbytes() // xv.element_size()
        for _ in range(10):
            size = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
            stride = [rng.randint(0, 3) for _ in size]
            off = rng.randint(0, max(n - 1, 0))
            if off + sum((s - 1) * st for s, st in zip(size, stride)) < n:
                return f"{x}.as_strided({tuple(size)}, {tuple(stride)}, {off})"
        raise Skip
    if k == "select" and nd and shape[0]:
        return f"{x}.select(0, {rng.randint(-shape[0], shape[0] - 1)})"
    if k == "view_dtype" and (is_int(xv) or c.aliases_input(xv)):  # ulps show in bits
        pairs = {torch.float32: torch.int32, torch.int32: torch.float32, torch.float16: torch.bfloat16,
                 torch.bfloat16: torch.float16, torch.float64: torch.int64, torch.int64: torch.float64}
        if xv.dtype in pairs:
            if pairs[xv.dtype].is_floating_point and xv.view(pairs[xv.dtype]).isnan().any():
                raise Skip  # NaN bit patterns: arithmetic leaves their payload unspecified
            return f"{x}.view({dname(pairs[xv.dtype])})"
    raise Skip


@op("view", 3)
def view(c: Ctx):
    return f"{c.fresh()} = {view_expr(c, c.pick())}"


@op("view")
def split(c: Ctx):
    x = c.pick(lambda v: v.dim() > 0 and any(s >= 2 for s in v.shape))
    xv = c.env[x]
    d = c.rng.choice([i for i, s in enumerate(xv.shape) if s >= 2])
    a = c.rng.randint(1, xv.shape[d] - 1)
    return f"{c.fresh()}, {c.fresh()} = torch.split({x}, [{a}, {xv.shape[d] - a}], {d})"


@op("view")
def copy(c: Ctx):
    x = c.pick()
    return f"{c.fresh()} = {x}.{c.rng.choice(['contiguous()', 'clone()'])}"


# ---------------------------------------------------------------- mutation

def _overlaps(v: torch.Tensor) -> bool:
    """Elements share memory (an expand, or as_strided strides like (2, 3, 3)), or torch cannot tell: eager's in-place
    ops do not always refuse such writes, and their result depends on the order the kernel visits the elements."""
    return torch._debug_has_internal_overlap(v) != 0


def _target(c: Ctx) -> tuple:
    """(lines, name): an input, a view of one (maybe made here) or any live tensor.

    Never a tensor with internal overlap (expanded: eager refuses writes to it)."""
    overlapping = [c.env[i] for i in c.inputs if i in c.env and _overlaps(c.env[i])]

    def ok(v):
        return not _overlaps(v) and not any(c.same_memory(v, i) for i in overlapping) and \
            (c.aliases_input(v) or c.rng.random() < 0.15)
    x = c.pick(ok)
    if c.rng.random() < 0.4:
        v, e = c.fresh(), view_expr(c, x)
        if not ok(c.value(e)):
            raise Skip
        c.env[v] = c.value(e)  # so the mutation sees the view's shape
        return [f"{v} = {e}"], v
    return [], x


@op("mutation", 4)
def inplace(c: Ctx):
    lines, t = _target(c)
    tv, rng = c.env[t], c.rng
    shape = tuple(tv.shape)
    k = rng.choice(["add_", "sub_", "mul_", "div_", "copy_", "fill_", "zero_", "clamp_", "masked_fill_", "setitem",
                    "neg_", "abs_", "relu_", "exp_", "sigmoid_", "bool_setitem"])
    if k in ("add_", "sub_", "mul_", "div_", "copy_"):
        y = c.source(shape, tv.dtype, tv) if rng.random() < 0.7 else \
            (f"torch.tensor({c.scalar()})" if k == "copy_" else c.scalar(is_int(tv)))
        if k == "div_" and is_int(tv):
            raise Skip
        s = f"{t}.{k}({y})"
    elif k in ("fill_", "clamp_", "masked_fill_"):
        s = c.scalar(is_int(tv))
        arg = {"fill_": s, "clamp_": f"min={s}", "masked_fill_": None}[k]
        if k == "masked_fill_":
            m = rng.choice(c.broadcastable_to(shape) or [t])
            arg = f"{m} > 0, {s}" if c.env[m].dtype is not torch.bool else f"{m}, {s}"
        s = f"{t}.{k}({arg})"
    elif k == "setitem" and shape:
        d = rng.randrange(len(shape))
        a = rng.randint(0, shape[d])
        idx = f"[{':, ' * d}{a}:]"
        sub = c.value(t + idx)
        s = f"{t}{idx} = {c.source(tuple(sub.shape), tv.dtype, tv) if rng.random() < .6 else c.scalar(is_int(tv))}"
    elif k == "bool_setitem":
        s = f"{t}[{t}] = False" if tv.dtype is torch.bool else f"{t}[{t} > 0] = {c.scalar(is_int(tv))}"
    else:
        s = f"{t}.{k}()" if k != "setitem" else f"{t}.zero_()"
    return lines + [s]


@op("mutation", 2)
def index_mutation(c: Ctx):
    lines, t = _target(c)
    tv, rng = c.env[t], c.rng
    if tv.dim() == 0:
        raise Skip
    d = rng.randrange(tv.dim())
    n, k = tv.shape[d], rng.choice(["index_add_", "index_put_", "scatter_", "scatter_add_", "index_fill_"])
    if k in ("index_add_", "index_fill_"):
        idx = c.index(n, rng.randint(1, 4))
        shp = list(tv.shape)
        shp[d] = len(idx)
        src = c.source(tuple(shp), tv.dtype, tv) if k == "index_add_" else c.scalar(is_int(tv))
        return lines + [f"{t}.{k}({d}, torch.tensor({idx}, dtype=torch.int64), {src})"]
    if k == "index_put_":
        acc = rng.random() < 0.5
        idx = c.index(tv.shape[0], rng.randint(1, 4), unique=not acc, negative=True)
        val = f"torch.tensor({c.scalar(is_int(tv))}, dtype={dname(tv.dtype)})"
        return lines + [f"{t}.index_put_((torch.tensor({idx}, dtype=torch.int64),), {val}, accumulate={acc})"]
    shp = [rng.randint(1, s) if s else 0 for s in tv.shape]
    idx = c.perm_index(shp, d) if k == "scatter_" else \
        torch.randint(0, max(n, 1), shp, generator=torch.Generator().manual_seed(rng.getrandbits(31)))
    src = c.source(tuple(shp), tv.dtype, tv) if rng.random() < 0.7 or k == "scatter_add_" else c.scalar(is_int(tv))
    return lines + [f"{t}.{k}({d}, {literal(idx)}, {src})"]


@op("metadata")
def metadata(c: Ctx):
    x = c.pick(lambda v: any(c.env.get(i) is v for i in c.inputs))
    xv, rng = c.env[x], c.rng
    k = rng.choice(["t_", "transpose_", "squeeze_", "unsqueeze_", "as_strided_"])
    if k == "t_" and xv.dim() <= 2:
        return f"{x}.t_()"
    if k == "transpose_" and xv.dim() >= 2:
        return f"{x}.transpose_({c.dim(x)}, {c.dim(x)})"
    if k == "squeeze_":
        return f"{x}.squeeze_({c.dim(x)})" if xv.dim() and rng.random() < 0.6 else f"{x}.squeeze_()"
    if k == "unsqueeze_":
        return f"{x}.unsqueeze_({c.dim(x, extra=1)})"
    e = view_expr(c, x)
    if ".as_strided(" not in e:
        raise Skip
    return e.replace(".as_strided(", ".as_strided_(")


# ---------------------------------------------------------------- indexing

@op("indexing", 3)
def indexing(c: Ctx):
    x = c.pick(lambda v: v.dim() > 0)
    xv, rng = c.env[x], c.rng
    d = rng.randrange(xv.dim())
    n = xv.shape[d]
    k = rng.choice(["index_select", "gather", "scatter", "scatter_add", "scatter_reduce",
                    "getitem", "index_put", "masked_fill", "index_fill"])
    v = c.fresh()
    if k == "index_select":
        return f"{v} = torch.index_select({x}, {d}, torch.tensor({c.index(n, rng.randint(0, 4))}, dtype=torch.int64))"
    if k == "getitem":
        idx = c.index(n, rng.randint(1, 4), negative=True)
        return f"{v} = {x}[{':, ' * d}torch.tensor({idx})]"
    if k == "index_put":
        acc = rng.random() < 0.5
        idx = c.index(xv.shape[0], rng.randint(1, 3), unique=not acc)
        return f"{v} = {x}.index_put((torch.tensor({idx}),), torch.tensor({c.scalar(is_int(xv))}, " \
               f"dtype={dname(xv.dtype)}), accumulate={acc})"
    if k == "masked_fill":
        m = rng.choice(c.broadcastable_to(tuple(xv.shape)) or [x])
        cond = m if c.env[m].dtype is torch.bool else f"{m} < 1"
        return f"{v} = {x}.masked_fill({cond}, {c.scalar(is_int(xv))})"
    if k == "index_fill":
        return f"{v} = {x}.index_fill({d}, torch.tensor({c.index(n, 2)}, dtype=torch.int64), {c.scalar(is_int(xv))})"
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    shp = [rng.randint(1, s) if s else 0 for s in xv.shape]
    if k == "gather":
        shp[d] = rng.randint(1, 4) if n else 0
        idx = torch.randint(0, max(n, 1), shp, generator=g)
        return f"{v} = torch.gather({x}, {d}, {literal(idx)})"
    src = rng.choice([x] + c.names(lambda t: t.dim() == xv.dim() and all(a >= b for a, b in zip(t.shape, shp))))
    if k == "scatter":
        return f"{v} = torch.scatter({x}, {d}, {literal(c.perm_index(shp, d))}, {src})"
    idx = literal(torch.randint(0, max(n, 1), shp, generator=g))
    if k == "scatter_add":
        return f"{v} = torch.scatter_add({x}, {d}, {idx}, {src})"
    red = rng.choice(["sum", "prod", "mean", "amax", "amin"])
    return f"{v} = torch.scatter_reduce({x}, {d}, {idx}, {src}, {red!r}, include_self={rng.random() < 0.5})"


# --------------------------------------------------------------------- cat

@op("cat")
def cat(c: Ctx):
    x = c.pick(lambda v: v.dim() > 0)
    xv, rng = c.env[x], c.rng
    d = c.dim(x)
    if rng.random() < 0.3:
        same = c.names(lambda v: v.shape == xv.shape)
        parts = [x] + rng.sample(same, min(len(same), rng.randint(1, 2)))
        return f"{c.fresh()} = torch.stack([{', '.join(parts)}], {c.dim(x, extra=1)})"

    def fits(v):
        return v.dim() == xv.dim() and all(a == b for i, (a, b) in enumerate(zip(v.shape, xv.shape))
                                           if i != d % xv.dim())
    parts = [x] + rng.sample(c.names(fits), min(len(c.names(fits)), rng.randint(1, 2)))
    if len(parts) == 1 or rng.random() < 0.3:
        n = xv.shape[d]
        parts.append(f"{x}.narrow({d}, 0, {rng.randint(0, n)})" if rng.random() < 0.7 else f"{x} * 2")
    rng.shuffle(parts)
    return f"{c.fresh()} = torch.cat([{', '.join(parts)}], {d})"


# ---------------------------------------------------------------------- nn

def _float(v: torch.Tensor) -> bool:
    return v.is_floating_point()


@op("nn", 2)
def softmax(c: Ctx):
    x = c.pick(_float)
    fn = c.rng.choice(["softmax", "log_softmax"])
    return f"{c.fresh()} = torch.{fn}({c.pick(_float) if x is None else x}, {c.dim(x)})"


@op("nn", 2)
def layer_norm(c: Ctx):
    x = c.pick(lambda v: _float(v) and v.dim() > 0)
    xv = c.env[x]
    k = c.rng.randint(1, xv.dim())
    tail = tuple(xv.shape[-k:])
    w = c.names(lambda v: tuple(v.shape) == tail and v.dtype == xv.dtype)
    args = [x, str(tail)] + ([c.rng.choice(w)] if w and c.rng.random() < 0.6 else [])
    return f"{c.fresh()} = torch.nn.functional.layer_norm({', '.join(args)})"


@op("nn", 2)
def matmul(c: Ctx):
    x = c.pick(lambda v: _float(v) and v.dim() >= 1)
    xv = c.env[x]
    ys = c.names(lambda v: v.dtype == xv.dtype and v.dim() >= 1 and v.shape[0 if v.dim() == 1 else -2] == xv.shape[-1])
    y = c.rng.choice(ys) if ys and c.rng.random() < 0.6 else (f"{x}.mT" if xv.dim() >= 2 else x)
    return f"{c.fresh()} = torch.matmul({x}, {y})"


@op("nn")
def sdpa(c: Ctx):
    q = c.pick(lambda v: _float(v) and v.dim() == 4 and v.numel() > 0)
    qv, rng = c.env[q], c.rng
    m = rng.randint(1, qv.shape[2])
    kv = rng.choice([q, f"{q}[:, :1].expand_as({q})", f"{q}.narrow(2, 0, {m})",
                     f"{q}[:, :1].expand(-1, {qv.shape[1]}, -1, -1).narrow(2, 0, {m})"])
    causal = rng.random() < 0.3
    return f"{c.fresh()} = torch.nn.functional.scaled_dot_product_attention({q}, {kv}, {kv}, is_causal={causal})"


# ------------------------------------------------------------------- order

@op("order", 3)
def order(c: Ctx):
    """Scans, sorts and top-k, and shifts of integers (values only where ties make indices unspecified)."""
    x = c.pick(lambda v: v.dim() > 0)
    xv, rng, v = c.env[x], c.rng, c.fresh()
    d, k = c.dim(x), rng.choice(["cumprod", "logcumsumexp", "cummax", "sort", "argsort", "topk", "msort", "shift"])
    if k == "cumprod":
        return f"{v} = torch.cumprod({x}, {d}{', dtype=torch.float64' if rng.random() < 0.2 else ''})"
    if k in ("logcumsumexp", "msort"):
        return f"{v} = torch.{k}({x}{'' if k == 'msort' else f', {d}'})"
    if k == "shift":
        if not is_int(xv) or xv.dtype is torch.bool:
            raise Skip
        return f"{v} = {x} {rng.choice(['<<', '>>'])} {rng.randint(0, 7)}"
    desc = rng.random() < 0.5
    if k == "cummax":
        return f"{v} = torch.{rng.choice(['cummax', 'cummin'])}({x}, {d}).values"
    if k == "sort":
        return f"{v}, {c.fresh()} = torch.sort({x}, dim={d}, descending={desc}, stable=True)"
    if k == "argsort":
        return f"{v} = torch.argsort({x}, dim={d}, descending={desc}, stable=True)"
    n = rng.randint(0, xv.shape[d])
    return f"{v} = torch.topk({x}, {n}, {d}, largest={desc}, sorted=True).values"


# ----------------------------------------------------------------- spatial

def _nchw(c: Ctx, x: str, nd: int) -> str:
    """``x`` as a tensor of ``nd`` dims (batch, channels, spatial...): itself or a reshape."""
    xv = c.env[x]
    if xv.dim() == nd:
        return x
    return f"{x}.reshape({', '.join(['1'] * (nd - 1))}, -1)"


@op("spatial", 2)
def pad(c: Ctx):
    x = c.pick(lambda v: v.dim() > 0)
    xv, rng = c.env[x], c.rng
    mode = rng.choice(["constant", "reflect", "replicate", "circular"])
    nd = min(max(xv.dim(), 3), 4) if mode != "constant" else xv.dim()
    e = _nchw(c, x, nd) if mode != "constant" else x
    k = rng.randint(1, min(nd - (mode != "constant") * 2, 2) if nd > 1 else 1)
    pads = [rng.randint(-1 if mode == "constant" else 0, 2) for _ in range(2 * k)]
    val = f", value={c.scalar(is_int(xv))}" if mode == "constant" and rng.random() < 0.5 else ""
    return f"{c.fresh()} = torch.nn.functional.pad({e}, {tuple(pads)}, mode={mode!r}{val})"


def _float_nchw(c: Ctx) -> tuple:
    """A non-empty float tensor's value, and an expression of it as 3 dims (4 if it has 4)."""
    x = c.pick(lambda v: _float(v) and v.numel() > 0)
    nd = 4 if c.env[x].dim() == 4 else 3
    return c.env[x], _nchw(c, x, nd)


@op("spatial", 2)
def pool(c: Ctx):
    e, rng = _float_nchw(c)[1], c.rng
    sp = c.value(e).dim() - 2
    size = min(c.value(e).shape[2:])
    kind = rng.choice(["max_pool", "avg_pool", "interpolate", "adaptive_avg_pool"])
    if kind == "interpolate":
        mode = rng.choice(["nearest", "nearest-exact", "linear" if sp == 1 else "bilinear"])
        ac = f", align_corners={rng.random() < 0.5}" if "linear" in mode else ""
        how = f"scale_factor={rng.choice([0.5, 1.5, 2, 3])}" if rng.random() < 0.5 else f"size={rng.randint(1, 7)}"
        return f"{c.fresh()} = torch.nn.functional.interpolate({e}, {how}, mode={mode!r}{ac})"
    if kind == "adaptive_avg_pool":
        return f"{c.fresh()} = torch.nn.functional.adaptive_avg_pool{sp}d({e}, {rng.randint(1, 4)})"
    ks = rng.randint(1, max(min(size, 3), 1))
    args = [e, str(ks), f"stride={rng.randint(1, 2)}", f"padding={rng.randint(0, ks // 2)}",
            f"ceil_mode={rng.random() < 0.5}"]
    if kind == "max_pool":
        args.append(f"dilation={rng.choice([1, 1, 2])}")
    elif rng.random() < 0.5:
        args.append("count_include_pad=False")
    return f"{c.fresh()} = torch.nn.functional.{kind}{sp}d({', '.join(args)})"


@op("spatial", 2)
def conv(c: Ctx):
    (xv, e), rng = _float_nchw(c), c.rng
    if xv.dtype == torch.float16:
        # eager's oneDNN float16 convolution segfaults on CPUs with AVX512-FP16 under one thread (a length-1 input,
        # padding 1, dilation 2, stride 2): the program generator runs eager, so float16 inputs are widened here
        e, xv = f"{e}.float()", xv.float()
    nd = c.value(e).dim()
    cin = c.value(e).shape[1]
    groups = rng.choice([g for g in (1, 2, 3) if cin % g == 0])
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    kshape = (groups * rng.randint(1, 2), cin // groups) + (rng.randint(1, 3),) * (nd - 2)
    w = (torch.randint(-15, 16, kshape, generator=g) / 16).to(xv.dtype)
    bias = f", {literal(torch.arange(kshape[0]).to(xv.dtype) / 4)}" if rng.random() < 0.5 else ", None"
    return f"{c.fresh()} = torch.nn.functional.conv{nd - 2}d({e}, {literal(w)}{bias}, stride={rng.randint(1, 2)}, " \
           f"padding={rng.randint(0, 1)}, dilation={rng.randint(1, 2)}, groups={groups})"
