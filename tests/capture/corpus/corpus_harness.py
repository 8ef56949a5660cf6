"""The capture corpus harness: one table row = one small program checked against eager.

Design note
-----------
Every corpus file is a table of :class:`Case` rows built with :func:`C` (one call) or
:func:`R` (several calls, for guards and recompiles), turned into pytest parameters by
:func:`cases`, and run by :func:`run_case`:

1. Build the program and its inputs twice under the same seed (the inputs factory and,
   for modules, the module factory use the global RNG), so eager and compiled each get
   their own identical copies: input mutation is compared, not shared.
2. Run eager, then the compiled program (``coil.compile(fn, backend=counter)``), each
   after ``torch.manual_seed(RUN_SEED)`` so RNG ops draw the same numbers.
3. Compare: outputs (values, dtype, shape, requires_grad, container types), the inputs
   after the call (mutation), the module's state (parameters, buffers, plain
   attributes, training flag), the case's ``observe()`` (Python side effects on
   globals or outside objects), the global RNG state after the call, and, when eager
   raised, the exception type and message.
4. Count: ``counter.graphs`` (graphs handed to the backend over all calls) must equal
   ``graphs``; the graph-break count of the first call must equal ``breaks`` (read from
   ``coil.explain(fn, *args).graph_break_count`` on a fresh capture, the same field as
   torch's ``ExplainOutput``). Every graph handed to the backend must have an op.

The expected numbers were taken from ``torch.compile(fn, backend=counter, dynamic=False)``
(torch 2.13) and hard-coded. ``CORPUS_ORACLE=torch pytest tests/capture/corpus`` runs the
same tables under torch.compile instead of coil, so a row whose numbers disagree with
torch shows up at once. Rows where coil's design legitimately differs carry ``note=``
and, where the numbers differ, ``torch_graphs=``/``torch_breaks=`` for the oracle run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
from typing import Any, Callable, Optional, Sequence, Union

import pytest
import torch

ORACLE = os.environ.get("CORPUS_ORACLE", "") == "torch"
BUILD_SEED = 1234
RUN_SEED = 4321


class CountingBackend:
    """A backend that counts graphs and ops and runs the captured graph as it is.

    ``graphs``: graphs compiled; ``ops``: call_function/call_method/call_module nodes over
    all graphs; ``ops_per_graph``: list of per-graph op counts; ``gms``: the graphs.
    """

    def __init__(self) -> None:
        self.graphs = 0
        self.ops = 0
        self.ops_per_graph: list[int] = []
        self.gms: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        n = sum(node.op in ("call_function", "call_method", "call_module") for node in gm.graph.nodes)
        self.graphs += 1
        self.ops += n
        self.ops_per_graph.append(n)
        self.gms.append(gm)
        return gm.forward


class Args:
    """Positional and keyword arguments from an inputs factory: ``Args(x, y, scale=2)``.
    ``Args(x, _ctx=torch.no_grad)`` makes the call inside that context (ambient state)."""

    def __init__(self, *args: Any, _ctx: Optional[Callable] = None, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.ctx = _ctx


@dataclasses.dataclass
class Case:
    """One corpus program. See the module docstring for what is checked."""

    fn: Callable
    inputs: Callable[[], Any] = None
    graphs: Union[int, tuple] = 1
    breaks: Union[int, tuple] = 0
    name: Optional[str] = None
    module: bool = False  # fn is a zero-arg factory building the callable (an nn.Module)
    setup: Optional[Callable[[], None]] = None  # reset Python state before each run
    observe: Optional[Callable[[], Any]] = None  # Python state to compare after each run
    steps: Optional[Sequence[Callable[[Any], Any]]] = None  # R(): step(original) -> args
    fullgraph: bool = False
    dynamic: Optional[bool] = None
    backward: bool = False  # also compare gradients of a sum of the outputs
    error: str = "exact"  # "exact": same type and message; "type": isinstance and eager's message inside
    rtol: Optional[float] = None
    atol: Optional[float] = None
    xfail: Optional[str] = None
    note: str = ""
    torch_graphs: Optional[int] = None  # torch.compile's count where coil legitimately differs
    torch_breaks: Optional[int] = None
    torch_wrong: str = ""  # torch.compile itself gets this row wrong (the oracle run xfails it)


def C(fn: Callable, inputs: Callable[[], Any] = None, graphs=1, breaks=0, **kw: Any) -> Case:
    """A one-call program: ``C(fn, lambda: (randn(3),), graphs=1, breaks=0)``."""
    return Case(fn, inputs, graphs, breaks, **kw)


def R(fn: Callable, steps: Sequence[Callable[[Any], Any]], graphs, breaks=0, **kw: Any) -> Case:
    """A several-call program (guards, recompiles). Each step is called with the ORIGINAL
    callable (function or module; so it may flip ``.training`` or replace a weight) and
    returns the next call's arguments (a tuple or :class:`Args`)."""
    return Case(fn, None, graphs, breaks, steps=list(steps), **kw)


