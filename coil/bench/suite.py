"""``coil bench``: the model suite (models × modes × compilers → rows).

For one model and mode the runner builds the model once, then

1. runs a float64 copy eagerly (the reference) and a copy in the mode's precision
   eagerly (eager's own error, the yardstick for correctness; see :mod:`measure`);
2. for each compiler, on a fresh copy of the model: compiles, times the first call
   (``cold_compile_s``: capture + compile + one run, in this process, with the disk
   caches the run started with), checks the first call's result, warms up, times
   eager and compiled interleaved (``speedup``), counts graphs / graph breaks /
   recompiles (graphs compiled after the first call), reads peak GPU memory, then
   drops the in-memory caches (``coil.reset()``, ``torch._dynamo.reset()``) and times
   the first call of a fresh compile again (``warm_compile_s``: in-process reset,
   on-disk caches kept: Inductor's FX graph and kernel caches, coil's kernel cache).

Paired timing (``paired=True``, ``coil bench --paired``). Timing each compiler against
its own eager copy makes every row's baseline a separate measurement; on a noisy machine
two rows' eager medians differ by tens of percent, so a ratio of two rows' speedups is
mostly noise. Paired, for each model and mode every compiler is first compiled on its
own copy and its first call timed and checked (as above); then all of them are warmed up
and timed in the same rounds, ``eager, compiled_1, compiled_2, ...``, so every row's
``speedup`` divides the same ``median(eager)`` (the rows' ``eager_ms`` are equal). A
compiler that raises (at compile, first call, warm-up or timing) gets its error row and
the others are timed without it; a mismatching one is timed, as unpaired. Peak memory
and the warm compile follow per row. Each compile (first call, warm compile) runs under
``row_timeout``; the shared warm-up + timing under ``row_timeout × (compilers timed)``
(a compiled step still running when it fires makes its row ``timeout``, and the others
are timed again without it). The rounds stop early after ``max_timing_s × (compilers
timed)`` seconds of timed calls (the same time per compiler as unpaired).

Every failure is confined to its row: an exception (``NotImplementedError`` from a
layer not built yet, a backend failure, a mismatch in shapes) makes that row
``status="error"`` with the message; a row past ``row_timeout`` becomes
``"timeout"``; rows not started before ``budget_s`` runs out are ``"skipped"``. Only
measured values are numbers; the rest are ``None``.

Modes: ``fp32`` (inference, no_grad, eval), ``bf16`` (inference with bf16 weights and
inputs), ``train`` (train(), forward, loss = sum of means of the float outputs,
backward; under ``torch.autocast(bfloat16)`` on CUDA, float32 on CPU; the step's result
is the loss and every parameter's gradient).
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Optional, Sequence

import torch

from coil.bench import measure
from coil.bench.compilers import BENCH_DEFAULT, Compiler, StatsProbe, resolve_compiler
from coil.bench.models import ModelSpec, default_size, flatten_outputs, reduce_to_scalar_loss, select_models
from coil.bench.output import Progress, fmt, machine_info, meta_markdown, render_markdown, render_table

MODES = ("fp32", "bf16", "train")


@dataclasses.dataclass
class BenchOptions:
    models: Optional[list[str]] = None
    #: the suite whose models run when ``models`` is None ("default" or "broad")
    suite: str = "default"
    modes: Sequence[str] = MODES
    compilers: Sequence[str] = tuple(BENCH_DEFAULT)
    device: str = "auto"
    size: Optional[str] = None  # None: default_size(device)
    warmup: int = 2
    repeat: int = 10
    #: stop the timed rounds early (after >= 3) once they add up to this many seconds
    max_timing_s: Optional[float] = 60.0
    warm_compile: bool = True
    row_timeout: Optional[float] = 600.0
    budget_s: Optional[float] = None
    progress: bool = True
    fresh_caches: bool = True
    #: append each finished row as one JSON line here (so a parent process keeps the
    #: rows finished before a crash or a hang)
    rows_jsonl: Optional[str] = None
    #: time all compilers of a model and mode in the same rounds, against one shared
    #: eager series (see the module docstring)
    paired: bool = False


@dataclasses.dataclass
class Row:
    """One (model, mode, device, compiler) result. ``None`` = not measured."""

    model: str
    mode: str
    device: str
    compiler: str
    status: str = "error"  # pass | mismatch | error | timeout | skipped
    error: Optional[str] = None
    config: Optional[str] = None
    accuracy_ratio: Optional[float] = None
    eager_ms: Optional[float] = None
    compiled_ms: Optional[float] = None
    speedup: Optional[float] = None
    cold_compile_s: Optional[float] = None
    warm_compile_s: Optional[float] = None
    graphs: Optional[int] = None
    graph_breaks: Optional[int] = None
    recompiles: Optional[int] = None
    peak_mem_gb: Optional[float] = None
    eager_peak_mem_gb: Optional[float] = None
    #: graphs (or kernels) that ran with ATen ops / the FX interpreter instead of coil's
    #: kernels because code generation failed, during compile and first call
    #: (``coil.exc.fallback_counts``; None for compilers that do not use coil's backend)
    codegen_fallbacks: Optional[int] = None
    #: each of those fallbacks' compile-log event and error text (JSON only)
    fallback_errors: Optional[list] = None
    traceback: Optional[str] = None
    #: timed with ``--paired`` (eager_ms is the one eager series shared by the rows of
    #: its model and mode)
    paired: bool = False


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# ---------------------------------------------------------------- steps

def _cast_inputs(obj: Any, dtype: torch.dtype) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_inputs(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast_inputs(v, dtype) for k, v in obj.items()}
    return obj


def make_step(fn: Callable, params: list[torch.nn.Parameter], args: tuple, kwargs: dict,
              mode: str, device: torch.device, autocast: Optional[bool] = None) -> Callable[[], list]:
    """A zero-argument callable running one step of ``mode``; returns a list of tensors
    (outputs for inference; ``[loss, *grads]`` for ``train``). ``train`` runs under bf16
    autocast on CUDA (``autocast=None``), or as ``autocast`` says."""
    if mode in ("fp32", "bf16"):
        def infer():
            with torch.no_grad():
                return flatten_outputs(fn(*args, **kwargs))
        return infer

    use_autocast = device.type == "cuda" if autocast is None else autocast

    def train():
        for p in params:
            p.grad = None
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
            loss = reduce_to_scalar_loss(fn(*args, **kwargs))
        loss.backward()
        return [loss.detach()] + [p.grad if p.grad is not None else torch.zeros_like(p)
                                  for p in params]
    return train


def _prepared_copy(module: torch.nn.Module, mode: str, dtype: torch.dtype) -> torch.nn.Module:
    m = copy.deepcopy(module).to(dtype)
    m.train(mode == "train")
    return m


def _mode_dtype(mode: str) -> torch.dtype:
    return torch.bfloat16 if mode == "bf16" else torch.float32


def _detach(ts: list) -> list:
    return [t.detach().clone() for t in ts]


# ---------------------------------------------------------------- one row, in pieces

def _trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _step_on_copy(module: torch.nn.Module, args: tuple, kwargs: dict, mode: str,
                  device: torch.device, dtype: Optional[torch.dtype] = None,
                  autocast: Optional[bool] = None) -> Callable[[], list]:
    """An eager step (see :func:`make_step`) on a fresh copy of ``module`` cast to
    ``dtype`` (default: the mode's precision), inputs cast alike; ``autocast`` as
    :func:`make_step` (None: on CUDA only, as the compiled steps run; the CPU eager
    baseline of a training row ran under bf16 autocast and its compiled steps did not)."""
    dtype = dtype or _mode_dtype(mode)
    m = _prepared_copy(module, mode, dtype)
    return make_step(m, _trainable(m), _cast_inputs(args, dtype), _cast_inputs(kwargs, dtype),
                     mode, device, autocast=autocast)


def _timed_first_call(step: Callable[[], list], device: torch.device) -> tuple[float, list]:
    """(seconds, outputs) of one call of ``step``, synchronized on both sides."""
    measure.synchronize(device)
    t0 = time.perf_counter()
    out = step()
    measure.synchronize(device)
    return time.perf_counter() - t0, out


@dataclasses.dataclass
class Prepared:
    """One compiler's compiled step on its own copy of the model, after its first call
    (made by :func:`prepare_row`); timing, memory and the warm compile start from it."""

    compiler: Compiler
    row: Row
    module: torch.nn.Module  # the compiler's copy (the warm compile compiles it again)
    make: Callable[[Any], Callable[[], list]]  # compiled callable -> step on the copy's inputs
    step: Optional[Callable[[], list]]  # None once dropped (before the warm compile)
    probe: StatsProbe
    #: graphs compiled after the first call (None when the probe cannot count graphs)
    recompiles: Optional[int] = None
    #: what the step raised (or the RowTimeout that stopped it) in warm-up or timing
    failure: Optional[BaseException] = None


def prepare_row(compiler: Compiler, module: torch.nn.Module, args: tuple, kwargs: dict,
                mode: str, device: torch.device, ref: list, eager_out: list,
                row: Row) -> Prepared:
    """Compile ``compiler`` on a fresh copy of ``module``, time and check its first call.

    ``ref`` / ``eager_out`` are the float64 reference and the eager result (lists of
    tensors, as a step returns them). Fills ``row``: ``cold_compile_s`` (seconds:
    capture + compile + one run; not for ``eager``), ``graphs``, ``graph_breaks``,
    ``status`` (pass | mismatch), ``accuracy_ratio`` and ``error`` (the mismatch, or
    the no-graph note). Raises whatever compiling or the first call raises."""
    dtype = _mode_dtype(mode)
    test_mod = _prepared_copy(module, mode, dtype)
    a, kw = _cast_inputs(args, dtype), _cast_inputs(kwargs, dtype)
    params = _trainable(test_mod)

    def make(compiled: Any) -> Callable[[], list]:
        return make_step(compiled, params, a, kw, mode, device)

    from coil.exc import fallback_counts, fallback_errors
    fallbacks_before, errors_before = sum(fallback_counts.values()), len(fallback_errors)
    compiled, probe = compiler.compile(test_mod)
    step = make(compiled)
    cold, first = _timed_first_call(step, device)
    first = _detach(first)
    counts = probe.read()
    if getattr(compiler, "coil_kernels", False):
        row.codegen_fallbacks = sum(fallback_counts.values()) - fallbacks_before
        row.fallback_errors = fallback_errors[errors_before:] or None
    if compiler.name != "eager":
        row.cold_compile_s = cold
    row.graphs, row.graph_breaks = counts.graphs, counts.graph_breaks

    # (training steps on CUDA run under bf16 autocast: make_step)
    verdict = measure.compare(ref, eager_out, first, low_precision=mode == "train" and device.type == "cuda")
    row.status = "pass" if verdict.ok else "mismatch"
    row.accuracy_ratio = verdict.worst_ratio
    if not verdict.ok:
        row.error = verdict.reason
    elif compiler.name != "eager" and counts.graphs == 0:
        row.error = "note: no graph was compiled (the model ran eagerly)"
    return Prepared(compiler, row, test_mod, make, step, probe,
                    recompiles=0 if counts.graphs is not None else None)


def _counted(prep: Optional[Prepared], call: Callable[[], Any]) -> Any:
    """``call()`` (which runs ``prep``'s step, or the eager step for ``prep=None``),
    adding the graphs compiled meanwhile to ``prep.recompiles`` (the probe is read
    outside ``call``, so outside any timer inside it) and keeping an exception raised
    meanwhile (a RowTimeout included) in ``prep.failure``. Re-raises."""
    if prep is None:
        return call()
    before = prep.probe.read().graphs
    try:
        return call()
    except Exception as e:
        prep.failure = e
        raise
    finally:
        after = prep.probe.read().graphs
        if prep.recompiles is not None and before is not None and after is not None:
            prep.recompiles += after - before


def time_steps(eager_step: Callable[[], list], preps: Sequence[Prepared], opts: BenchOptions,
               device: torch.device) -> None:
    """Warm up, then time ``eager_step`` and every prepared step in the same rounds
    (``eager, step_1, step_2, ...``, rotated by one each round when there are several
    prepared steps; ``opts.warmup`` untimed rounds, then up to
    ``opts.repeat`` timed ones, stopped early once the timed calls add up to
    ``opts.max_timing_s × len(preps)`` seconds, after at least 3 rounds).

    Fills each row's ``eager_ms`` (median of the one eager series, ms; the same number
    in every row), ``compiled_ms``, ``speedup = median(eager) / median(compiled)`` and
    ``recompiles``. Raises what a step raises (a compiled step's exception, a RowTimeout
    included, is also kept in its ``failure``) and ValueError for non-positive timings."""
    steps = [eager_step] + [p.step for p in preps]
    owner = {p.step: p for p in preps}
    for _ in range(opts.warmup):
        for fn in steps:
            _counted(owner.get(fn), fn)

    def timer(fn):
        return _counted(owner.get(fn), lambda: measure.time_once(fn, device))

    max_s = None if opts.max_timing_s is None else opts.max_timing_s * len(preps)
    # rotated rounds when several compilers share them (paired): no compiled step
    # always follows the same neighbour
    times = measure.time_interleaved(steps, opts.repeat, timer, max_seconds=max_s,
                                     rotate=len(steps) > 2)
    for p, compiled_t in zip(preps, times[1:]):
        speed = measure.summarize(times[0], compiled_t)
        p.row.eager_ms, p.row.compiled_ms = speed.eager_s * 1e3, speed.compiled_s * 1e3
        p.row.speedup, p.row.recompiles = speed.speedup, p.recompiles


def _peak_gb(step: Callable[[], list], device: torch.device) -> float:
    """Peak CUDA memory allocated during one call of ``step``, GiB."""
    measure.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    measure.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**30


def measure_memory(eager_step: Callable[[], list], preps: Sequence[Prepared],
                   device: torch.device) -> None:
    """Fill ``eager_peak_mem_gb`` (one eager step, the same number in every row) and
    ``peak_mem_gb`` (one step of each prep), GiB. Does nothing off CUDA."""
    if device.type != "cuda":
        return
    eager = _peak_gb(eager_step, device)
    for p in preps:
        p.row.eager_peak_mem_gb, p.row.peak_mem_gb = eager, _peak_gb(p.step, device)


def warm_compile(prep: Prepared, opts: BenchOptions, device: torch.device) -> None:
    """``warm_compile_s``: seconds of the first call of a fresh compile after
    ``compiler.reset()`` (in-memory caches dropped, disk caches kept). Drops
    ``prep.step``. Skipped for ``eager`` and without ``opts.warm_compile``; raises what
    compiling or the call raises."""
    prep.step = None
    if not opts.warm_compile or prep.compiler.name == "eager":
        return
    prep.compiler.reset()
    compiled, _ = prep.compiler.compile(prep.module)
    prep.row.warm_compile_s, _ = _timed_first_call(prep.make(compiled), device)


def run_row(compiler: Compiler, module: torch.nn.Module, args: tuple, kwargs: dict, mode: str,
            device: torch.device, ref: list, eager_out: list, opts: BenchOptions,
            row: Row) -> Row:
    """Measure one compiler on one model against its own eager copy (see the module
    docstring). Fills ``row`` in place and returns it; raises on failure (the caller
    records it)."""
    eager_step = _step_on_copy(module, args, kwargs, mode, device)
    prep = prepare_row(compiler, module, args, kwargs, mode, device, ref, eager_out, row)
    time_steps(eager_step, [prep], opts, device)
    measure_memory(eager_step, [prep], device)
    warm_compile(prep, opts, device)
    return row


# ---------------------------------------------------------------- failures and limits

def _time_limit_s(opts: BenchOptions, deadline: Optional[float], rows: int = 1) -> Optional[float]:
    """Seconds allowed for work standing for ``rows`` rows: ``row_timeout × rows``,
    capped at the time left before ``deadline`` (monotonic) + 60 s. None: no limit."""
    limit = opts.row_timeout * rows if opts.row_timeout else None
    if deadline is not None:
        limit = min(limit or 1e9, max(deadline - time.monotonic(), 1.0) + 60.0)
    return limit


def _record_failure(row: Row, e: BaseException, limit: Optional[float]) -> None:
    """Make ``row`` ``timeout`` (``e`` is a RowTimeout, maybe wrapped) or ``error``,
    with the one-line message and the traceback's last 4000 characters."""
    timed_out = measure.is_timeout(e)
    row.status = "timeout" if timed_out else "error"
    row.error = (f"timed out after {limit or 0:.0f} s" if timed_out
                 else measure.short_error(e))
    row.traceback = "".join(traceback.format_exception(e))[-4000:]


def _past(deadline: Optional[float]) -> bool:
    return deadline is not None and time.monotonic() > deadline


def _cleanup(compilers: Sequence[Compiler], device: torch.device) -> None:
    """Drop the compilers' in-memory caches and free memory between rows."""
    for c in compilers:
        c.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- --paired

def _time_paired(eager_step: Callable[[], list], preps: Sequence[Prepared],
                 opts: BenchOptions, device: torch.device,
                 deadline: Optional[float]) -> list[Prepared]:
    """:func:`time_steps` over ``preps`` under ``row_timeout × len(preps)`` seconds. A
    compiled step that raises or runs past the limit makes its row ``error`` /
    ``timeout`` and the rest are timed again without it (with a new limit); a failure
    of no single compiled step (the eager step) fails every row still in. Returns the
    preps timed; raises nothing."""
    live = list(preps)
    while live:
        limit = _time_limit_s(opts, deadline, len(live))
        try:
            with measure.time_limit(limit):
                time_steps(eager_step, live, opts, device)
            return live
        except Exception as e:
            culprits = [p for p in live if p.failure is not None] or list(live)
            for p in culprits:
                _record_failure(p.row, p.failure or e, limit)
                live.remove(p)
    return live


def _paired_rows(built: Any, mode: str, device: torch.device, compilers: Sequence[Compiler],
                 rows: Sequence[Row], ref: list, eager_out: list, opts: BenchOptions,
                 deadline: Optional[float], progress: Progress) -> None:
    """``--paired``: fill ``rows`` (one per compiler, same order) for one built model
    (``built.module/args/kwargs``) and mode; ``ref`` / ``eager_out`` as for
    :func:`prepare_row`. Failures stay in their rows; nothing is raised.

    1. each compiler, under the row time limit: :func:`prepare_row` (a failure makes
       that row error/timeout and leaves it out of the rest);
    2. warm-up and timing of the eager step and all prepared steps in the same rounds
       (:func:`_time_paired`: one shared eager series), then peak memory, each under
       ``row_timeout × (compilers timed)``;
    3. each timed row's warm compile, under the row time limit (skipped past the
       budget's deadline)."""
    label = f"{rows[0].model}/{mode}" if rows else mode
    eager_step = _step_on_copy(built.module, built.args, built.kwargs, mode, device)
    preps: list[Prepared] = []
    for compiler, row in zip(compilers, rows):
        if _past(deadline):
            row.status, row.error = "skipped", "time budget used up"
            continue
        progress.show(f"{label}/{compiler.name}: compiling")
        limit = _time_limit_s(opts, deadline)
        try:
            with measure.time_limit(limit):
                preps.append(prepare_row(compiler, built.module, built.args, built.kwargs,
                                         mode, device, ref, eager_out, row))
        except Exception as e:
            _record_failure(row, e, limit)
    if preps:
        progress.show(f"{label}: timing {len(preps)} compilers in shared rounds")
        preps = _time_paired(eager_step, preps, opts, device, deadline)
    if preps:
        limit = _time_limit_s(opts, deadline, len(preps))
        try:
            with measure.time_limit(limit):
                measure_memory(eager_step, preps, device)
        except Exception as e:
            for p in preps:
                _record_failure(p.row, e, limit)
            preps = []
    for p in preps:
        p.step = None  # free the compiled models before compiling again
    for p in preps:
        if _past(deadline):
            p.row.error = p.row.error or "note: warm compile skipped (time budget used up)"
            continue
        progress.show(f"{label}/{p.compiler.name}: warm compile")
        limit = _time_limit_s(opts, deadline)
        try:
            with measure.time_limit(limit):
                warm_compile(p, opts, device)
        except Exception as e:
            _record_failure(p.row, e, limit)


# ---------------------------------------------------------------- the suite

def _reference_outputs(built: Any, mode: str, device: torch.device) -> tuple[list, list]:
    """(float64 reference, eager result in the mode's precision): detached lists of
    tensors from one step of fresh copies of ``built.module``."""
    ref = _detach(_step_on_copy(built.module, built.args, built.kwargs, mode, device,
                                torch.float64, autocast=False)())
    eager_out = _detach(_step_on_copy(built.module, built.args, built.kwargs, mode, device)())
    return ref, eager_out


def _rows_for(spec: ModelSpec, mode: str, device: torch.device, compilers: list[Compiler],
              opts: BenchOptions, deadline: Optional[float], progress: Progress) -> list[Row]:
    rows = [Row(spec.name, mode, device.type, c.name, paired=opts.paired) for c in compilers]

    def finish(row: Row, label: str) -> None:
        progress.advance(f"{spec.name}/{mode}/{row.compiler}: {label}")
        if opts.rows_jsonl:
            with open(opts.rows_jsonl, "a") as f:
                f.write(json.dumps(dataclasses.asdict(row)) + "\n")

    if _past(deadline):
        for r in rows:
            r.status, r.error = "skipped", "time budget used up"
            finish(r, "skipped")
        return rows
    if not spec.available():
        for r in rows:
            r.status, r.error = "skipped", f"{spec.source} is not installed"
            finish(r, "skipped")
        return rows
    progress.show(f"{spec.name}/{mode}: building, fp64 reference")
    try:
        built = spec.build(device, opts.size or default_size(device))
        ref, eager_out = _reference_outputs(built, mode, device)
    except Exception as e:
        for r in rows:
            r.status, r.error = "error", "eager/reference run failed: " + measure.short_error(e)
            r.traceback = traceback.format_exc()[-4000:]
            finish(r, "error")
        return rows
    for row in rows:
        row.config = built.config

    if opts.paired:
        try:
            _paired_rows(built, mode, device, compilers, rows, ref, eager_out, opts, deadline,
                         progress)
        finally:
            _cleanup(compilers, device)
        for row in rows:
            finish(row, row.status)
        return rows

    for compiler, row in zip(compilers, rows):
        if _past(deadline):
            row.status, row.error = "skipped", "time budget used up"
            finish(row, "skipped")
            continue
        progress.show(f"{spec.name}/{mode}/{compiler.name}: compiling")
        limit = _time_limit_s(opts, deadline)
        try:
            with measure.time_limit(limit):
                run_row(compiler, built.module, built.args, built.kwargs, mode, device, ref,
                        eager_out, opts, row)
        except Exception as e:
            _record_failure(row, e, limit)
        finally:
            _cleanup([compiler], device)
        finish(row, row.status)
    return rows


def _fresh_caches() -> str:
    """Point Inductor's, Triton's and coil's on-disk caches at a new empty directory, so
    the first compile in this run is cold on disk as well."""
    root = tempfile.mkdtemp(prefix="coil_bench_cache_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    from coil import config

    config.config.cache_dir = os.path.join(root, "coil")
    return root


def run_bench(opts: BenchOptions) -> dict:
    """Run the suite; returns ``{"meta": ..., "rows": [Row as dict, ...]}``."""
    device = resolve_device(opts.device)
    specs = select_models(opts.models, opts.suite)
    compilers = [resolve_compiler(c) for c in opts.compilers]
    for m in opts.modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; valid: {', '.join(MODES)}")
    meta = machine_info()
    meta.update(device=device.type, size=opts.size or default_size(device), repeat=opts.repeat,
                warmup=opts.warmup, paired=opts.paired)
    if opts.fresh_caches:
        meta["cache_dir"] = _fresh_caches()
    deadline = time.monotonic() + opts.budget_s if opts.budget_s else None
    progress = Progress(len(specs) * len(opts.modes) * len(compilers), opts.progress)
    rows: list[Row] = []
    try:
        for spec in specs:
            for mode in opts.modes:
                rows += _rows_for(spec, mode, device, compilers, opts, deadline, progress)
    finally:
        progress.close()
    return {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows]}


def _child_env() -> dict:
    """This process's environment with its ``sys.path`` as PYTHONPATH (so compilers
    named ``module:attr`` resolve in the child the same way)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    return env


def run_bench_isolated(opts: BenchOptions, argv_common: list[str],
                       on_model: Optional[Callable[[dict], None]] = None) -> dict:
    """Run each model in its own ``coil bench`` subprocess. Rows stream back through a
    JSON-lines file, so a crash or a hang loses only the rows not finished yet, which
    are reported as ``error`` / ``timeout`` with the reason. All compilers of a model share
    its subprocess, so ``argv_common`` may carry ``--paired`` (then a model's watchdog
    allows 3 × row_timeout per row: each row's compile, its share of the timing rounds
    and its warm compile have a row_timeout each)."""
    device = resolve_device(opts.device)
    specs = select_models(opts.models, opts.suite)
    meta = machine_info()
    meta.update(device=device.type, size=opts.size or default_size(device), isolated=True,
                repeat=opts.repeat, warmup=opts.warmup, paired=opts.paired)
    deadline = time.monotonic() + opts.budget_s if opts.budget_s else None
    rows: list[dict] = []
    progress = Progress(len(specs), opts.progress)
    per_row = (opts.row_timeout or 600.0) * (3 if opts.paired else 1)
    per_model = len(opts.modes) * len(opts.compilers) * per_row + 120
    for spec in specs:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            rows += [dataclasses.asdict(Row(spec.name, m, device.type, c, status="skipped",
                                            error="time budget used up", paired=opts.paired))
                     for m in opts.modes for c in opts.compilers]
            progress.advance(f"{spec.name}: skipped")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.jsonl")
            cmd = [sys.executable, "-m", "coil.cli", "bench", "--model", spec.name,
                   "--rows-jsonl", out, "--no-progress", "--quiet", *argv_common]
            if left is not None:
                cmd += ["--budget", str(int(left))]
            timeout = per_model if left is None else min(per_model, left + 45)
            progress.show(f"{spec.name}: running in a subprocess")
            err, status = None, "error"
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                      env=_child_env())
                if proc.returncode != 0:
                    tail = " ".join(proc.stderr.strip().splitlines()[-3:])[-300:]
                    err = f"subprocess exited {proc.returncode}: {tail}"
            except subprocess.TimeoutExpired:
                err, status = f"subprocess timed out after {timeout:.0f} s", "timeout"
            got = []
            if os.path.exists(out):
                with open(out) as f:
                    got = [json.loads(line) for line in f if line.strip()]
            have = {(r["mode"], r["compiler"]) for r in got}
            for m in opts.modes:
                for c in opts.compilers:
                    name = c.split(":")[-1]
                    if not any(k[0] == m and (k[1] == c or k[1].lower() == name.lower())
                               for k in have):
                        got.append(dataclasses.asdict(Row(
                            spec.name, m, device.type, c, status=status,
                            error=err or "no result from the subprocess",
                            paired=opts.paired)))
            mode_rank = {m: i for i, m in enumerate(opts.modes)}
            got.sort(key=lambda r: mode_rank.get(r["mode"], 99))
            rows += got
        progress.advance(f"{spec.name}: done")
        if on_model is not None:  # partial results survive a kill of this process
            on_model({"meta": meta, "rows": list(rows)})
    progress.close()
    return {"meta": meta, "rows": rows}


# ---------------------------------------------------------------- reporting

HEADERS = ["model", "mode", "compiler", "status", "speedup", "eager ms", "compiled ms",
           "cold s", "warm s", "graphs", "breaks", "recomp", "fallbacks", "peak GB", "acc ratio"]


def _cells(r: dict) -> list[str]:
    return [r["model"], r["mode"], r["compiler"], r["status"], fmt(r["speedup"], ".2f"),
            fmt(r["eager_ms"], ".2f"), fmt(r["compiled_ms"], ".2f"),
            fmt(r["cold_compile_s"], ".1f"), fmt(r["warm_compile_s"], ".1f"),
            fmt(r["graphs"]), fmt(r["graph_breaks"]), fmt(r["recompiles"]),
            fmt(r.get("codegen_fallbacks")), fmt(r["peak_mem_gb"], ".2f"),
            fmt(r["accuracy_ratio"], ".2f")]


def summary(rows: list[dict]) -> list[dict]:
    """Per (mode, compiler): rows passing / run, geomean speedup of passing rows."""
    out = []
    keys = []
    for r in rows:
        if (r["mode"], r["compiler"]) not in keys:
            keys.append((r["mode"], r["compiler"]))
    for mode, comp in keys:
        sel = [r for r in rows if r["mode"] == mode and r["compiler"] == comp]
        passing = [r for r in sel if r["status"] == "pass"]
        out.append({"mode": mode, "compiler": comp, "pass": len(passing), "rows": len(sel),
                    "geomean_speedup": measure.geomean([r["speedup"] for r in passing]),
                    "errors": sum(r["status"] in ("error", "timeout") for r in sel),
                    "mismatches": sum(r["status"] == "mismatch" for r in sel)})
    return out


def versus(rows: list[dict], a: str = "coil", b: str = "inductor") -> list[dict]:
    """Per mode: ``speedup(a) / speedup(b)`` over the models where both rows pass
    (geomean, worst model and value, models below 0.9), and how many rows of ``a`` are
    not passing or took codegen fallbacks. Empty if either compiler has no rows."""
    out = []
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    for mode in modes:
        sel = {(r["model"], r["compiler"]): r for r in rows if r["mode"] == mode}
        models = list(dict.fromkeys(m for m, c in sel if c == a))
        if not models or not any(c == b for _, c in sel):
            continue
        ratios = {}
        for m in models:
            ra, rb = sel.get((m, a)), sel.get((m, b))
            if ra and rb and ra["status"] == rb["status"] == "pass" and ra["speedup"] \
                    and rb["speedup"]:
                ratios[m] = ra["speedup"] / rb["speedup"]
        worst = min(ratios, key=ratios.get) if ratios else None
        out.append({"mode": mode, "models": len(models), "compared": len(ratios),
                    "geomean_ratio": measure.geomean(list(ratios.values())),
                    "worst_model": worst, "worst_ratio": ratios.get(worst),
                    "below_0_9": sorted(m for m, v in ratios.items() if v < 0.9),
                    "not_passing": sum(sel[(m, a)]["status"] != "pass" for m in models),
                    "with_fallbacks": sum(bool(sel[(m, a)].get("codegen_fallbacks"))
                                          for m in models)})
    return out


def _versus_table(rows: list[dict]) -> Optional[tuple[list[str], list[list[str]]]]:
    vs = versus(rows)
    if not vs:
        return None
    head = ["mode", "coil/inductor geomean", "compared", "worst", "below 0.9",
            "coil not passing", "coil rows with fallbacks"]
    body = [[v["mode"], fmt(v["geomean_ratio"], ".2f"), f"{v['compared']}/{v['models']}",
             f"{v['worst_model']} {fmt(v['worst_ratio'], '.2f')}" if v["worst_model"] else "—",
             str(len(v["below_0_9"])), str(v["not_passing"]), str(v["with_fallbacks"])]
            for v in vs]
    return head, body


PAIRED_NOTE = ("timing: paired (--paired): per model and mode, one eager series and every "
               "compiler's steps timed in the same interleaved rounds; the speedups share "
               "that baseline")


def is_paired(result: dict) -> bool:
    """Whether ``result``'s rows were timed paired (its meta says so, or any row does)."""
    return bool(result.get("meta", {}).get("paired")
                or any(r.get("paired") for r in result["rows"]))


def format_text(result: dict) -> str:
    rows = result["rows"]
    text = render_table(HEADERS, [_cells(r) for r in rows])
    if is_paired(result):
        text = PAIRED_NOTE + "\n\n" + text
    summ = summary(rows)
    text += "\n\n" + render_table(
        ["mode", "compiler", "pass", "errors", "mismatch", "geomean speedup"],
        [[s["mode"], s["compiler"], f"{s['pass']}/{s['rows']}", str(s["errors"]),
          str(s["mismatches"]), fmt(s["geomean_speedup"], ".2f")] for s in summ])
    vs = _versus_table(rows)
    if vs:
        text += "\n\n" + render_table(*vs)
    errors = [r for r in rows if r["error"] and r["status"] != "skipped"]
    if errors:
        text += "\n\nerrors, mismatches and notes:\n" + "\n".join(
            f"  {r['model']}/{r['mode']}/{r['compiler']}: {r['error']}" for r in errors)
    return text


def format_markdown(result: dict) -> str:
    rows = result["rows"]
    summ = summary(rows)
    parts = [meta_markdown(result["meta"]), ""]
    if is_paired(result):
        parts += [f"**{PAIRED_NOTE}.**", ""]
    parts += [render_markdown(["mode", "compiler", "pass", "errors", "mismatch",
                               "geomean speedup (passing rows)"],
                              [[s["mode"], s["compiler"], f"{s['pass']}/{s['rows']}",
                                str(s["errors"]), str(s["mismatches"]),
                                fmt(s["geomean_speedup"], ".2f")] for s in summ]),
              "", render_markdown(HEADERS, [_cells(r) for r in rows])]
    vs = _versus_table(rows)
    if vs:
        parts += ["", render_markdown(*vs)]
    errors = [r for r in rows if r["error"] and r["status"] != "skipped"]
    if errors:
        parts += ["", "Errors, mismatches and notes:", ""]
        parts += [f"- `{r['model']}/{r['mode']}/{r['compiler']}`: {r['error']}" for r in errors]
    return "\n".join(parts)
