"""Differential fuzzer: random straight-line programs, eager vs coil, with a minimizer.

``python -m coil.bench.fuzz --time 3600 --seed 0 --backends cpp,triton,aot_eager --out fuzz-out`` (docs/fuzzing.md). A
:class:`Program` (inputs with exact values and a layout, statements from the op families of
:mod:`coil.bench.fuzz_ops`) prints as a runnable repro; :func:`check` runs a function eagerly and compiled and
classifies the result (:data:`OUTCOMES`); :func:`minimize` shrinks a failing program while its :attr:`Result.signature`
stays the same.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import gc
import hashlib
import inspect
import itertools
import linecache
import logging
import math
import os
import random
import re
import signal
import sys
import textwrap
import time
import traceback
import warnings
import zlib
from collections import Counter, defaultdict
from typing import Callable, Optional

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import coil
from coil import trace
from coil.testing import LOW_PRECISION_MARGIN, TOLERANCES
from coil.bench.fuzz_ops import (DTYPES, FAMILIES, FAMILY_WEIGHTS, Ctx, gen_layout, gen_shapes, gen_values, literal)

__all__ = ["Program", "Input", "Stmt", "Result", "generate", "check", "check_program",
           "minimize", "replay", "main", "OUTCOMES", "BACKENDS"]

OUTCOMES = ("ok", "mismatch", "error", "missing_error", "both_raise", "hang", "upstream", "no_reference")
FAILURES = ("mismatch", "error", "missing_error", "hang")
BACKENDS = ("cpp", "triton", "cpp_dynamic", "triton_dynamic", "aot_eager", "torch_aot_eager")
_LOW = (torch.float16, torch.bfloat16)


# ------------------------------------------------------------------ programs

@dataclasses.dataclass
class Input:
    """One argument: contiguous ``base`` values and a layout ``suffix`` applied to them."""
    name: str
    base: torch.Tensor
    suffix: str = ""

    def make(self) -> torch.Tensor:
        return eval("x" + self.suffix, {"x": self.base.clone(), "torch": torch})

    def source(self) -> str:
        return f"{self.name} = {literal(self.base)}{self.suffix}"


@dataclasses.dataclass
class Stmt:
    """One line of the program body and the op family it came from."""
    text: str
    family: str

    @property
    def defs(self) -> set:
        node = ast.parse(self.text).body[0]
        return {n.id for t in (node.targets if isinstance(node, ast.Assign) else []) for n in ast.walk(t)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    @property
    def uses(self) -> set:
        return {n.id for n in ast.walk(ast.parse(self.text)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@dataclasses.dataclass
class Program:
    """A straight-line program: inputs, statements and the names it returns. ``grad_key`` seeds gradient mode's draws
    (:func:`_with_grads`; None: a hash of the source): a generated program's comes from its (seed, index), so the
    minimizer's smaller variants are checked under the same draws."""
    inputs: list
    stmts: list
    returns: list
    label: str = ""
    grad_key: Optional[int] = None

    def fn_source(self) -> str:
        ret = ", ".join(self.returns) + ("," if len(self.returns) == 1 else "")
        body = [s.text for s in self.stmts] + [f"return ({ret})"]
        args = ", ".join(i.name for i in self.inputs)
        return f"def fn({args}):\n" + "".join(f"    {line}\n" for line in body)

    def function(self) -> Callable:
        """The program as a Python function (its source is registered with linecache)."""
        src = self.fn_source()
        filename = f"<coil-fuzz {hashlib.sha1(src.encode()).hexdigest()[:12]}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        ns = {"torch": torch, "nan": math.nan, "inf": math.inf}
        exec(compile(src, filename, "exec"), ns)
        return ns["fn"]

    def make_inputs(self) -> list:
        return [i.make() for i in self.inputs]

    def families(self) -> set:
        return {s.family for s in self.stmts}

    def source(self, result: Optional["Result"] = None) -> str:
        """A runnable repro module (``python repro.py`` replays it)."""
        head = [f"# coil fuzz repro {self.label}".rstrip()]
        if result is not None:
            head.append(f"# {result.outcome} on backend {result.backend}: {result.kind}")
            head += ["#   " + line for line in result.detail.splitlines()[:6]]
        inputs = "".join(f"    {i.source()}\n" for i in self.inputs)
        names = ", ".join(i.name for i in self.inputs)
        backend = result.backend if result is not None else "cpp"
        key = f", grad_key={self.grad_key}" if self.grad_key is not None and backend.endswith("+grad") else ""
        return ("\n".join(head) + "\nimport torch\nfrom math import inf, nan\n\n\n"
                + self.fn_source() + "\n\ndef make_inputs():\n" + inputs
                + f"    return [{names}]\n\n\nif __name__ == \"__main__\":\n"
                "    from coil.bench.fuzz import replay\n"
                f"    replay(fn, make_inputs, {backend!r}{key})\n")


def _quiet():
    return warnings.catch_warnings(action="ignore")


def _replay_env(inputs: list, stmts: list) -> dict:
    env = {"torch": torch, **{i.name: i.make() for i in inputs}}
    with _quiet():
        for s in stmts:
            exec(s.text, env)
    return env


def generate(seed: int, index: int, families: Optional[list] = None, max_stmts: int = 8, big: bool = False) -> Program:
    """Program number ``index`` of ``seed`` (independent of the others: replayable alone); ``big``: larger shapes
    (:func:`coil.bench.fuzz_ops.gen_shapes`)."""
    rng = random.Random(f"coil-fuzz:{seed}:{index}")
    fams = [f for f in FAMILY_WEIGHTS if not families or f in families]
    if not fams:
        raise ValueError(f"no such op family in {families}; known: {sorted(FAMILY_WEIGHTS)}")
    for _ in range(50):
        prog = _build(rng, fams, max_stmts, big)
        prog.label, prog.grad_key = f"seed {seed} index {index}", zlib.crc32(f"{seed}:{index}".encode())
        if prog.stmts and _deterministic(prog):
            return prog
    raise RuntimeError(f"could not build a program for seed {seed} index {index}")


def _build(rng: random.Random, fams: list, max_stmts: int, big: bool = False) -> Program:
    n = rng.randint(1, 4)
    primary = rng.choices(DTYPES, [1, 1, 5, 1, 1, 1, 2, 1])[0]
    inputs = []
    for name, shape in zip("abcd", gen_shapes(rng, n, big)):
        dt = primary if rng.random() < 0.7 else rng.choice(DTYPES)
        kind = rng.choices(["normal", "special", "extreme", "ints"], [6, 2, 1, 2])[0]
        base_shape, suffix = gen_layout(rng, shape)
        inputs.append(Input(name, gen_values(rng, base_shape, dt, kind), suffix))
    env, stmts, raised = _replay_env(inputs, []), [], set()
    target, tries = rng.randint(2, max_stmts), 0
    while len(stmts) < target and tries < 100:
        tries += 1
        fam = rng.choices(fams, [FAMILY_WEIGHTS[f] for f in fams])[0]
        gens = FAMILIES[fam]
        gen = rng.choices([g for _, g in gens], [w for w, _ in gens])[0]
        before = set(env)
        try:
            lines = gen(Ctx(rng, env, [i.name for i in inputs]))
        except Exception:  # Skip, or parameters eager's own helpers reject
            lines = None
        for k in set(env) - before:
            del env[k]
        if not lines:
            continue
        new = [Stmt(line, fam) for line in ([lines] if isinstance(lines, str) else lines)]
        try:
            with _quiet():
                for s in new:
                    exec(s.text, env)
            stmts += new
        except Exception as e:  # eager rejects it: keep it now and then (a missing error?)
            if stmts and rng.random() < 0.04 and "ZeroDivision" not in str(e):
                stmts += new
                raised = {d for s in new for d in s.defs}
                break
            env = _replay_env(inputs, stmts)
    defined = [d for s in stmts for d in sorted(s.defs)]
    used = {u for s in stmts for u in s.uses}
    rets = [d for d in defined if d not in used or d in raised or rng.random() < 0.3]
    if rng.random() < 0.15:
        rets.append(rng.choice(inputs).name)
    return Program(inputs, stmts, rets)


def _same_bits(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a != a) & (b != b)).all())
    return type(a) is type(b)


def _deterministic(prog: Program) -> bool:
    """Eager gives bit-identical results twice (rejects order-dependent programs)."""
    runs = []
    for _ in range(2):
        args = prog.make_inputs()
        try:
            with _quiet():
                out = prog.function()(*args)
        except Exception as e:
            out = e
        runs.append(pytree.tree_leaves((out, args)))
    return len(runs[0]) == len(runs[1]) and all(map(_same_bits, *runs))


