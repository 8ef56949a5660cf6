"""Three ops handlers that define and inspect loop bodies without any codegen.

- :class:`TextPrinter` prints a body as straight-line ``ops.*`` code (compile log).
- :class:`DependencyRecorder` records reads/writes with their index expressions (the scheduler's dependency source) and
  counts ops (inlining heuristics).
- :class:`ReferenceInterpreter` *executes* a body with torch ops over the whole iteration space at once; it is the
  living definition of the loop IR: every lowering is tested against it and against eager PyTorch."""
from __future__ import annotations

import itertools
from typing import Callable

import sympy
import torch

from coil.ir.symbols import pyexpr, sym
from coil.ir.virtualized import BINARY_OPS, UNARY_OPS, OpsHandler, compute_dtype, set_ops_handler


def _fmt(v) -> str:
    return pyexpr(v) if isinstance(v, sympy.Basic) else str(v)


class _Recording(OpsHandler):
    """Every op returns a fresh name ``tmpN`` and appends a line of text (if ``TEXT``)."""

    TEXT = True

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counter, self.indirect = itertools.count(), itertools.count()
        self.loads: list[tuple[str, sympy.Expr]] = []
        self.stores: list[tuple[str, sympy.Expr]] = []
        self.reduction_types: list[str] = []
        self.num_ops = 0
        self.op_names: set[str] = set()
        self.exprs: list = []  # the expression arguments of ops (index_expr, indirect bounds)

    @property
    def size_symbols(self) -> set:
        """Every symbol in an expression argument of an op (their free symbols: only dynamic shapes ask)."""
        return set().union(*(e.free_symbols for e in self.exprs))

    def _emit(self, op: str, *args) -> str:
        self.exprs += [a for a in args if isinstance(a, sympy.Basic)]
        name = f"tmp{next(self.counter)}"
        self.num_ops += 1
        self.op_names.add(op)
        if self.TEXT:
            self.lines.append(f"{name} = ops.{op}({', '.join(_fmt(a) for a in args)})")
        return name

    def load(self, name, index):
        self.loads.append((name, index))
        return self._emit("load", name, index)

    def store(self, name, index, value, mode=None):
        self.stores.append((name, index))
        extra = f", mode={mode!r}" if mode else ""
        if self.TEXT:
            self.lines.append(f"ops.store({name}, {_fmt(index)}, {value}{extra})")

    def store_reduction(self, name, index, value):
        self.stores.append((name, index))
        if self.TEXT:
            self.lines.append(f"ops.store_reduction({name}, {_fmt(index)}, {value})")

    def reduction(self, dtype, src_dtype, reduction_type, value):
        self.reduction_types.append(reduction_type)
        return self._emit("reduction", dtype, src_dtype, repr(reduction_type), value)

    def load_seed(self, name, offset):
        self.loads.append((name, offset))
        return self._emit("load_seed", name, offset)

    def indirect_indexing(self, x, size, check=True, wrap_neg=True):
        s = sym(f"indirect{next(self.indirect)}")
        if isinstance(size, sympy.Basic):
            self.exprs.append(size)
        wrap = "" if wrap_neg else ", wrap_neg=False"
        if self.TEXT:
            self.lines.append(f"{s} = ops.indirect_indexing({x}, {_fmt(size)}, check={check}{wrap})")
        return s

    def masked(self, mask, body, other):
        self.lines.append(f"with ops.masked({mask}):")
        n, result = len(self.lines), body()
        for i in range(n, len(self.lines)):
            self.lines[i] = "    " + self.lines[i]
        return self._emit("masked_result", mask, result, other)

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_"):
            raise AttributeError(op)
        return lambda *args: self._emit(op, *args)


class TextPrinter(_Recording):
    """Print a buffer's body: ``TextPrinter.format(buf)`` -> str."""

    @staticmethod
    def format(buf) -> str:
        h = TextPrinter()
        index, rindex = buf.make_symbolic_index()
        with set_ops_handler(h):
            buf.store_body(index, rindex)
        head = f"{buf.name}: {type(buf.data).__name__}[{', '.join(_fmt(r) for r in buf.get_ranges())}]"
        if buf.is_reduction():
            head += f" reduce[{', '.join(_fmt(r) for r in buf.get_reduction_ranges())}]"
        head += f" {buf.get_dtype()} size={list(map(_fmt, buf.get_size()))} stride={list(map(_fmt, buf.get_stride()))}"
        return head + "\n" + "\n".join("    " + l for l in h.lines)


