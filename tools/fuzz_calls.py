"""Call-sequence fuzzer: one compiled function called on a sequence of inputs, every call compared with eager.

The straight-line fuzzer (``python -m coil.bench.fuzz``, docs/fuzzing.md) runs each program once eagerly and
compiled. This one exercises what lies between calls: guards, recompilation, the choice of a cache entry, automatic
dynamic shapes, ``dynamic=True`` entries reused across sizes, ``mark_dynamic`` and state left by earlier calls. Each
program of :func:`coil.bench.fuzz.generate` is compiled once (a fresh ``coil.compile``) and called on 3-6 variants
of its inputs: new values, dims resized consistently across the inputs (0, 1, 2 and others), an earlier call again
(A, B, A), the same values in another layout (transposed, offset, strided), another dtype, gradient mode for one
call, changed Python scalars (numbers of the program lifted into arguments), one tensor for two arguments.

    OMP_NUM_THREADS=1 python tools/fuzz_calls.py --time 600 --seed 0 --out fcalls-out
    python tools/fuzz_calls.py --seed 0 --index 17            # one sequence, printed
    python fcalls-out/mismatch-auto-s0-17.py                  # replay a repro

Backends (``--backends``, one per program, by index): ``auto`` (``coil.compile(fn)``: automatic dynamic),
``dynamic`` (``dynamic=True``), ``static`` (``dynamic=False``), ``mark`` (``dynamic=False`` with the dims a later
call resizes marked by ``coil.mark_dynamic`` on the first call's inputs).
"""
import argparse
import ast
import dataclasses
import gc
import inspect
import json
import logging
import operator
import os
import random
import re
import sys
import time
import zlib
from collections import Counter, defaultdict
from typing import Callable

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import coil
from coil.bench.fuzz import (_BIT_VIEW, _BOUNDED, _CASTS, _F64_STATS, _SUMS, FAILURES, Input, Program, Result,
                               _compare, _deadline, _drop, _error_bounds, _grad_problem, _Hang, _overflows,
                               _Overflowed, _prune, _quiet, _raised_in_dead_code, _reference, _reset, _run_in,
                               _same_bits, _site, _Stats64, _with_grads, generate, report_signatures)
from coil.bench.fuzz_ops import FLOATS, gen_values

BACKENDS = {"auto": {}, "dynamic": {"dynamic": True}, "static": {"dynamic": False}, "mark": {"dynamic": False}}
KINDS = ("first", "values", "resize", "back", "layout", "dtype", "grad", "scalars", "alias")
WEIGHTS = (0, 2, 5, 2, 2, 1.5, 1, 2, 1.5)
OUTCOMES = ("ok", "mismatch", "error", "missing_error", "both_raise", "undefined", "rejected", "hang")


@dataclasses.dataclass
class CallProgram(Program):
    """A :class:`Program` whose ``params`` (name -> default) are Python-number arguments after the tensors."""
    params: dict = dataclasses.field(default_factory=dict)

    def fn_source(self) -> str:
        head, rest = super().fn_source().split("\n", 1)
        return head[:-2] + "".join(", " + p for p in self.params) + "):\n" + rest


@dataclasses.dataclass
class Call:
    """One call: the tensor arguments (:class:`Input`, the program's names), the numbers, gradient mode, and the
    (name, dim) pairs marked dynamic on its tensors."""
    kind: str
    inputs: list
    scalars: dict
    grad: bool = False
    marks: tuple = ()
    same: tuple = ()  # (name, other): argument ``name`` is the tensor passed as ``other``

    def args(self) -> list:
        xs, names = [i.make() for i in self.inputs], [i.name for i in self.inputs]
        for n, o in self.same:
            xs[names.index(n)] = xs[names.index(o)]
        for n, d in self.marks:
            coil.mark_dynamic(xs[names.index(n)], d)
        return xs + list(self.scalars.values())


# ------------------------------------------------------------------ programs and call sequences