def cases(*rows: Case) -> list:
    """pytest parameters with readable ids. Rows with ``xfail=`` or listed in
    known_failures.KNOWN_FAILURES (keyed ``"<group>::<id>"``) are marked xfail."""
    from known_failures import KNOWN_FAILURES

    group = sys._getframe(1).f_globals.get("__name__", "").rsplit(".", 1)[-1].replace("test_corpus_", "")
    out, seen = [], {}
    for row in rows:
        name = row.name or getattr(row.fn, "__name__", "case")
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}_{seen[name]}"
        reason = row.xfail or KNOWN_FAILURES.get(f"{group}::{name}")
        marks = [pytest.mark.xfail(strict=False, reason=reason)] if reason and not ORACLE else []
        if ORACLE and row.torch_wrong:
            marks = [pytest.mark.skip(reason="torch.compile gets it wrong: " + row.torch_wrong)]
        out.append(pytest.param(row, id=name, marks=marks))
    return out


# ---------------------------------------------------------------------------- inputs

def randn(*shape, dtype=torch.float32, requires_grad=False) -> torch.Tensor:
    """Standard-normal tensor, nudged away from exact zeros."""
    t = torch.randn(*shape).to(dtype)
    t = torch.where(t == 0, torch.full_like(t, 0.5), t)
    return t.requires_grad_(requires_grad) if requires_grad else t


def rand_pos(*shape, dtype=torch.float32) -> torch.Tensor:
    """Uniform in [0.5, 1.5): safe for log, sqrt, division."""
    return (torch.rand(*shape) + 0.5).to(dtype)


def randint(low: int, high: int, *shape, dtype=torch.int64) -> torch.Tensor:
    return torch.randint(low, high, shape, dtype=dtype)


# ---------------------------------------------------------------------------- compare

def assert_same(a: Any, b: Any, path: str = "out", rtol=None, atol=None) -> None:
    """Structural equality of eager (a) and compiled (b) values; names the path on mismatch."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: expected a tensor, got {type(b).__name__}"
        assert type(a) is type(b), f"{path}: tensor type {type(a).__name__} vs {type(b).__name__}"
        assert a.shape == b.shape, f"{path}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} vs {b.dtype}"
        assert a.device == b.device, f"{path}: device {a.device} vs {b.device}"
        assert a.requires_grad == b.requires_grad, f"{path}: requires_grad {a.requires_grad} vs {b.requires_grad}"
        assert a.is_inference() == b.is_inference(), f"{path}: is_inference {a.is_inference()} vs {b.is_inference()}"
        torch.testing.assert_close(b.detach(), a.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
        return
    if isinstance(a, torch.nn.Module):
        assert type(a) is type(b), f"{path}: module type {type(a).__name__} vs {type(b).__name__}"
        assert a.training == b.training, f"{path}.training {a.training} vs {b.training}"
        sa, sb = a.state_dict(keep_vars=True), b.state_dict(keep_vars=True)
        assert list(sa) == list(sb), f"{path}: state_dict keys {list(sa)} vs {list(sb)}"
        for k in sa:
            assert_same(sa[k], sb[k], f"{path}.{k}", rtol, atol)
        _same_plain_attrs(a, b, path, rtol, atol)
        return
    if type(a).__module__ == "numpy" and hasattr(a, "shape"):
        import numpy as np

        assert type(a) is type(b), f"{path}: type {type(a).__name__} vs {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        np.testing.assert_allclose(b, a, rtol=rtol or 1.3e-6, atol=atol or 1e-5, err_msg=path)
        return
    if isinstance(a, torch.Generator):
        assert isinstance(b, torch.Generator) and torch.equal(a.get_state(), b.get_state()), \
            f"{path}: generator state differs"
        return
    if isinstance(a, (bool, int, str, bytes, type(None), torch.dtype, torch.device, torch.Size, type, range)):
        assert type(a) is type(b), f"{path}: type {type(a).__name__} vs {type(b).__name__} ({a!r} vs {b!r})"
        assert a == b, f"{path}: {a!r} vs {b!r}"
        return
    if isinstance(a, float):
        assert type(b) is float, f"{path}: type float vs {type(b).__name__} ({a!r} vs {b!r})"
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6), \
            f"{path}: {a!r} vs {b!r}"
        return
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b), f"{path}: container {type(a).__name__} vs {type(b).__name__}"
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]", rtol, atol)
        return
    if isinstance(a, dict):
        assert type(a) is type(b), f"{path}: container {type(a).__name__} vs {type(b).__name__}"
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]", rtol, atol)
        return
    if isinstance(a, (set, frozenset)):
        assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"
        return
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}", rtol, atol)
        return
    if callable(a) or hasattr(a, "__next__"):
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        return
    if hasattr(a, "__dict__"):
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        _same_plain_attrs(a, b, path, rtol, atol, private=True)
        return
    slots = getattr(type(a), "__slots__", None)
    if slots is not None:
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        for k in ([slots] if isinstance(slots, str) else slots):
            assert_same(getattr(a, k, None), getattr(b, k, None), f"{path}.{k}", rtol, atol)
        return
    assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"


def _same_plain_attrs(a, b, path, rtol, atol, private=False) -> None:
    da = {k: v for k, v in vars(a).items() if private or not k.startswith("_")}
    db = {k: v for k, v in vars(b).items() if private or not k.startswith("_")}
    assert sorted(da) == sorted(db), f"{path}: attributes {sorted(da)} vs {sorted(db)}"
    for k in da:
        if isinstance(da[k], (torch.nn.Module, torch.Tensor, int, float, bool, str, list, tuple, dict, type(None))):
            assert_same(da[k], db[k], f"{path}.{k}", rtol, atol)


# ---------------------------------------------------------------------------- running

def compile_fn(target: Callable, backend: Callable, case: Case) -> Callable:
    """coil.compile (or torch.compile under CORPUS_ORACLE=torch) with the case's flags."""
    if ORACLE:
        dyn = False if case.dynamic is None else case.dynamic
        return torch.compile(target, backend=backend, fullgraph=case.fullgraph, dynamic=dyn)
    import coil

    return coil.compile(target, backend=backend, fullgraph=case.fullgraph, dynamic=case.dynamic)