class DependencyRecorder(_Recording):
    """Reads and writes of a body, with index expressions in the buffer's loop symbols (no text)."""

    TEXT = False

    @staticmethod
    def record(buf, index=None, rindex=None) -> "DependencyRecorder":
        h = DependencyRecorder()
        if index is None:
            index, rindex = buf.make_symbolic_index()
        with set_ops_handler(h):
            buf.store_body(index, rindex)
        return h

    def read_names(self) -> list[str]:
        return list(dict.fromkeys(n for n, _ in self.loads))


def record_pointwise(loops) -> DependencyRecorder:
    """The loads and op count of a Pointwise body (inlined readers included), over fresh loop symbols ``i0..``."""
    h, index = DependencyRecorder(), [sym(f"i{d}") for d in range(len(loops.ranges))]
    with set_ops_handler(h):
        loops.inner_fn(index)
    return h


def count_ops(loops) -> tuple[int, int]:
    """(number of ops, number of distinct loads) of a Pointwise body, inlined readers included: a load of the same
    element twice (``where(t != -100, t, 0)`` reading ``t`` twice) is one read of memory in the generated kernel."""
    h = record_pointwise(loops)
    return h.num_ops, len(set(h.loads))


# ----------------------------------------------------------------------------- reference

_TORCH_UNARY = {"neg": torch.neg, "reciprocal": torch.reciprocal, "logical_not": torch.logical_not,
                "bitwise_not": torch.bitwise_not, "ndtr": torch.special.ndtr}
_TORCH_BINARY = {"truediv": torch.true_divide, "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
                 "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
                 "maximum": torch.maximum, "minimum": torch.minimum, "left_shift": torch.bitwise_left_shift,
                 "right_shift": torch.bitwise_right_shift}