# ------------------------------------------------------------------ checking

@dataclasses.dataclass
class Result:
    """What :func:`check` found. ``kind``: the mismatch kind or the error's site."""
    outcome: str
    backend: str
    kind: str = ""
    detail: str = ""

    @property
    def signature(self) -> str:
        return f"{self.outcome}:{self.backend}:{self.kind}"


class _Hang(BaseException):
    pass


def _fire(*_):
    raise _Hang()


@contextlib.contextmanager
def _deadline(seconds: float):
    try:  # (no deadline outside the main thread: ValueError)
        old = signal.signal(signal.SIGALRM, _fire) if seconds and hasattr(signal, "setitimer") else False
    except ValueError:
        old = False
    if old is not False:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if old is not False:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def compile_for(fn: Callable, backend) -> Callable:
    """``fn`` compiled by one of :data:`BACKENDS` (``cpp``/``triton``: coil's kernels; ``*_dynamic``: the same with
    ``dynamic=True``, symbolic sizes through every layer).

    A callable ``backend`` is used as ``backend(fn)`` (tests plant fake compilers so)."""
    if callable(backend):
        return backend(fn)
    if backend.startswith("triton"):
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if backend in ("cpp", "triton"):
        return coil.compile(fn, options={"cpu_backend": backend})
    if backend in ("cpp_dynamic", "triton_dynamic"):  # every size symbolic (0/1 specialized)
        return coil.compile(fn, dynamic=True, options={"cpu_backend": backend.split("_")[0]})
    if backend in ("aot_eager", "torch_aot_eager"):
        return (torch.compile if backend.startswith("torch") else coil.compile)(fn, backend="aot_eager")
    raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")


def _reset(backend: str) -> None:
    coil.reset()
    if str(backend).startswith("torch"):
        torch.compiler.reset()


def _site(exc: BaseException) -> str:
    """``Type@coil/file.py:function`` of the innermost coil frame of the root cause."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    root = os.path.dirname(coil.__file__)  # coil's own files, not generated kernels
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename.startswith(root) and os.sep + "testing" + os.sep not in f.filename]
    return type(exc).__name__ + (f"@coil{frames[-1].filename[len(root):]}:{frames[-1].name}" if frames else "")


def _with_grads(fn: Callable, key: int = 0) -> Callable:
    """``fn`` in gradient mode (docs/fuzzing.md), its draws seeded by ``key``: its float tensor arguments made leaves
    that require grad (detached: same memory and layout; in-place writes to them are errors) or, for half the keys,
    views at their layout of a clone of a leaf holding their storage (written in place through autograd; copied back
    after the call); the backward of its float outputs with random cotangents (multiples of 1/16: exact in every
    float dtype). Returns (outputs, which require grad, the leaves' ``.grad``)."""
    def run(*args):
        view = torch.rand((), generator=(gen := torch.Generator().manual_seed(key))) < 0.5
        fl = [isinstance(a, torch.Tensor) and a.is_floating_point() for a in args]
        leaves = [(_flat(a).clone() if view else a.detach()).requires_grad_() if f else a for a, f in zip(args, fl)]
        xs = [x.clone().as_strided(a.shape, a.stride(), a.storage_offset()) if f and view else x
              for a, x, f in zip(args, leaves, fl)]
        out = fn(*xs)
        outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.is_floating_point()]
        diff = [(o, (torch.randint(-8, 8, o.shape, generator=gen) / 8 + 1 / 16).to(o.dtype)) for o in outs]
        for a, x in [(a, x) for a, x, f in zip(args, xs, fl) if f and view]:
            _flat(a).copy_(_flat(x))
        if any(o.requires_grad for o in outs):
            torch.autograd.backward(*zip(*[d for d in diff if d[0].requires_grad]))
        return out, [o.requires_grad for o in outs], [getattr(x, "grad", None) for x in leaves]
    return run


def _grad_problem(kind: str, msg: str, e_out) -> tuple:
    """A problem with :func:`_with_grads`'s output ``k`` named for what it is: ``grad-*`` (an input's ``.grad``) or
    ``grad-requires`` (whether a float output requires grad)."""
    k, n, m = int(re.match(r"output (\d+)|", msg)[1] or -1), len(pytree.tree_leaves(e_out[0])), len(e_out[1])
    rest = msg[len(str(k)) + 7:]  # (after "output k")
    return (kind, msg) if k < n or "out-" not in kind else \
        (re.sub(r"out-\w+", "grad-requires", kind), f"float output {k - n} requires_grad{rest}") if k < n + m else \
        (kind.replace("out-", "grad-"), f"grad of input {k - n - m}{rest}")


def _reference(fn: Callable, make_inputs: Callable, e_out, wrap=lambda f: f) -> Optional[tuple]:
    """(outputs, inputs) of ``wrap(fn)`` with its fp16/bf16 dtypes replaced by fp32, on upcast inputs; None when there
    is nothing to upcast or it fails."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    args = make_inputs()
    if not ("float16" in src or any(isinstance(x, torch.Tensor) and x.dtype in _LOW
                                    for x in pytree.tree_leaves((args, e_out)))):
        return None
    for dt in _LOW:
        src = src.replace(str(dt), str(torch.float32))
    ns = dict(fn.__globals__)
    try:
        exec(src, ns)
        with _quiet():
            return wrap(ns[fn.__name__])(*[x.float() if isinstance(x, torch.Tensor) and x.dtype in _LOW
                                     else x for x in args]), args
    except Exception:
        return None


class _Stats64(TorchDispatchMode):
    """Eager with ``_F64_STATS`` ops run in float64, rounded to eager's dtypes (docs/fuzzing.md)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket not in _STATS_OPS:
            return out
        up = lambda x: x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x  # noqa: E731
        kw = {k: torch.float64 if k == "dtype" and v is not None else up(v) for k, v in (kwargs or {}).items()}
        return pytree.tree_map(lambda o, h: h.to(o.dtype) if isinstance(o, torch.Tensor) else o,
                               out, func(*pytree.tree_map(up, args), **kw))