def reset() -> None:
    if ORACLE:
        import torch._dynamo  # the oracle only

        torch._dynamo.reset()
    else:
        import coil

        coil.reset()


def graph_break_count(target: Callable, args: tuple, kwargs: dict) -> tuple[int, list]:
    """Breaks of one fresh capture of ``target(*args, **kwargs)`` (explain's field) and
    their reasons (short strings)."""
    reset()
    if ORACLE:
        import torch._dynamo
        from torch._dynamo.utils import counters

        # explain()'s graph_break_count is only graph_count - 1; count the breaks taken.
        counters.clear()
        torch.compile(target, backend="eager", dynamic=False)(*args, **kwargs)
        return sum(counters["graph_break"].values()), [k.splitlines()[0] for k in counters["graph_break"]]
    import coil

    out = coil.explain(target, *args, **kwargs)
    reasons = [(r.get("reason") if isinstance(r, dict) else str(getattr(r, "reason", r))) for r in out.break_reasons]
    return out.graph_break_count, [str(r).splitlines()[0] if r else "?" for r in reasons]


def _as_args(value: Any) -> tuple[tuple, dict, Optional[Callable]]:
    if value is None:
        return (), {}, None
    if isinstance(value, Args):
        return value.args, value.kwargs, value.ctx
    if isinstance(value, tuple):
        return value, {}, None
    return (value,), {}, None


def _build(case: Case) -> Callable:
    """The callable (the function, or the module built by the factory) under BUILD_SEED."""
    torch.manual_seed(BUILD_SEED)
    target = case.fn() if case.module else case.fn
    return target


def _call(fn: Callable, args: tuple, kwargs: dict, seed: int, ctx: Optional[Callable] = None):
    torch.manual_seed(seed)
    try:
        with (ctx() if ctx is not None else contextlib.nullcontext()):
            return fn(*args, **kwargs), None
    except Exception as e:  # compared with eager's below
        return None, e


def _run_all(case: Case, target: Callable, compiled: Callable) -> list:
    """Run every step; returns [(args, kwargs, out, err, rng, observed)] per call."""
    steps = case.steps or [lambda _t: case.inputs() if case.inputs else ()]
    records = []
    if case.setup:
        case.setup()
    for i, step in enumerate(steps):
        torch.manual_seed(BUILD_SEED + 1 + i)
        args, kwargs, ctx = _as_args(step(target))
        out, err = _call(compiled, args, kwargs, RUN_SEED + i, ctx)
        rng = torch.get_rng_state()
        observed = case.observe() if case.observe else None
        records.append((args, kwargs, out, err, rng, observed))
        if err is not None:
            break
    return records


def _loss(out: Any) -> Optional[torch.Tensor]:
    tensors = []

    def walk(v):
        if isinstance(v, torch.Tensor):
            if v.requires_grad and v.is_floating_point():
                tensors.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(out)
    if not tensors:
        return None
    return sum((t.float() * (i + 1)).sum() for i, t in enumerate(tensors))