class ReferenceInterpreter(OpsHandler):
    """Execute loop bodies with torch ops over the whole iteration space.

    ``env`` maps buffer names to flat 1-D storage tensors (element ``i`` of the flat
    tensor is storage element ``i``). Values are tensors broadcastable to the iteration
    shape ``ranges + reduction_ranges``. fp16/bf16 values are computed in fp32."""

    def __init__(self, env: dict[str, torch.Tensor], var_values: dict, n_red_dims: int, iter_shape: tuple):
        self.env, self.var_values = env, dict(var_values)
        self.n_red, self.iter_shape = n_red_dims, iter_shape
        self.masks: list[torch.Tensor] = []
        self.indirect = itertools.count()

    @staticmethod
    def run(buf, env: dict[str, torch.Tensor]) -> None:
        """Compute ComputedBuffer ``buf`` into ``env[buf.name]`` (allocated if missing)."""
        index, rindex = buf.make_symbolic_index()
        sizes = [int(s) for s in list(buf.get_ranges()) + list(buf.get_reduction_ranges())]
        dev = buf.get_device()
        values = {s: torch.arange(n, device=dev).reshape([n if e == d else 1 for e in range(len(sizes))])
                  for d, (s, n) in enumerate(zip(list(index) + list(rindex), sizes))}
        if buf.name not in env:
            env[buf.name] = torch.empty(int(buf.layout.storage_numel()), dtype=buf.get_dtype(), device=dev)
        if any(n == 0 for n in sizes):  # empty iteration space: nothing to compute
            return
        h = ReferenceInterpreter(env, values, len(rindex), tuple(sizes))
        with set_ops_handler(h):
            buf.store_body(index, rindex)

    # index arithmetic
    def _eval(self, expr) -> torch.Tensor:
        if isinstance(expr, (int,)):
            return torch.tensor(expr)
        ns = {s.name: v for s, v in self.var_values.items()}
        v = eval(pyexpr(sympy.sympify(expr)), {"min": torch.minimum, "max": torch.maximum}, ns)
        return v if isinstance(v, torch.Tensor) else torch.tensor(v)

    def load(self, name, index):
        idx = self._eval(index)
        if self.masks:
            idx = torch.where(self.masks[-1], idx, torch.zeros_like(idx))
        v = self.env[name][idx.long()]
        return v.to(compute_dtype(v.dtype))

    def store(self, name, index, value, mode=None):
        idx, out = self._eval(index), self.env[name]
        full = torch.broadcast_shapes(idx.shape, torch.as_tensor(value).shape, self.iter_shape)
        idx = idx.expand(full).reshape(-1).long()
        val = torch.as_tensor(value).to(out.dtype).expand(full).reshape(-1)
        if mode == "atomic_add":
            out.index_add_(0, idx, val)
        else:
            out[idx] = val

    def store_reduction(self, name, index, value):
        if (idx := self._eval(index)).dim() == len(self.iter_shape) and self.n_red:
            idx = idx.reshape(idx.shape[: idx.dim() - self.n_red])
        out = self.env[name]
        full = torch.broadcast_shapes(idx.shape, torch.as_tensor(value).shape,
                                      self.iter_shape[: len(self.iter_shape) - self.n_red])
        out[idx.expand(full).reshape(-1).long()] = torch.as_tensor(value).to(out.dtype).expand(full).reshape(-1)

    def reduction(self, dtype, src_dtype, reduction_type, value):
        nd = len(self.iter_shape)
        v = torch.as_tensor(value).expand(self.iter_shape).reshape(*self.iter_shape[: nd - self.n_red], -1)
        if reduction_type == "sum":
            return v.sum(-1, dtype=compute_dtype(dtype) if dtype.is_floating_point else None)
        if reduction_type == "any":
            return v.bool().any(-1)
        method = {"prod": "prod", "max": "amax", "min": "amin", "argmax": "argmax",
                  "argmin": "argmin"}.get(reduction_type)
        if method is None:
            raise NotImplementedError(reduction_type)
        return getattr(v, method)(-1)

    def constant(self, value, dtype):
        return torch.tensor(value, dtype=dtype)

    def index_expr(self, expr, dtype):
        return self._eval(expr).to(dtype)

    def to_dtype(self, x, dtype, src_dtype=None):
        # round to ``dtype`` (fp16/bf16 included), then hold the value in its compute dtype
        return torch.as_tensor(x).to(dtype).to(compute_dtype(dtype))

    def indirect_indexing(self, x, size, check=True, wrap_neg=True):
        s, x = sym(f"indirect{next(self.indirect)}"), torch.as_tensor(x).long()
        if wrap_neg:
            x = torch.where(x < 0, x + int(size), x)
        if check and self.masks == [] and x.numel() and (x.min() < 0 or x.max() >= int(size)):
            raise IndexError(f"index out of bounds for size {size}")
        self.var_values[s] = x
        return s

    def masked(self, mask, body, other):
        mask = torch.as_tensor(mask).bool()
        if self.masks:
            mask = mask & self.masks[-1]
        self.masks.append(mask)
        try:
            result = torch.as_tensor(body())
        finally:
            self.masks.pop()
        return torch.where(mask, result, torch.as_tensor(other, dtype=result.dtype))

    def where(self, c, a, b):
        return torch.where(torch.as_tensor(c).bool(), torch.as_tensor(a), torch.as_tensor(b))

    def load_seed(self, name, offset):
        return self.env[name][int(offset)]

    def rand(self, seed, offset, draw=torch.rand):
        """Uniform [0, 1) per element (``randn``: normal), a function of (seed, offset) only (like Philox;
        not the same numbers as Triton's ``tl.rand``)."""
        off = torch.as_tensor(offset).long()
        return draw(int(off.max()) + 1 if off.numel() else 1, generator=torch.Generator().manual_seed(int(seed)))[off]

    def randn(self, seed, offset):
        return self.rand(seed, offset, torch.randn)

    def __getattr__(self, op: str):
        if op in _TORCH_UNARY:
            return lambda x: _TORCH_UNARY[op](torch.as_tensor(x))
        if op in _TORCH_BINARY:
            return lambda a, b: _TORCH_BINARY[op](torch.as_tensor(a), torch.as_tensor(b))
        if op in UNARY_OPS and (f := getattr(torch, op, None)) is not None:
            return lambda x: f(torch.as_tensor(x))
        if op in BINARY_OPS and (f := getattr(torch, op, None)) is not None:
            return lambda a, b: f(torch.as_tensor(a), torch.as_tensor(b))
        raise NotImplementedError(f"ReferenceInterpreter: ops.{op}")