def _number(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and (v := _number(node.operand)) is not None:
        return -v
    return None


def lift_scalars(prog: Program, rng: random.Random) -> CallProgram:
    """``prog`` with some numbers beside a tensor name (``a * 2.5``, ``v0 > -1``) made arguments ``p0, p1, ...``."""
    params = {}

    def lift(node, other):
        v = _number(node)
        if v is None or not isinstance(other, ast.Name) or other.id in ("inf", "nan") or rng.random() < 0.4:
            return node
        params[f"p{len(params)}"] = v
        return ast.Name(f"p{len(params) - 1}", ast.Load())

    class Lift(ast.NodeTransformer):
        def visit_BinOp(self, n):
            self.generic_visit(n)
            n.left, n.right = lift(n.left, n.right), lift(n.right, n.left)
            return n

        def visit_Compare(self, n):
            self.generic_visit(n)
            n.comparators = [lift(c, n.left) for c in n.comparators]
            return n
    stmts = [dataclasses.replace(s, text=ast.unparse(Lift().visit(ast.parse(s.text)))) for s in prog.stmts]
    return CallProgram(prog.inputs, stmts, prog.returns, prog.label, prog.grad_key, params=params)  # (params was
    # passed as grad_key, and every lifted program failed its check against the original: s408 drew no `scalars`)


def _draw(pool: torch.Tensor, shape, dtype, rng: random.Random) -> torch.Tensor:
    """Values of ``shape`` drawn from ``pool``'s (the program's own input values: what its ops were checked on)."""
    flat = pool.flatten()
    if flat.numel() == 0:
        return gen_values(rng, list(shape), dtype, "ints")
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    return flat[torch.randint(0, flat.numel(), tuple(shape), generator=g)].to(dtype)


_SLICE = re.compile(r"\[((?::, )*)(\d+):(\d+)(?::(\d+))?\]$")


def _layout_of(inp: Input) -> tuple:
    """An input's layout: ("contig",), ("perm", perm), ("slice", dim, offset, step) or ("expand", base shape)."""
    s = inp.suffix
    if s == ".t()":
        return "perm", (1, 0)
    if s.startswith(".permute("):
        return "perm", tuple(int(x) for x in s[9:-1].split(","))
    if s.startswith(".expand("):
        return "expand", tuple(inp.base.shape)
    m = _SLICE.match(s)
    return ("slice", m[1].count(":"), int(m[2]), int(m[4] or 1)) if m else ("contig",)


def _lay(name: str, values: torch.Tensor, lay: tuple) -> Input:
    """An input holding ``values`` in layout ``lay`` (the bytes a strided view skips are 99)."""
    shape, nd = list(values.shape), values.dim()
    if lay[0] == "perm" and len(lay[1]) == nd:
        perm = list(lay[1])
        suffix = ".t()" if perm == [1, 0] else f".permute({', '.join(map(str, perm))})"
        return Input(name, values.permute(sorted(range(nd), key=perm.__getitem__)).contiguous(), suffix)
    if lay[0] == "slice" and lay[1] < nd:
        d, off, step = lay[1:]
        base_shape = shape[:d] + [off + shape[d] * step] + shape[d + 1:]
        base = torch.full(base_shape, True if values.dtype == torch.bool else 99, dtype=values.dtype)
        base[(slice(None),) * d + (slice(off, off + shape[d] * step, step),)] = values
        suffix = "[" + ":, " * d + f"{off}:{off + shape[d] * step}" + (f":{step}]" if step > 1 else "]")
        return Input(name, base, suffix)
    return Input(name, values.contiguous())


def _rebuild(inp: Input, shape, pool: torch.Tensor, rng: random.Random) -> Input:
    """``inp`` in its layout at logical ``shape`` with new values from ``pool``."""
    lay = _layout_of(inp)
    if lay[0] == "expand" and len(lay[1]) <= len(shape) and shape:
        base = [1 if o == 1 else s for o, s in zip(lay[1], shape[len(shape) - len(lay[1]):])]
        return Input(inp.name, _draw(pool, base, inp.base.dtype, rng), f".expand({', '.join(map(str, shape))})")
    return _lay(inp.name, _draw(pool, shape, inp.base.dtype, rng), lay)


def _variant(kind: str, prog: CallProgram, calls: list, rng: random.Random):
    """A new :class:`Call` of ``kind`` after ``calls`` (None where it does not apply)."""
    prev = calls[-1]
    new = dataclasses.replace(prev, kind=kind, grad=False, marks=(), same=(), inputs=list(prev.inputs), scalars=dict(prev.scalars))
    pools = {i.name: i.base for i in prog.inputs}
    shapes = [list(i.make().shape) for i in prev.inputs]
    if kind == "values":
        new.inputs = [_rebuild(i, s, pools[i.name].to(i.base.dtype), rng) for i, s in zip(prev.inputs, shapes)]
    elif kind == "resize":
        nd = max(map(len, shapes), default=0)
        if not nd:
            return None
        full = [max((s[len(s) - k] for s in shapes if len(s) >= k), key=lambda x: x != 1) for k in range(1, nd + 1)]
        for k in rng.sample(range(1, nd + 1), 2 if nd > 1 and rng.random() < 0.3 else 1):
            n = rng.choice([x for x in (0, 1, 1, 2, 2, 3, 4, 5, 6, 7) if x != full[k - 1]])
            for s in shapes:
                if len(s) >= k and (s[-k] == full[k - 1] or full[k - 1] == 1):
                    s[-k] = n
        new.inputs = [_rebuild(i, s, pools[i.name].to(i.base.dtype), rng) for i, s in zip(prev.inputs, shapes)]
    elif kind == "back":
        if len(calls) < 2:
            return None
        return dataclasses.replace(rng.choice(calls[:-1]), kind="back", grad=False, marks=())
    elif kind == "layout":
        idx = [j for j, s in enumerate(shapes) if s and 0 not in s]
        for j in rng.sample(idx, min(len(idx), rng.randint(1, 2))):
            nd, old = len(shapes[j]), _layout_of(prev.inputs[j])
            perm = rng.sample(range(nd), nd)
            lays = [("contig",), ("slice", rng.randrange(nd), rng.randint(0, 2), rng.randint(1, 2))] + (
                [("perm", tuple(perm))] if nd > 1 and perm != sorted(perm) else [])
            new.inputs[j] = _lay(prev.inputs[j].name, prev.inputs[j].make().contiguous(),
                                 rng.choice([x for x in lays if x != old] or lays))
    elif kind == "dtype":
        j = rng.randrange(len(prev.inputs))
        dt = prev.inputs[j].base.dtype
        others = [d for d in FLOATS if d != dt] if dt.is_floating_point else \
            [d for d in (torch.int32, torch.int64) if d != dt] if dt != torch.bool else []
        if not others:
            return None
        new.inputs[j] = Input(prev.inputs[j].name, prev.inputs[j].base.to(rng.choice(others)), prev.inputs[j].suffix)
    elif kind == "alias":  # one tensor passed for two arguments
        ts = [(tuple(s), i.base.dtype, i.name) for i, s in zip(prev.inputs, shapes)]
        pairs = [(n, o) for k, (s, d, n) in enumerate(ts) for s2, d2, o in ts[:k] if (s, d) == (s2, d2)]
        if not pairs:
            return None
        new.same = (rng.choice(pairs),)
    elif kind == "grad":
        if not any(i.base.is_floating_point() for i in prev.inputs):
            return None
        new.grad = True
    elif kind == "scalars":
        if not prev.scalars:
            return None
        for p in rng.sample(sorted(prev.scalars), min(len(prev.scalars), rng.randint(1, 2))):
            v = prev.scalars[p]
            if isinstance(v, float) != (rng.random() < 0.15):  # a float (now and then for an int)
                new.scalars[p] = rng.choice([0.5, -1.5, 2.0, 3.25, -0.0, 1.0, 1e-3, 100.0, float(abs(v) + 1)])
            else:
                new.scalars[p] = rng.choice([1, 2, 3, 5, 7]) * (-1 if v < 0 else 1) if v else rng.choice([0, 0, 1, 2])
    if kind not in ("grad", "alias") and all(map(operator.is_, new.inputs, prev.inputs)) and new.scalars == prev.scalars:
        return None
    return new


def sequence(seed: int, index: int, families=None, backend: str = "auto", ncalls=(3, 6)) -> tuple:
    """(program, calls) number ``index`` of ``seed``: deterministic from (seed, index, backend)."""
    prog = generate(seed, index, families)
    rng = random.Random(f"coil-fuzz-calls:{seed}:{index}")
    plain = CallProgram(prog.inputs, prog.stmts, prog.returns, prog.label, prog.grad_key)
    lifted = lift_scalars(prog, rng) if rng.random() < 0.6 else plain
    if lifted.params and not _same_eager(prog, lifted):
        lifted = plain
    calls, n, fn = [Call("first", list(prog.inputs), dict(lifted.params))], rng.randint(*ncalls), lifted.function()
    for _ in range(60):  # (a variant eager rejects is kept a quarter of the time: does compiled raise too?)
        c = _variant(rng.choices(KINDS, WEIGHTS)[0], lifted, calls, rng)
        mode = _SelfReads()
        if c is not None and (err := _eager(fn, c.args, lambda f: mode.wrap(f))[1]) is None and mode.found:
            continue  # (an alias: not drawn, as the generator draws no source sharing its target's memory)
        if c is not None and (err is None or rng.random() < 0.25):
            calls.append(c)
        if len(calls) == n:
            break
    if backend == "mark":  # mark the dims later calls resize (sizes >= 2 on the first call)
        first = {i.name: i.make().shape for i in calls[0].inputs}
        marks = {(i.name, d) for c in calls[1:] for i in c.inputs
                 for d, (a, b) in enumerate(zip(first[i.name], i.make().shape))
                 if len(first[i.name]) == i.make().dim() and a != b and a >= 2}
        calls[0] = dataclasses.replace(calls[0], marks=tuple(sorted(marks)))
    return lifted, calls


class _SelfReads(TorchDispatchMode):
    """Finds an in-place op reading memory it writes through another argument (one tensor passed for two:
    ``c.view(1, -1).index_add_(1, i, b.expand(1, 2))`` with ``b`` and ``c`` one tensor, s401 #364): eager's result is
    its kernel's order. An elementwise op reading the written elements themselves (``a.mul_(b)``, ``a is b``) is
    defined."""
    found = False

    def wrap(self, f):
        def run(*args):
            with self:
                return f(*args)
        return run

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first, t = func._schema.arguments[:1], args[0] if args else None
        if first and first[0].alias_info is not None and first[0].alias_info.is_write and \
                isinstance(t, torch.Tensor) and t.numel():
            lay = lambda x: (x.shape, x.stride(), x.storage_offset())  # noqa: E731
            self.found |= any(a.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() and not (
                torch.Tag.pointwise in func.tags and lay(a) == lay(t)) for a in pytree.tree_leaves((args[1:], kwargs))
                if isinstance(a, torch.Tensor) and a.numel())
        return func(*args, **(kwargs or {}))


def _same_eager(prog: Program, lifted: CallProgram) -> bool:
    runs = []
    for f, extra in ((prog.function(), []), (lifted.function(), list(lifted.params.values()))):
        try:
            with _quiet():
                runs.append(pytree.tree_leaves(f(*prog.make_inputs(), *extra)))
        except Exception as e:
            runs.append([type(e)])
    return len(runs[0]) == len(runs[1]) and all(map(_same_bits, *runs))


# ------------------------------------------------------------------ running and checking

def _eager(fn, mk, wrap) -> tuple:
    args = mk()
    try:
        with _quiet():
            return wrap(fn)(*args), None, args
    except Exception as e:
        return None, e, args


def check_call(fn: Callable, compiled: Callable, mk: Callable, grad: bool, name: str, timeout: float) -> Result:
    """One call of ``compiled`` against eager ``fn`` on ``mk()`` (gradient mode: :func:`_with_grads`)."""
    src = inspect.getsource(fn)
    wrap = (lambda f: _with_grads(f, zlib.crc32(src.encode()))) if grad else (lambda f: f)
    e_out, e_err, e_args = _eager(fn, mk, wrap)
    if e_err is not None and "ZeroDivision" in f"{type(e_err).__name__} {e_err}":
        return Result("undefined", name, "integer division by zero")
    again, a_err, a_args = _eager(fn, mk, wrap)
    if (e_err is None) != (a_err is None) or e_err is None and not (
            len(x := pytree.tree_leaves((e_out, e_args))) == len(y := pytree.tree_leaves((again, a_args)))
            and all(map(_same_bits, x, y))):
        return Result("undefined", name, "eager differs from itself")
    c_args = mk()
    try:
        with _quiet(), _deadline(timeout):
            c_out = wrap(compiled)(*c_args)
    except _Hang:
        return Result("hang", name, "timeout", f"ran past {timeout}s")
    except Exception as err:
        if e_err is not None:
            return Result("both_raise", name, type(err).__name__, str(err)[:500])
        if name == "mark" and isinstance(err, coil.exc.UserError) and "marked" in str(err):
            return Result("rejected", name, "a marked dim is forced to a constant", str(err)[:500])
        return Result("error", name, _site(err), f"{type(err).__name__}: {err}"[:2000])
    if e_err is not None:
        if _raised_in_dead_code(fn, e_err):
            return Result("ok", name, "eager raised in dead code")
        return Result("missing_error", name, type(e_err).__name__, f"eager raised {type(e_err).__name__}: {e_err}"[:1000])
    c_args, e_args = ([x for x in xs if isinstance(x, torch.Tensor)] for xs in (c_args, e_args))  # (numbers last)
    if not _compare(c_out, e_out, c_args, e_args, None):
        return Result("ok", name)
    with _quiet():  # a difference: now with the references and bounds of docs/fuzzing.md
        ref = _reference(fn, mk, e_out, wrap)
        ref64 = _run_in(_Stats64(), wrap(fn), mk) if _F64_STATS.search(src) else None
        sums = "overflow" if _overflows(src, mk()) else bool(_SUMS.search(src)) or grad
        bounds = _error_bounds(wrap(fn), mk) if sums or _BOUNDED.search(src) else None
    problems = _compare(c_out, e_out, c_args, e_args, ref, ref64, sums, bounds, bool(_BIT_VIEW.search(src)),
                        _CASTS.findall(src))
    problems = [_grad_problem(k, m, e_out) for k, m in problems] if grad else problems
    if not problems:
        return Result("ok", name)
    if sums and _run_in(_Overflowed(), wrap(fn), mk) is None:
        return Result("undefined", name, problems[0][0], "eager's statistic overflowed")
    return Result("mismatch", name, problems[0][0], "\n".join(m for _, m in problems))


def run_calls(fn: Callable, calls: list, backend: str, timeout: float = 120.0) -> list:
    """Results of ``calls`` (objects with ``args()`` and ``grad``) on one fresh compile of ``fn``; stops at a failure."""
    _reset("cpp")
    results, name = [], getattr(backend, "__name__", backend)
    try:  # (a callable backend is a compiler ``backend(fn)``: tests plant broken ones)
        compiled = backend(fn) if callable(backend) else coil.compile(fn, **BACKENDS[backend])
        for c in calls:
            results.append(check_call(fn, compiled, c.args, c.grad, name, timeout))
            if results[-1].outcome in FAILURES:
                break
    finally:
        _reset("cpp")
    return results


def _signature(results: list) -> str:
    bad = [r for r in results if r.outcome in FAILURES]
    return bad[0].signature if bad else "ok"


def _restrict(prog: Program, calls: list) -> list:
    names = {i.name for i in prog.inputs}
    return [dataclasses.replace(c, inputs=[i for i in c.inputs if i.name in names],
                                marks=tuple(m for m in c.marks if m[0] in names),
                                same=tuple(m for m in c.same if {*m} <= names)) for c in calls]


def shrink(prog: CallProgram, calls: list, backend: str, sig: str, budget: float, timeout: float) -> tuple:
    """Drop calls before the failing one, then statements and returns, while the failure's signature stays."""
    stop = time.time() + budget

    def same(p, cs):
        try:
            return time.time() < stop and _signature(run_calls(p.function(), _restrict(p, cs), backend, timeout)) == sig
        except Exception:
            return False
    progress = True
    while progress and time.time() < stop:
        progress = False
        for k in range(len(calls) - 1):
            if same(prog, cs := calls[:k] + calls[k + 1:]):
                calls, progress = cs, True
                break
        for k in reversed(range(len(prog.stmts))):
            if same(p := _prune(_drop(prog, k)), calls):
                prog, calls, progress = p, _restrict(p, calls), True
                break
        for r in prog.returns if len(prog.returns) > 1 else []:
            if same(p := dataclasses.replace(prog, returns=[x for x in prog.returns if x != r]), calls):
                prog, progress = p, True
                break
    return prog, _restrict(prog, calls)


def repro_source(prog: CallProgram, calls: list, backend: str, results: list) -> str:
    bad = results[-1]
    head = [f"# coil call-sequence fuzz repro: {prog.label}, backend {backend} ({BACKENDS[backend] or 'automatic'})",
            f"# {bad.outcome} at call {len(results) - 1} ({calls[len(results) - 1].kind}): {bad.kind}"]
    head += ["#   " + line for line in bad.detail.splitlines()[:6]]
    out = "\n".join(head) + "\nimport torch\nimport coil\nfrom math import inf, nan\n\n\n" + prog.fn_source() + "\n"
    for k, c in enumerate(calls):
        out += f"\ndef call_{k}():  # {c.kind}{' (gradient mode)' if c.grad else ''}\n"
        out += "".join(f"    {i.source()}\n" for i in c.inputs)
        out += "".join(f"    {n} = {o}\n" for n, o in c.same)
        out += "".join(f"    coil.mark_dynamic({n}, {d})\n" for n, d in c.marks)
        out += f"    return [{', '.join([i.name for i in c.inputs] + [repr(v) for v in c.scalars.values()])}]\n\n"
    out += "\nCALLS = [" + ", ".join(f"(call_{k}, {c.grad})" for k, c in enumerate(calls)) + "]\n"
    return out + (f"\nif __name__ == \"__main__\":\n    import os, sys\n    sys.path.insert(0, os.path.join("
                  f"os.path.dirname(coil.__file__), os.pardir, \"tools\"))\n    from fuzz_calls import replay\n"
                  f"    replay(fn, CALLS, {backend!r})\n")


class _Replayed:
    def __init__(self, k, make, grad):
        self.kind, self.args, self.grad = f"call {k}", make, grad


def replay(fn: Callable, calls: list, backend: str) -> list:
    """Run a repro's ``CALLS`` (``(make_args, gradient mode)`` pairs) and print each call's outcome."""
    results = run_calls(fn, [_Replayed(k, m, g) for k, (m, g) in enumerate(calls)], backend)
    for k, r in enumerate(results):
        print(f"call {k}: {r.outcome} {r.kind}\n{r.detail}".rstrip())
    return results


def _table(stats: Counter, rows: list, head: str) -> str:
    table = [[head, *OUTCOMES]] + [[r] + [str(stats.get((r, o), 0)) for o in OUTCOMES] for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in table)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tools/fuzz_calls.py", description=__doc__.split("\n")[0])
    ap.add_argument("--time", type=float, default=600.0, help="seconds to run (default 600)")
    ap.add_argument("--count", type=int, default=None, help="stop after N programs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first program index")
    ap.add_argument("--index", type=int, default=None, help="run only program INDEX, verbosely")
    ap.add_argument("--backends", default="auto,dynamic,mark", help=f"program i uses the (i mod n)th of {list(BACKENDS)}")
    ap.add_argument("--family", default="", help="comma list of op families (coil.bench.fuzz_ops)")
    ap.add_argument("--out", default="fcalls-out", help="where failures' repro files go")
    ap.add_argument("--no-minimize", action="store_true")
    ap.add_argument("--minimize-time", type=float, default=60.0)
    ap.add_argument("--per-class", type=int, default=3, help="shrink at most this many failures of one signature")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a compiled call may take")
    a = ap.parse_args(argv)
    logging.getLogger("torch").setLevel(logging.CRITICAL)  # its fake-tensor errors are results here
    backends, families = a.backends.split(","), [f for f in a.family.split(",") if f] or None
    os.makedirs(a.out, exist_ok=True)
    per_call, per_seq, classes, start = Counter(), Counter(), defaultdict(list), time.time()
    for n, i in enumerate([a.index] if a.index is not None else range(a.start, sys.maxsize)):
        if a.count is not None and n >= a.count or a.index is None and time.time() - start > a.time:
            break
        b = backends[i % len(backends)]
        prog, calls = sequence(a.seed, i, families, b)
        if a.index is not None:
            print(repro_source(prog, calls, b, [Result("running", b)]))
        with open(os.path.join(a.out, "_in_flight.py"), "w") as f:  # left behind if a kernel kills the process
            f.write(repro_source(prog, calls, b, [Result("running", b)]))
        results = run_calls(prog.function(), calls, b, a.timeout)
        per_call.update((c.kind + " (grad)" * c.grad, r.outcome) for c, r in zip(calls, results))
        per_call.update(("all calls", r.outcome) for r in results)
        sig = _signature(results)
        outcome = "ok" if sig == "ok" else results[-1].outcome
        per_seq.update([(b, outcome), ("all sequences", outcome)])
        if a.index is not None:
            for k, r in enumerate(results):
                print(f"call {k} ({calls[k].kind}): {r.outcome} {r.kind}\n{r.detail}".rstrip())
        if sig == "ok":
            continue
        small, scalls = prog, calls[:len(results)]
        if not a.no_minimize and len(classes[sig]) < a.per_class:
            small, scalls = shrink(prog, scalls, b, sig, a.minimize_time, a.timeout)
        again = run_calls(small.function(), scalls, b, a.timeout)
        if _signature(again) != sig:
            small, scalls, again = prog, calls[:len(results)], results
        path = os.path.join(a.out, f"{outcome}-{b}-s{a.seed}-{i}.py")
        with open(path, "w") as f:
            f.write(repro_source(small, scalls[:len(again)], b, again))
        classes[sig].append(path)
        print(f"[{time.time() - start:7.0f}s] {prog.label}: {outcome} on {b} at call {len(results) - 1} "
              f"({calls[len(results) - 1].kind}): {results[-1].kind} -> {path}", flush=True)
        if n % 10 == 9:
            gc.collect()
    print("\ncalls by kind\n" + _table(per_call, [k for k in KINDS + tuple(k + " (grad)" for k in KINDS)
                                                   if any((k, o) in per_call for o in OUTCOMES)] + ["all calls"], "call"))
    print("\nsequences (first failure)\n" + _table(per_seq, backends + ["all sequences"], "backend"))
    print("\nSUMMARY " + json.dumps({"calls": [[*k, v] for k, v in per_call.items()],
                                      "sequences": [[*k, v] for k, v in per_seq.items()]}))
    return report_signatures(classes)


if __name__ == "__main__":
    sys.exit(main())