def _grads(target: Any, args: tuple) -> list:
    grads = [a.grad for a in args if isinstance(a, torch.Tensor)]
    if isinstance(target, torch.nn.Module):
        grads += [p.grad for p in target.parameters()]
    return grads


def run_case(case: Case, backend_factory: Callable[[], CountingBackend] = CountingBackend) -> None:
    """Run one corpus program eagerly and compiled and assert they agree (module docstring)."""
    tol = dict(rtol=case.rtol, atol=case.atol) if case.rtol is not None else {}
    reset()
    target_e = _build(case)
    eager = _run_all(case, target_e, target_e)
    if case.backward and eager[0][3] is None:
        loss = _loss(eager[0][2])
        assert loss is not None, "backward=True but no output requires grad"
        loss.backward()

    reset()
    target_c = _build(case)
    counter = backend_factory()
    compiled_fn = compile_fn(target_c, counter, case)
    compiled = _run_all(case, target_c, compiled_fn)

    for i, (rec_e, rec_c) in enumerate(zip(eager, compiled)):
        args_e, kw_e, out_e, err_e, rng_e, obs_e = rec_e
        args_c, kw_c, out_c, err_c, rng_c, obs_c = rec_c
        where = f"call {i}: " if len(eager) > 1 else ""
        if err_e is not None:
            assert err_c is not None, f"{where}eager raised {type(err_e).__name__}: {err_e}; compiled returned {out_c!r}"
            if case.error == "exact":
                assert type(err_c) is type(err_e), f"{where}exception type {type(err_e).__name__} vs {type(err_c).__name__}: {err_c}"
                assert str(err_c) == str(err_e), f"{where}exception message {str(err_e)!r} vs {str(err_c)!r}"
            else:
                assert isinstance(err_c, type(err_e)), f"{where}exception type {type(err_e).__name__} vs {type(err_c).__name__}: {err_c}"
        elif err_c is not None:
            raise AssertionError(f"{where}compiled raised but eager did not: {type(err_c).__name__}: "
                                 f"{str(err_c).splitlines()[0] if str(err_c) else ''}") from err_c
        else:
            assert_same(out_e, out_c, f"{where}output", **tol)
        assert_same(list(args_e), list(args_c), f"{where}inputs after the call", **tol)
        assert_same(kw_e, kw_c, f"{where}keyword inputs after the call", **tol)
        assert_same(obs_e, obs_c, f"{where}observed Python state", **tol)
        assert torch.equal(rng_e, rng_c), f"{where}global RNG state differs from eager's after the call"
    assert len(eager) == len(compiled), "eager and compiled ran a different number of steps"
    if case.module:
        assert_same(target_e, target_c, "module after the calls", **tol)

    if case.backward and eager[0][3] is None:
        loss = _loss(compiled[0][2])
        assert loss is not None, "compiled outputs lost requires_grad"
        loss.backward()
        for j, (ge, gc) in enumerate(zip(_grads(target_e, eager[0][0]), _grads(target_c, compiled[0][0]))):
            assert (ge is None) == (gc is None), f"grad {j}: {ge is None} vs {gc is None}"
            if ge is not None:
                assert_same(ge, gc, f"grad {j}", **tol)

    reasons: list = []
    if eager[0][3] is None and not case.fullgraph:
        want_breaks = case.torch_breaks if (ORACLE and case.torch_breaks is not None) else case.breaks
        allowed = want_breaks if isinstance(want_breaks, tuple) else (want_breaks,)
        target_x = _build(case)
        if case.setup:
            case.setup()
        steps = case.steps or [lambda _t: case.inputs() if case.inputs else ()]
        torch.manual_seed(BUILD_SEED + 1)
        args, kwargs, ctx = _as_args(steps[0](target_x))
        torch.manual_seed(RUN_SEED)
        with (ctx() if ctx is not None else contextlib.nullcontext()):
            n, reasons = graph_break_count(target_x, args, kwargs)
        breaks_ok = n in allowed
        breaks_msg = f"graph breaks: expected {want_breaks}, got {n}: {reasons}"
    else:
        breaks_ok, breaks_msg = True, ""

    want_graphs = case.torch_graphs if (ORACLE and case.torch_graphs is not None) else case.graphs
    allowed = want_graphs if isinstance(want_graphs, tuple) else (want_graphs,)
    assert counter.graphs in allowed, (f"graphs: expected {want_graphs}, got {counter.graphs} "
                                       f"(ops per graph {counter.ops_per_graph}); breaks: {reasons}")
    assert all(n > 0 for n in counter.ops_per_graph), f"an empty graph reached the backend: {counter.ops_per_graph}"
    assert breaks_ok, breaks_msg
    reset()