class _Overflowed(TorchDispatchMode):
    """Eager's statistic overflowed (a layer_norm/var/std/prod of finite values that :func:`_too_big` is not finite, or
    a layer_norm's rstd is 0): its later values depend on where its algorithm overflowed (fuzz seed 92 #2193: eager's
    rstd NaN, coil's 0, compared by ``ge``; s98 #950: eager's rstd 0, coil's mean inf, summed). Raises in that op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [x for x in pytree.tree_leaves(args) if isinstance(x, torch.Tensor) and x.is_floating_point()]
        if func.overloadpacket in _STATS_OPS and all(x.isfinite().all() for x in ins) and \
                any(_too_big(x, func.overloadpacket is torch.ops.aten.prod) for x in ins) and (not all(
                o.isfinite().all() for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor))
                or func.overloadpacket is torch.ops.aten.native_layer_norm and (out[2] == 0).any()):
            raise FloatingPointError(self.__doc__)
        if func.overloadpacket in _SUM_OPS and ins and out.is_floating_point() and all(
                x.isfinite().all() for x in ins) and not out.isfinite().all():
            exact = func(*[a.double() if a is ins[0] else a for a in args], **{**(kwargs or {}), "dtype": None}
                         if "dtype" in (kwargs or {}) else (kwargs or {}))
            if (exact.abs() < torch.finfo(out.dtype).max)[~out.isfinite()].all():  # only its order's
                raise FloatingPointError("eager's partial sums overflowed (s201 #1703)")  # partials did
        return out


def _run_in(mode: TorchDispatchMode, fn: Callable, make_inputs: Callable) -> Optional[tuple]:
    """(outputs, inputs) of ``fn`` on fresh inputs under ``mode``, or None if it fails."""
    args = make_inputs()
    try:
        with _quiet(), mode:
            return fn(*args), args
    except Exception:
        return None


#: ops whose CPU statistics coil computes in float64 (docs/ir.md, "Numerics"), ops that
#: sum (their partial sums overflow in one order and not in another), others :class:`_Bounds` bounds
_CASTS = re.compile(r"torch\.(float32|float16|bfloat16)\b")
_F64_STATS = re.compile(r"\b(layer_norm|var|std|var_mean|std_mean|prod)\b")
_ULP_NAMES = ("sqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "sinh", "cosh",
              "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "atan2", "erf", "erfc", "erfinv", "pow",
              "sigmoid", "rsqrt", "lgamma", "digamma", "logit", "silu", "softplus", "mish", "logsumexp")
_ULP_OPS = {getattr(torch.ops.aten, n) for n in _ULP_NAMES}  # within 2 ulp (eager's float32 sqrt too)
_BOUNDED = re.compile(r"\b(fmod|remainder|copysign|signbit|var|std|maximum|minimum|fmax|fmin|amax|amin|max|min|"
                      r"gelu|prod|" + "|".join(_ULP_NAMES) + r")\b| % | \*\* ")
_SUMS = re.compile(r"\b(sum|nansum|mean|cumsum|logsumexp|matmul|softmax|log_softmax|layer_norm|"
                   r"var|std|scaled_dot_product_attention|index_add_?|scatter_add_?|"
                   r"scatter_reduce|logcumsumexp|conv[12]d|avg_pool[12]d|adaptive_avg_pool[12]d|interpolate)\b")


class _Bounds(TorchDispatchMode):
    """Eager, recording in ``bounds`` (id -> (result, bound)) how far another correct result may be from eager's
    (docs/fuzzing.md, comparison rules): a sum's, a float remainder's by a computed divisor, a copysign/signbit by a
    computed NaN's; views, copies and casts keep their argument's, in-place writes drop it where they write."""

    def __init__(self, n: int, inputs: list):
        super().__init__()
        self.n, self.bounds, self.stored = n, {}, {}  # stored: storage -> (its flat tensor, bound written there)
        self.inputs = {a.untyped_storage().data_ptr() for a in inputs if isinstance(a, torch.Tensor)}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func.overloadpacket is torch.ops.aten.set_:  # (_flat: a new tensor over a storage, no value written; was
            return func(*args, **kwargs)  # compared as a write, failing the run: no bounds in gradient mode)
        written = [(t, _flat(t).clone()) for a, v in zip(func._schema.arguments, list(args) + [
            kwargs.get(a.name) for a in func._schema.arguments[len(args):]])
            if a.alias_info and a.alias_info.is_write for t in pytree.tree_leaves(v) if isinstance(t, torch.Tensor)]
        out = func(*args, **kwargs)
        for t in pytree.tree_leaves((args, kwargs)):  # written through another view of its storage: that bound
            f, sb = self.stored.get(t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None, (0, 0))
            if isinstance(sb, torch.Tensor) and f.dtype == t.dtype and sb.any() and not (
                    id(t) in self.bounds and self.bounds[id(t)][1].any()):  # (autograd's as_strided backward copies
                with contextlib.suppress(RuntimeError):  # into a view of new zeros, .grad is another: s1010 #98)
                    self.bounds[id(t)] = t, sb.as_strided(t.shape, t.stride(), t.storage_offset())
        x, op, b = args[0] if args else None, func.overloadpacket, self.bounds.get(id(args[0] if args else None))
        if op in _SUM_OPS and isinstance(x, torch.Tensor):
            dt = kwargs.pop("dtype", None) or x.dtype
            at, rt = TOLERANCES.get(x.dtype, (0.0, 0.0)) if b is None and x.untyped_storage(
            ).data_ptr() not in self.inputs else (0.0, 0.0)  # computed summands: their tolerance
            x, eps = x.double(), torch.finfo(dt).eps if dt.is_floating_point else 0.0
            bound = func(x.abs() * 2.0 ** -64, *args[1:], **kwargs) * (eps * self.n + rt) * 2.0 ** 64 + (
                func(b[1], *args[1:], **kwargs) if b else func(torch.full_like(x, at), *args[1:], **kwargs))
            if dt.is_floating_point:  # may some order's partial sums overflow, and to which sign
                exact = func(x, *args[1:], **kwargs)  # (float64 summands near the max: scaled, s210 #1419)
                exact = torch.where(exact.isfinite(), exact, func(x * 2.0 ** -64, *args[1:], **kwargs) * 2.0 ** 64), bound
                k = x.numel() // max(out.numel(), 1) if op is torch.ops.aten.mean else 1
                pos = func(x.clamp(min=0), *args[1:], **kwargs) * k >= torch.finfo(dt).max
                neg = func(x.clamp(max=0), *args[1:], **kwargs) * k <= -torch.finfo(dt).max
                bound = torch.where(pos & neg, math.nan, torch.where(pos, math.inf, torch.where(neg, -math.inf, bound)))
            self.bounds[id(out)] = (out, bound) + ((exact,) if dt.is_floating_point else ())
        elif op in _REM_OPS and isinstance(args[1], torch.Tensor) and out.is_floating_point() \
                and args[1].untyped_storage().data_ptr() not in self.inputs:
            at, rt = TOLERANCES.get(args[1].dtype, (0.0, 0.0))
            a, d = torch.as_tensor(x).double(), args[1].double()
            bound, q = a.abs() * rt + at, a / d  # near an integer quotient: a divisor more
            bound = bound + torch.where((q - q.round()).abs() * d.abs() <= bound, d.abs(), 0.0)
            sp = self._spread(func, args, kwargs, out)  # and the divisor's own bound (a mean that
            # overflowed only in eager's order: NaN there, finite in another: s210 #1419)
            self.bounds[id(out)] = out, torch.broadcast_to(bound, out.shape).nan_to_num(0.0, 0.0, 0.0) + (
                0.0 if sp is None else sp)
        elif op in (torch.ops.aten.var, torch.ops.aten.std) and out.is_floating_point() and x.numel():
            # any algorithm's rounding (eager's var of three 1e30s: 5.9e28; coil's: 0: s201 #405)
            v = x.detach().double().square().max() * torch.finfo(x.dtype).eps * 4 * (x.numel() // max(out.numel(), 1))
            self.bounds[id(out)] = out, torch.full(out.shape, (v if op is torch.ops.aten.var else v.sqrt()).item(),
                                                   dtype=torch.float64)
        elif op in _PRODUCTS and out.is_floating_point() and out.numel() and all(
                isinstance(t, torch.Tensor) for t in args[:2]):
            # a sum of products, a sum's bound, accumulated in float32 at least (s1045 #921: a bf16 mv whose partial
            # sums overflow to inf in eager's order and not in coil's float32 mul + sum, which gives the float64 value)
            a, c, dt, sp = args[0].double(), args[1].double(), out.dtype, self._spread(func, args, kwargs, out)
            eps = torch.finfo(torch.promote_types(dt, torch.float32)).eps
            err = func(a.abs(), c.abs()) * eps * a.shape[-1] + (0.0 if sp is None else sp)
            pos, neg = (lambda t: t.clamp(min=0)), (lambda t: t.clamp(max=0))  # noqa: E731
            up = func(pos(a), pos(c)) + func(neg(a), neg(c)) >= torch.finfo(dt).max
            down = func(pos(a), neg(c)) + func(neg(a), pos(c)) <= -torch.finfo(dt).max
            bound = torch.where(up & down, math.nan, torch.where(up, math.inf, torch.where(down, -math.inf, err)))
            self.bounds[id(out)] = out, bound, (func(a, c), err)
        elif op is torch.ops.aten.gelu and out.is_floating_point():  # 1 + erf cancels in the tail: s203 #10433
            sp = self._spread(func, args, kwargs, out)  # (plus its argument's bound)
            self.bounds[id(out)] = out, x.double().abs() * torch.finfo(x.dtype).eps * 4 + (0.0 if sp is None else sp)
        elif op is torch.ops.aten.prod and out.is_floating_point() and x.numel():
            # partial products past the range in some order (no zero factor): 0, inf or the value (s203 #11361),
            # plus the factors' bounds (a float64 prod of a float32 gelu's tail: s326 #850)
            a, fi, kw = x.double().abs(), torch.finfo(out.dtype), {k: v for k, v in kwargs.items() if k != "dtype"}
            odd = (func(a.clamp(min=1), *args[1:], **kw) >= fi.max) | (func(a.clamp(max=1), *args[1:], **kw) <= fi.tiny)
            sp = self._spread(func, args, kwargs, out)
            self.bounds[id(out)] = out, (odd & (func((a != 0).double(), *args[1:], **kw) != 0)).double() * ANYTHING + (
                0.0 if sp is None else sp)
        elif op in (torch.ops.aten.copysign, torch.ops.aten.signbit) and isinstance(
                s := args[-1], torch.Tensor) and s.untyped_storage().data_ptr() not in self.inputs:
            # IEEE 754 leaves an arithmetic NaN's sign to the implementation (eager's float32 sum of
            # [-inf, inf, nan] is -NaN, other orders' +NaN: s102 #3793): the other sign is as good
            other = torch.where(s.isnan(), -out if out.is_floating_point() else ~out, out).double()
            self.bounds[id(out)] = out, torch.zeros(out.shape), (other, torch.zeros(out.shape))
        elif op in _EXTREMA_OPS and isinstance(out, torch.Tensor) and out.is_floating_point() and (out == 0).any():
            # max/min of zeros of both signs: IEEE 754 allows either, eager's vector and scalar
            # loops differ (the binary maximum's rule, s202 #13189, for reductions: s216 #10785)
            other = torch.where(out == 0, -out, out).double()
            self.bounds[id(out)] = out, torch.zeros(out.shape), (other, torch.zeros(out.shape))
        elif written or op in _ACC_OPS:
            # duplicate indices sum: in eager's order and precision or another's (eager
            # itself rounds each add of a 1-D fp16 index_add_, not of a 2-D one: s100 #5064)
            acc = op in _ACC_OPS and out.is_floating_point() and (
                op not in (torch.ops.aten.index_put, torch.ops.aten.index_put_) or (
                    args[3:4] or [kwargs.get("accumulate")])[0]) and self._accumulated(func, args, kwargs, out.dtype)
            self._drop_written(func, args, kwargs, written)
            if not isinstance(acc, torch.Tensor) and isinstance(out, torch.Tensor) and not out.is_complex():
                acc = self._spread(func, args, kwargs, out)  # (d.div_(x) by an uncertain x)
            if isinstance(acc, torch.Tensor):
                self.bounds[id(out)] = out, acc
                if isinstance(out, torch.Tensor) and acc.shape == out.shape:
                    f, sb = self.stored.setdefault(out.untyped_storage().data_ptr(), (
                        _flat(out), torch.zeros(_flat(out).shape, dtype=torch.float64)))
                    if f.dtype == out.dtype:
                        sb.as_strided(out.shape, out.stride(), out.storage_offset()).copy_(acc)
        elif b and (func.is_view or op in (torch.ops.aten.clone, torch.ops.aten._to_copy, torch.ops.aten._unsafe_view)):
            shaped = func.is_view or op is torch.ops.aten._unsafe_view  # (matmul's mv output: s1045 #921)
            try:  # the same values: the same bound (and exact value), viewed the same way
                bs = [func(u, *args[1:], **kwargs) if shaped else u for u in (b[1], *sum(b[2:], ()))]
            except Exception:
                return out
            for t, u, *ex in zip(pytree.tree_leaves(out), *map(pytree.tree_leaves, bs)):
                self.bounds[id(t)] = (t, u) + ((tuple(ex),) if ex else ())
        elif op is torch.ops.aten.native_layer_norm_backward and out[0] is not None and out[0].numel():
            # ATen's kernel: rstd g + b x + c (g = dy w), whose terms cancel (a row of one value: exact 0, eager's
            # 0.0099 for |g| 300, rstd 316: s1015 #174): each term's rounding, summed over the row
            dy, x, w, dims = args[0].double(), args[1].double(), args[5], tuple(range(args[1].dim() - len(args[2]),
                                                                                     args[1].dim()))
            g, r = (dy * w.double() if isinstance(w, torch.Tensor) else dy).abs(), args[4].double()
            xh, m = ((x - args[3].double()) * r).abs(), lambda t: t.mean(dims, keepdim=True)  # noqa: E731
            eps = torch.finfo(torch.promote_types(args[1].dtype, torch.float32)).eps
            self.bounds[id(out[0])] = out[0], (8 * eps * math.prod(args[2]) * r * (g + m(g) + xh * m(g * xh))
                                               ).nan_to_num(0.0, 0.0, 0.0)
        elif op is torch.ops.aten.native_layer_norm and out[0].is_floating_point() and out[0].numel():
            # eager's float32 mean and rstd round: a normalized 0 is a tiny value of either sign (s202 #5348)
            x, w = args[0].double(), args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
            dims, r = tuple(range(x.dim() - len(args[1]), x.dim())), out[2].double()
            u = x.abs().amax(dims, keepdim=True) * r \
                * torch.finfo(torch.promote_types(args[0].dtype, torch.float32)).eps * 4 * math.prod(args[1])
            u = torch.broadcast_to(  # (none where a statistic overflowed)
                u * (w.double().abs() if w is not None else 1.0), out[0].shape).nan_to_num(0.0, 0.0, 0.0)
            du, dw = (self.bounds[id(t)][1].double() if id(t) in self.bounds else torch.zeros(()) for t in (args[0], w))
            if du.any() or dw.any():  # its arguments' bounds, to first order: a row of close values
                # normalized amplifies them by rstd (s206 #8553: a bf16 index_put_ accumulated in another order)
                xh, m = ((x - out[1].double()) * r).abs(), lambda t: t.mean(dims, keepdim=True)  # noqa: E731
                dx = r * (du + m(du)) + xh * r * m(xh * du)
                u = u + (dx * (w.double().abs() + dw if w is not None else 1.0) + xh * dw).nan_to_num(
                    ANYTHING, ANYTHING, ANYTHING).clamp(max=ANYTHING)
            self.bounds[id(out[0])] = out[0], u
        elif isinstance(out, torch.Tensor) and not out.is_complex():
            u = self._spread(func, args, kwargs, out)
            if op in _ULP_OPS and out.is_floating_point():  # libm's last bit: eager's sinh(7.) is an
                # ulp off the nearest, an ill-conditioned tan of it 5e-4 (s204 #14768)
                o = out.detach().double()
                ulp = torch.where(o.isfinite(), o.abs() * torch.finfo(out.dtype).eps * 2, 0.0)
                u = ulp if u is None else u + ulp
            if op is torch.ops.aten._log_softmax and out.is_floating_point() and out.numel():
                # eager's CPU kernel takes x - (max + log(sum)) with the row's logsumexp rounded to the dtype first:
                # half an ulp of it off where the output is near 0 (fp16 -1.3730 for -1.37389; s231 #237)
                lse = torch.logsumexp(x.detach().double(), args[1], keepdim=True).abs()  # (and an ulp of the output)
                ulp = (torch.broadcast_to(lse, out.shape) / 2 + out.detach().double().abs()).nan_to_num(
                    0.0, 0.0, 0.0) * torch.finfo(out.dtype).eps
                u = ulp if u is None else u + ulp
            if u is not None:
                self.bounds[id(out)] = out, u
        return out

    def _spread(self, func, args, kwargs, out) -> Optional[torch.Tensor]:
        """How far ``out`` of another correct run may be from eager's given its arguments' bounds (None: nothing is
        uncertain): the largest change of ``func`` over the :meth:`_alternatives` of up to 3 uncertain arguments
        (bilinear ops by magnitudes), 1.0 on a flipped comparison, :data:`ANYTHING` where inf or NaN is reached. Also
        a source: ``maximum(0.0, -0.0)`` is either zero (eager's vector and scalar loops: s202 #13189)."""
        op, leaves = func.overloadpacket, pytree.tree_leaves((args, kwargs))
        ins = [t for t in leaves if isinstance(t, torch.Tensor) and id(t) in self.bounds and (
            not t.is_complex() and isinstance(self.bounds[id(t)][1], torch.Tensor) and self.bounds[id(t)][1].any()
            or len(self.bounds[id(t)]) > 2 and (t.dtype == torch.bool or t.is_floating_point() and not _same(
                self.bounds[id(t)][2][0], t.double())))][:3]  # (a signbit of a computed NaN, a max of signed zeros)
        if op in _TIE_OPS and out.is_floating_point() and all(isinstance(a, torch.Tensor) for a in args[:2]):
            a, c = torch.broadcast_tensors(*args[:2])
            tie = (a == 0) & (c == 0) & (a.signbit() != c.signbit())
            if not ins and tie.any():
                return tie.double() * 5e-324
        if not ins or out.is_complex() or not (out.is_floating_point() or out.dtype == torch.bool or any(
                not t.is_floating_point() for t in ins)):  # (integers from a signbit: s302 #771)
            return None

        def run(values):  # func on copies, the uncertain arguments replaced by ``values``
            swap = lambda a: (values[id(a)] if id(a) in values else a.clone()) if isinstance(a, torch.Tensor) else a  # noqa
            m, o = func(*pytree.tree_map(swap, list(args)), **pytree.tree_map(swap, kwargs)).double(), out.double()
            return torch.where((m == o) | m.isnan() & o.isnan(), 0.0, (m - o).abs().nan_to_num(ANYTHING, ANYTHING))
        try:
            if op in _BILINEAR:  # |A| uB + uA |B| + uA uB
                mag = {id(t): t.double().abs() for t in ins}
                wide = {id(t): mag[id(t)] + self.bounds[id(t)][1].double().nan_to_num(ANYTHING, ANYTHING, ANYTHING)
                        for t in ins}
                u = (func(*[wide.get(id(a), a) for a in args], **kwargs).double()
                     - func(*[mag.get(id(a), a) for a in args], **kwargs).double()).nan_to_num(ANYTHING, ANYTHING)
            else:
                u = torch.zeros(out.shape, dtype=torch.float64)
                for combo in itertools.product(*[self._alternatives(t) for t in ins]):
                    u = torch.maximum(u, run({id(t): v for t, v in zip(ins, combo)}))
        except Exception:  # noqa: BLE001 - an op that takes no float64 (indices, dtypes)
            return None
        return u.clamp(0, ANYTHING) if isinstance(u, torch.Tensor) and u.shape == out.shape else None

    def _alternatives(self, t: torch.Tensor) -> list:
        """Values (float64) another correct run may give for ``t``, elementwise: eager's moved by its bound either way,
        or snapped to a zero of either sign where that is within it (where the bound is :data:`ANYTHING`: +-inf and
        NaN too); where an order of a sum overflows (bound inf or NaN), that infinity, and where orders overflow to
        both (bound NaN) either one or NaN (inf + -inf: s217 #1622); a sum's exact value rounded (the mean of six
        equal values is that value: s205 #3181)."""
        e, x = self.bounds[id(t)], t.double()
        if t.dtype == torch.bool:  # a signbit of a computed NaN: its other value there; a comparison that may flip
            return [e[2][0].to(t.dtype) if len(e) > 2 else t ^ (e[1] != 0)]  # (bound 1): the flipped one (c406 #11)
        bd, exact = e[1].double(), e[2][0].to(t.dtype).double() if len(e) > 2 else x
        fin, inf = bd.nan_to_num(0.0, 0.0, 0.0), math.inf
        alts = [x + fin, x - fin] + [torch.where(x.abs() <= fin, z, x) for z in (0.0, -0.0)] + [
            torch.where(bd >= ANYTHING, v, x) for v in (inf, -inf, math.nan)] + [torch.where(
                (bd == v) | bd.isnan(), v, x) for v in (inf, -inf, math.nan)] + [exact]
        return [v for v in alts if not _same(v, x)] or [x]

    def _drop_written(self, func, args, kwargs, written: list) -> None:
        """Drop the bounds of the elements ``func`` wrote (``written``: the arguments it writes and their storages
        before), those not as before in eager's call and in one on other values, in every tensor over that memory
        (``scatter_`` into a mean: s102 #767)."""
        again = {id(t): _flat(torch.full_like(old, 3), t) for t, old in written}
        swap = lambda x: again.get(id(x), x)  # noqa: E731
        func(*pytree.tree_map(swap, list(args)), **pytree.tree_map(swap, kwargs))
        masks = {}  # storage -> (its elements' size, which of them were written)
        for t, old in written:
            new, other, ptr = _flat(t), _flat(again[id(t)]), t.untyped_storage().data_ptr()
            kept = ((new == old) | (new != new) & (old != old)) & (other == 3)
            masks[ptr] = t.element_size(), masks.get(ptr, (0, False))[1] | ~kept
            if ptr in self.stored and self.stored[ptr][0].dtype == t.dtype:
                self.stored[ptr][1].masked_fill_(~kept, 0.0)
        for i, (v, bound, *exact) in list(self.bounds.items()):
            size, m = masks.get(v.untyped_storage().data_ptr(), (0, None))
            if m is not None:
                w = m.as_strided(v.shape, v.stride(), v.storage_offset()) \
                    if size == v.element_size() else torch.tensor(True)
                self.bounds[i] = (v, bound.masked_fill(w, 0.0)) + tuple(
                    (x.where(~w, v.double()), err.masked_fill(w, 0.0)) for x, err in exact)

    def _accumulated(self, func, args, kwargs, dtype) -> torch.Tensor:
        """The rounding-error bound of an accumulating op (:data:`_ACC_OPS`) per element: the op on the magnitudes
        (float64) times the dtype's eps times the number of values added into the element, plus the bounds its float
        arguments carried in."""
        leaves, spec = pytree.tree_flatten(list(args))

        def each(f):  # the op on its arguments with each float tensor k replaced by f(k, tensor)
            return func(*pytree.tree_unflatten([f(k, t) if isinstance(t, torch.Tensor) and t.is_floating_point()
                                                else t for k, t in enumerate(leaves)], spec), **kwargs)
        f64 = dict(dtype=torch.float64)
        adds = each(lambda k, t: torch.full(t.shape, float(k > 0), **f64))
        carried = each(lambda k, t: self.bounds[id(t)][1].double() if id(t) in self.bounds else torch.zeros(t.shape, **f64))
        return (each(lambda k, t: t.double().abs()) * torch.finfo(dtype).eps * adds + carried).nan_to_num(0.0, 0.0, 0.0)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same values, zeros' signs and NaNs included."""
    return a.shape == b.shape and bool(((a == b) & (a.signbit() == b.signbit()) | a.isnan() & b.isnan()).all())


def _flat(t: torch.Tensor, layout: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``t``'s whole storage as a 1-D tensor of its dtype, or as ``layout``'s size and strides."""
    lay = () if layout is None else (layout.storage_offset(), layout.shape, layout.stride())
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), *lay)


_REM_OPS = {torch.ops.aten.fmod, torch.ops.aten.remainder}
_ACC_OPS = {torch.ops.aten.index_add, torch.ops.aten.index_add_, torch.ops.aten.scatter_add,
            torch.ops.aten.scatter_add_, torch.ops.aten.index_put, torch.ops.aten.index_put_}
_SUM_OPS = {torch.ops.aten.sum, torch.ops.aten.nansum, torch.ops.aten.mean, torch.ops.aten.cumsum}
_PRODUCTS = {torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.mv, torch.ops.aten.dot}  # sums of products
_EXTREMA_OPS = {torch.ops.aten.amax, torch.ops.aten.amin, torch.ops.aten.max, torch.ops.aten.min}
_TIE_OPS = {torch.ops.aten.maximum, torch.ops.aten.minimum, torch.ops.aten.fmax, torch.ops.aten.fmin}
_BILINEAR = {torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.matmul, torch.ops.aten.mv,
             torch.ops.aten.dot, torch.ops.aten.baddbmm, torch.ops.aten.addmm}
#: a bound meaning "any value": a result reached inf or NaN under its arguments' bounds
ANYTHING = 1e300
_STATS_OPS = {torch.ops.aten.native_layer_norm, torch.ops.aten.var, torch.ops.aten.std,
              torch.ops.aten.var_mean, torch.ops.aten.std_mean, torch.ops.aten.prod}


def _overflows(src: str, args: list) -> bool:
    """Whether a program computing statistics (``_F64_STATS``: layer_norm, var, std, prod) gets inputs whose squares,
    or, with ``prod``, whose product over a whole input, pass the largest float of their dtype (float64 for
    integers): eager's result then depends on where its algorithm overflowed (its Welford state, its lane order) and
    is not a reference. (Sums have their own bound: :class:`_Bounds`.)"""
    return bool(_F64_STATS.search(src)) and any(_too_big(x, "prod" in src) for x in args)


def _too_big(x, prod: bool) -> bool:
    """Whether tensor ``x``'s squares (with ``prod``: its product) may pass its dtype's max."""
    if not (isinstance(x, torch.Tensor) and x.numel() and not x.is_complex() and x.dtype != torch.bool):
        return False
    big = torch.finfo(x.dtype if x.is_floating_point() else torch.float64).max
    m = x.detach().double().abs().nan_to_num(posinf=0.0).max().item()
    return m * m >= big or prod and m > 1 and x.numel() * math.log(m) >= math.log(big)


def _error_bounds(fn: Callable, make_inputs: Callable) -> Optional[tuple]:
    """(outputs, inputs) like a reference's: each one's :class:`_Bounds` or None; None on failure."""
    args = make_inputs()
    mode = _Bounds(max([x.numel() for x in args if isinstance(x, torch.Tensor)], default=1), args)
    run = _run_in(mode, fn, lambda: args)
    def bound(t):  # (the entry holds t: its id is not reused while it is there)
        e = mode.bounds.get(id(t))
        return None if e is None else _Exact(e[1], *e[2]) if len(e) > 2 else e[1]
    return run and pytree.tree_map(bound, run)


class _Exact:
    """A sum's bound, its float64 value and its rounding-error bound; a copysign/signbit by a computed NaN's: 0, its
    value of the other sign there and 0 (a pytree leaf)."""

    def __init__(self, bound, exact, err):
        self.bound, self.exact, self.err = bound, exact, err


#: a program reading a float's bits (``x.view(torch.int32)``); the dtype they may be NaNs of
_BIT_VIEW = re.compile(r"\.view\(torch\.(u?int\d+|float\d+|bfloat16)\)")
_BIT_PAIRS = {torch.int32: torch.float32, torch.int64: torch.float64,
              torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}


def _leaves(ref: Optional[tuple], n_out: int, n_args: int) -> tuple:
    """(output leaves, argument list) of a reference run, or Nones if its structure differs."""
    if ref is not None and len(pytree.tree_leaves(ref[0])) == n_out:
        return pytree.tree_leaves(ref[0]), ref[1]
    return [None] * n_out, [None] * n_args


def _compare_tensor(what: str, c, e, r, r64=None, sums=False,
                    bound=None, bits: bool = False, narrow=()) -> Optional[tuple]:
    """(kind, message) when compiled ``c`` differs from eager ``e`` (``r``: fp32 reference, ``r64``: float64 reference,
    ``sums``: the program sums, ``bound``: :class:`_Bounds`, ``bits``: it views floats as another dtype, ``narrow``:
    the fp16/bf16 dtypes of the program's inputs; docs/fuzzing.md)."""
    if not isinstance(e, torch.Tensor) or not isinstance(c, torch.Tensor):  # (or one is: types differ)
        same = type(c) is type(e) and (c == e or c != c and e != e)
        return None if same else ("value", f"{what}: {c!r} vs eager {e!r}")
    if c.shape != e.shape:
        return "shape", f"{what}: shape {tuple(c.shape)} vs eager {tuple(e.shape)}"
    if c.dtype != e.dtype:
        return "dtype", f"{what}: dtype {c.dtype} vs eager {e.dtype}"
    a, b = c.detach().double(), e.detach().double()
    at, rt = TOLERANCES.get(e.dtype, (0.0, 0.0))  # (none for integers)
    close = torch.isclose(a, b, rtol=rt, atol=at, equal_nan=True) if e.is_floating_point() else a == b
    if e.is_floating_point() and not close.all():  # eager overflowed where compiled did not
        big = torch.finfo(e.dtype).max / 4
        close |= b.isinf() & a.isfinite() & (a * b.sign() >= big)
    if isinstance(r, torch.Tensor) and r.shape == c.shape and not close.all():
        ref = r.detach().double()
        # (where eager's is infinite and the reference finite, every finite value would be
        # closer: the sum rules below decide there; seed 1045 #921, an fp32 reference whose
        # vector order stayed finite)
        off = (b - ref).abs()
        closer = ((a - ref).abs() <= LOW_PRECISION_MARGIN * off + at) & (off.isfinite() | ~ref.isfinite())
        close = close | (a == ref) | (a.isnan() & ref.isnan()) | closer
        if e.is_floating_point():  # eager's rounding gave NaN (bf16 logsumexp -0.0015 ** x;
            close |= b.isnan() & torch.isclose(a, ref, rtol=rt, atol=at)  # s95 #689)
    if not close.all():
        close |= _documented_numerics(a, b, e.dtype, r64, sums)
    for low in narrow if e.dtype in (torch.float32, torch.float64) and not close.all() else ():
        if torch.finfo(low).bits < torch.finfo(e.dtype).bits:
            close |= _one_narrow_ulp(a, b, low)
    if bits and e.dtype in _BIT_PAIRS and not close.all():  # a float's bits: its ulps show
        fc, fe = (t.detach().contiguous().view(_BIT_PAIRS[e.dtype]).double() for t in (c, e))
        fat, frt = TOLERANCES.get(_BIT_PAIRS[e.dtype], (0.0, 0.0))
        close |= torch.isclose(fc, fe, rtol=frt, atol=fat, equal_nan=True)
    if isinstance(bound, _Exact):
        x, err, bound = bound.exact, bound.err, bound.bound
        if x.shape == a.shape:  # a sum: any order whose partial sums stayed finite is within
            # the error bound of the float64 sum (where eager's order overflowed: s83 #2135,
            # s94 #1870); a copysign/signbit by a computed NaN: the other sign there
            close |= (a == x) | a.isfinite() & ((a - x).abs() <= err + at + rt * x.abs())
    if isinstance(bound, torch.Tensor) and bound.shape == a.shape:
        close |= (a - b).abs() <= bound.nan_to_num(0.0, 0.0, 0.0)
        close |= bound.isfinite() & (bound >= ANYTHING)  # inf or NaN were reachable
        both = bound.isnan()  # compiled overflowed as some order of the summands can
        close |= bound.isinf() & (a == bound) | both & (a.isinf() | a.isnan())
    if bool(close.all()):
        return None
    i = tuple((~close).nonzero()[0].tolist())
    return "value", (f"{what}: {int((~close).sum())} of {c.numel()} differ ({c.dtype}); first at "
                     f"{i}: compiled {c[i].item()!r} vs eager {e[i].item()!r}")


def _one_narrow_ulp(a: torch.Tensor, b: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """Elements where float64 copies ``a`` and ``b`` of a float32/64 result both hold a value of the narrower dtype
    ``low`` (last rounded to it, as a bf16 ``log_softmax`` ``cat`` with float32) one ``low`` ulp apart: the two
    roundings of a value near a midpoint. Seed 101 #1894: the exact value -0.806683 rounds to bf16 -0.80859375
    (coil); eager's float32 error crossed the midpoint -0.806640625 (-0.8046875)."""
    exact = (a.to(low).double() == a) & (b.to(low).double() == b) & a.isfinite() & b.isfinite()
    big = torch.maximum(a.abs(), b.abs()).clamp_min(torch.finfo(low).tiny)  # its ulp:
    return exact & ((a - b).abs() <= torch.exp2(torch.floor(torch.log2(big))) * torch.finfo(low).eps)


def _documented_numerics(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, r64, sums) -> torch.Tensor:
    """Elements where compiled ``a`` differs from eager ``b`` (float64 copies) in one of two documented ways: (1) given
    ``r64`` (the float64 reference of a program using an op whose CPU statistics coil computes in float64:
    layer_norm/var/std/prod, docs/ir.md Numerics), compiled is within the dtype's tolerance of the reference (eager's
    float32 statistics overflowed: NaN, or 0 from a zero rstd), or both are not finite (coil overflowed later, in the
    float32 normalization); (2) in a program that sums, eager's element is at least 1/64 of the dtype's max (or inf)
    and compiled's is NaN (partial sums +inf and -inf met) or, where eager's is finite, inf of the same sign: the
    partial sums of another valid order overflowed; (3) ``sums == "overflow"`` (:func:`_overflows`: the program's
    statistics overflow the dtype), both are NaN, ±inf or 0 (not infinities of opposite signs)."""
    ok = torch.zeros_like(a, dtype=torch.bool)
    if dtype.is_floating_point:
        near = b.abs() >= torch.finfo(dtype).max / 64  # inf too
        ok = near & (a.isnan() | a.isinf() & (a.sign() == b.sign()) & b.isfinite()) & bool(sums)
    if sums == "overflow":  # both outcomes of an overflowed statistic: NaN, ±inf or 0
        ok |= ~(a.isfinite() & (a != 0)) & ~(b.isfinite() & (b != 0)) & (a * b != -math.inf)
    if isinstance(r64, torch.Tensor) and r64.shape == a.shape:  # an argmax of it: exactly
        at, rt = TOLERANCES.get(dtype, (0.0, 0.0))
        ok |= ~b.isfinite() & ~a.isfinite() | torch.isclose(a, r64.detach().to(dtype).double(),
                                                             rtol=rt, atol=at, equal_nan=True)
    return ok


def _integer_outputs_only(problems: list, e_out) -> bool:
    """Whether every problem is a value of an integer output of eager's ``e_out``."""
    return all(k == "out-value" and (n := re.match(r"output (\d+):", m)) and isinstance(
        t := pytree.tree_leaves(e_out)[int(n.group(1))], torch.Tensor) and not (
        t.is_floating_point() or t.is_complex()) for k, m in problems)


def _alias_of(t, args) -> Optional[int]:
    if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() == 0:
        return None
    ptr = t.untyped_storage().data_ptr()
    return next((j for j, a in enumerate(args) if isinstance(a, torch.Tensor)
                 and a.untyped_storage().data_ptr() == ptr), None)


def _layout(t: torch.Tensor) -> tuple:
    """(strides, storage offset) where they matter: strides of size-1 dims are free."""
    if t.numel() == 0:
        return (), 0
    return tuple(st if n > 1 else None for n, st in zip(t.shape, t.stride())), t.storage_offset()


def _compare(c_out, e_out, c_args, e_args, ref, ref64=None, sums=False,
             bounds=None, bits: bool = False, casts=()) -> list:
    """Every (kind, message) by which the compiled call differs from eager's (``ref``, ``ref64``, ``bounds``: (outputs,
    inputs) of the fp32 and float64 references and the summation error bounds, or None; ``casts``: the narrower float
    dtypes the program names, ``prod(b, dtype=torch.float32)`` of a float64 ``b``: s200 #11658)."""
    (c_leaves, c_spec), (e_leaves, e_spec) = map(pytree.tree_flatten, (c_out, e_out))
    if c_spec != e_spec:
        return [("out-structure", f"outputs {c_spec} vs eager {e_spec}")]
    (r_leaves, r_args), (q_leaves, q_args), (m_leaves, m_args) = (
        _leaves(x, len(e_leaves), len(e_args)) for x in (ref, ref64, bounds))
    problems = []
    narrow = ({a.dtype for a in pytree.tree_leaves(e_args) if isinstance(a, torch.Tensor)} & set(_LOW)
              | {getattr(torch, c) for c in casts})
    for i, (c, e, r, q, m) in enumerate(zip(c_leaves, e_leaves, r_leaves, q_leaves, m_leaves)):
        p = _compare_tensor(f"output {i}", c, e, r, q, sums, m, bits, narrow)
        if p:
            problems.append(("out-" + p[0], p[1]))
        ej, cj = _alias_of(e, e_args), _alias_of(c, c_args)
        if ej != cj:
            problems.append(("out-alias", f"output {i}: eager's is a view of input {ej}, compiled's of {cj}"))
        elif ej is not None and _layout(c) != _layout(e):
            problems.append(("out-stride", f"output {i} (a view of input {ej}): stride {c.stride()} offset "
                             f"{c.storage_offset()} vs eager {e.stride()} offset {e.storage_offset()}"))
    for j, (c, e, r, q, m) in enumerate(zip(c_args, e_args, r_args, q_args, m_args)):
        meta_c, meta_e = (tuple(c.shape),) + _layout(c), (tuple(e.shape),) + _layout(e)
        if meta_c != meta_e:
            problems.append(("input-meta", f"input {j} (size, stride, offset) {meta_c} vs eager {meta_e}"))
            continue
        p = _compare_tensor(f"input {j} after the call", c, e, r, q, sums, m, bits, narrow)
        if p:
            problems.append(("input-" + p[0], p[1]))
    return problems


def _raised_in_dead_code(fn: Callable, err: BaseException) -> bool:
    """Eager raised in an assignment nothing live reads, directly or through other such ones (compilers drop such code;
    seed 90 #1299: ``v0 = b.as_strided(...)`` read by a dead ``v1``); live: the return, other statements, assignments
    calling an in-place method."""
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == fn.__code__.co_filename]
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    line = lines[-1] - fn.__code__.co_firstlineno + 1 if lines else -1
    live: set = set()
    for s in reversed(tree.body[0].body):
        if isinstance(s, ast.Assign) and all(isinstance(t, (ast.Name, ast.Tuple)) for t in s.targets) \
                and not re.search(r"\w_\(", ast.unparse(s.value)) and not Stmt(ast.unparse(s), "").defs & live:
            if s.lineno <= line <= s.end_lineno:
                return True
            continue
        live |= {n.id for n in ast.walk(s) if isinstance(n, ast.Name)}
    return False


def check(fn: Callable, make_inputs: Callable, backend: str = "cpp", timeout: float = 120.0,
          grad_key: Optional[int] = None) -> Result:
    """Run ``fn`` eagerly and compiled by ``backend`` on fresh ``make_inputs()``; classify. A ``backend`` name ending in
    ``+grad`` compares gradients too (:func:`_with_grads`, its draws seeded by ``grad_key``, else by ``fn``'s source)."""
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")
    src = ""
    with contextlib.suppress(OSError, TypeError):
        src = inspect.getsource(fn)
    grad = name.endswith("+grad")
    key = zlib.crc32(src.encode()) if grad_key is None else grad_key
    wrap = (lambda f: _with_grads(f, key)) if grad else (lambda f: f)
    backend = backend[:-5] if grad and isinstance(backend, str) else backend
    with _quiet():
        e_args = make_inputs()
        try:
            e_out, e_err = wrap(fn)(*e_args), None
        except Exception as err:
            e_out, e_err = None, err
        ref = _reference(fn, make_inputs, e_out, wrap) if e_err is None else None
        ref64 = _run_in(_Stats64(), wrap(fn), make_inputs) if e_err is None and _F64_STATS.search(src) else None
        sums = "overflow" if e_err is None and _overflows(src, make_inputs()) else \
            bool(_SUMS.search(src)) or grad  # (a backward sums over broadcast dims)
        bounds = _error_bounds(wrap(fn), make_inputs) if e_err is None and (sums or _BOUNDED.search(src)) else None
        _reset(backend)
        try:
            with _deadline(timeout):
                compiled = wrap(compile_for(fn, backend))
                for call in range(1 if e_err is not None else 2):
                    c_args = make_inputs()
                    c_out = compiled(*c_args)
                    if e_err is None:
                        problems = _compare(c_out, e_out, c_args, e_args, ref, ref64, sums, bounds,
                                            bool(_BIT_VIEW.search(src)), _CASTS.findall(src))
                        problems = [_grad_problem(k, m, e_out) for k, m in problems] if grad else problems
                        if problems:
                            kind = ("2nd-call " if call else "") + problems[0][0]
                            if sums and _run_in(_Overflowed(), wrap(fn), make_inputs) is None:
                                return Result("no_reference", name, kind, "\n".join(
                                    [m for _, m in problems] + ["eager's statistic overflowed"]))
                            if sums and _BIT_VIEW.search(src) and _integer_outputs_only(problems, e_out):
                                return Result("no_reference", name, kind, "\n".join(  # s202 #18233
                                    [m for _, m in problems] + ["integer arithmetic on the bits of "
                                                                "rounded floats: one ulp is any value"]))
                            return Result("mismatch", name, kind, "\n".join(m for _, m in problems))
        except _Hang:
            return Result("hang", name, "timeout", f"ran past {timeout}s")
        except Exception as err:
            if e_err is not None:
                return Result("both_raise", name, type(err).__name__, str(err)[:500])
            return Result("error", name, _site(err), f"{type(err).__name__}: {err}"[:2000])
        finally:
            _reset(backend)
        if e_err is not None and not _raised_in_dead_code(fn, e_err):
            return Result("missing_error", name, type(e_err).__name__,
                          f"eager raised {type(e_err).__name__}: {e_err}"[:1000])
        return Result("ok", name, "eager raised in dead code" if e_err is not None else "")


def check_program(prog: Program, backend: str = "cpp", timeout: float = 120.0) -> Result:
    """:func:`check` for a :class:`Program`."""
    return check(prog.function(), prog.make_inputs, backend, timeout, prog.grad_key)


def replay(fn: Callable, make_inputs: Callable, backend: str = "cpp", grad_key: Optional[int] = None) -> Result:
    """Check a repro's ``fn``/``make_inputs`` and print what was found."""
    r = check(fn, make_inputs, backend, grad_key=grad_key)
    print(f"{r.outcome} on {backend}: {r.kind}\n{r.detail}".rstrip())
    return r


# ------------------------------------------------------------------ minimizer

def _simple(t: torch.Tensor) -> torch.Tensor:
    """Elements that are small integers (what the minimizer shrinks values towards)."""
    x = t.double()
    return (x == x.round()) & (x.abs() <= 9)


def _measure(p: Program) -> int:
    m = 1000 * len(p.stmts) + 200 * len(p.inputs) + 100 * len(p.returns)
    for i in p.inputs:
        m += 20 * bool(i.suffix) + 3 * i.base.numel() + 5 * i.base.dim() + \
            int((~_simple(i.base)).sum()) + 2 * (i.base.dtype not in (torch.float32, torch.int64,
                                                                      torch.bool))
    return m


def _drop(p: Program, k: int) -> Program:
    """``p`` without statement ``k`` and everything that reads what it defined; values nothing reads any more are
    returned instead of those gone."""
    gone, keep = set(p.stmts[k].defs), []
    for j, s in enumerate(p.stmts):
        if j == k:
            continue
        if j > k and s.uses & gone:
            gone |= s.defs
        else:
            keep.append(s)
    rets = [r for r in p.returns if r not in gone]
    if len(rets) < len(p.returns):
        used = {u for s in keep for u in s.uses}
        rets += [d for s in keep for d in sorted(s.defs) if d not in used and d not in rets]
    return dataclasses.replace(p, stmts=keep, returns=rets)


def _prune(p: Program) -> Program:
    """Drop inputs that nothing reads."""
    used = {u for s in p.stmts for u in s.uses} | set(p.returns)
    return dataclasses.replace(p, inputs=[i for i in p.inputs if i.name in used])


def _with_input(p: Program, k: int, base: torch.Tensor, suffix: str = "") -> Program:
    inputs = list(p.inputs)
    inputs[k] = Input(inputs[k].name, base.contiguous(), suffix)
    return dataclasses.replace(p, inputs=inputs)


def _candidates(p: Program):
    """Smaller variants of ``p``, boldest first."""
    for k in reversed(range(len(p.stmts))):
        yield _drop(p, k)
    for r in p.returns:
        yield dataclasses.replace(p, returns=[x for x in p.returns if x != r])
    for k, inp in enumerate(p.inputs):
        if inp.suffix:
            yield _with_input(p, k, inp.make())
            continue
        b = inp.base
        for d in range(b.dim()):
            for n in sorted({1, b.shape[d] // 2, b.shape[d] - 1}):
                if 0 < n < b.shape[d]:
                    yield _with_input(p, k, b.narrow(d, 0, n))
            if b.shape[d]:
                yield _with_input(p, k, b.select(d, 0))
        if b.dtype in (torch.float16, torch.bfloat16, torch.float64):
            yield _with_input(p, k, b.float())
        elif b.dtype in (torch.int32, torch.uint8):
            yield _with_input(p, k, b.long())
        if b.dtype is torch.bool or bool(_simple(b).all()):
            continue
        ints = b.dtype in (torch.uint8, torch.int32, torch.int64)
        fills = [1] if ints and any(x in p.fn_source() for x in ("//", "%", "fmod", "remainder")) else [1, 0]
        for v in fills:
            yield _with_input(p, k, torch.full_like(b, v))
        yield _with_input(p, k, torch.where(_simple(b), b, torch.ones_like(b)))
        flat = b.flatten()
        for j in [j for j in range(flat.numel()) if not _simple(flat[j])][:32]:
            for v in fills:
                f = flat.clone()
                f[j] = v
                yield _with_input(p, k, f.view(b.shape))


def minimize(prog: Program, backend: str = "cpp", signature: Optional[str] = None,
             budget_s: float = 180.0, timeout: float = 60.0) -> Program:
    """Greedy shrinking of ``prog`` while :func:`check_program` keeps ``signature``."""
    stop = time.time() + budget_s
    signature = signature or check_program(prog, backend, timeout).signature
    prog, progress = _prune(prog), True
    while progress and time.time() < stop:
        progress = False
        for cand in _candidates(prog):
            if time.time() > stop:
                break
            cand = _prune(cand)
            if _measure(cand) >= _measure(prog):
                continue
            try:
                same = check_program(cand, backend, timeout).signature == signature
            except Exception:
                same = False
            if same:
                prog, progress = cand, True
                break
    return prog


# ------------------------------------------------------------------------ CLI

def _upstream(prog: Program, r: Result, timeout: float) -> Result:
    """``r``, or outcome ``upstream`` for a failure of coil's ``aot_eager`` that ``torch.compile(backend="aot_eager")``
    has too (same outcome, kind, exception type)."""
    if r.backend.split("+")[0] != "aot_eager" or r.outcome not in FAILURES:
        return r
    t = check_program(prog, "torch_" + r.backend, timeout)
    if (t.outcome, t.kind.split("@")[0]) != (r.outcome, r.kind.split("@")[0]):
        return r
    return Result("upstream", r.backend, r.kind, r.detail + "\n(torch.compile(backend='aot_eager') gives the same)")


def _table(stats: dict) -> str:
    fams = sorted({f for f, _ in stats} - {"all programs"})
    rows = [["family", *OUTCOMES]] + [[f] + [str(stats.get((f, o), 0)) for o in OUTCOMES]
                                      for f in fams + ["all programs"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def main(argv: Optional[list] = None) -> int:
    """Command line: fuzz for ``--time`` seconds or ``--count`` programs; print a summary."""
    ap = argparse.ArgumentParser(prog="python -m coil.bench.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--time", type=float, default=600.0, help="seconds to run (default 600)")
    ap.add_argument("--count", type=int, default=None, help="stop after N programs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first program index")
    ap.add_argument("--index", type=int, default=None, help="run only program INDEX, verbosely")
    ap.add_argument("--backends", default="cpp", help=f"comma list of {', '.join(BACKENDS)}")
    ap.add_argument("--family", default="", help=f"comma list of {', '.join(FAMILY_WEIGHTS)}")
    ap.add_argument("--out", default="fuzz-out", help="where failures' repro files go")
    ap.add_argument("--no-minimize", action="store_true")
    ap.add_argument("--minimize-time", type=float, default=60.0)
    ap.add_argument("--per-class", type=int, default=10, help="minimize at most this many failures of one signature")
    ap.add_argument("--torch-ref", action="store_true", help="also run failures through torch.compile(backend='aot_eager')")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a compiled run may take")
    ap.add_argument("--grad", action="store_true", help="compare the inputs' gradients too (BACKEND+grad)")
    ap.add_argument("--big", action="store_true", help="larger shapes: one or two dims of 7-129 (other programs)")
    a = ap.parse_args(argv)
    backends = [b + "+grad" * a.grad for b in a.backends.split(",") if b]
    if a.torch_ref or a.grad or "torch_aot_eager" in backends or "aot_eager" in backends:
        logging.getLogger("torch").setLevel(logging.CRITICAL)  # its compile errors are results here
    families = [f for f in a.family.split(",") if f] or None
    os.makedirs(a.out, exist_ok=True)
    stats, classes, start = Counter(), defaultdict(list), time.time()
    indices = [a.index] if a.index is not None else range(a.start, sys.maxsize)
    for n, i in enumerate(indices):
        if a.count is not None and n >= a.count or a.index is None and time.time() - start > a.time:
            break
        prog = generate(a.seed, i, families, big=a.big)
        if a.index is not None:
            print(prog.source())
        for b in backends:
            with open(os.path.join(a.out, "_in_flight.py"), "w") as f:  # left behind if a
                f.write(prog.source(Result("running", b)))  # kernel kills the process
            r = _upstream(prog, check_program(prog, b, a.timeout), a.timeout)
            trace.log("fuzz_result", stage="testing", program=prog.label, backend=b,
                      outcome=r.outcome, kind=r.kind, families=sorted(prog.families()))
            stats.update((fam, r.outcome) for fam in prog.families() | {"all programs"})
            if r.outcome not in FAILURES:
                if a.index is not None or r.outcome in ("upstream", "no_reference"):
                    print(f"{prog.label}: {r.outcome} on {b}: {r.kind}", flush=True)
                if r.outcome in ("upstream", "no_reference"):
                    with open(os.path.join(a.out, f"{r.outcome}-{b}-s{a.seed}-{i}.py"), "w") as f:
                        f.write(prog.source(r))
                continue
            small = prog
            if not a.no_minimize and len(classes[r.signature]) < a.per_class:
                small = minimize(prog, b, r.signature, a.minimize_time, a.timeout)
                again = check_program(small, b, a.timeout)  # the details of the small one
                r = again if again.signature == r.signature else r
            ref = check_program(small, "torch_aot_eager" + "+grad" * a.grad, a.timeout).outcome if a.torch_ref else ""
            note = f"\n#   torch.compile(backend='aot_eager'): {ref}" if a.torch_ref else ""
            path = os.path.join(a.out, f"{r.outcome}-{b}-s{a.seed}-{i}.py")
            with open(path, "w") as f:
                f.write(small.source(r).replace("\nimport torch", note + "\nimport torch", 1))
            classes[r.signature].append(path)
            print(f"[{time.time() - start:7.0f}s] {prog.label}: {r.outcome} on {b}: {r.kind} -> {path}", flush=True)
        if n % 20 == 19:
            gc.collect()
    print("\n" + _table(stats))
    return report_signatures(classes)


def report_signatures(classes: dict) -> int:
    """Print each failure signature (signature -> repro paths) with a count and an example; 1 if any, else 0."""
    print(f"\n{len(classes)} distinct failure signature(s):")
    for sig, paths in sorted(classes.items()):
        print(f"  {len(paths):4d}  {sig}\n        e.g. {paths[0]}")
    return 1 if classes else 0


if __name__ == "__main__":
    sys.exit(main())
