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
from coil.bench.compilers import BENCH_DEFAULT, Compiler, resolve_compiler
from coil.bench.models import ModelSpec, default_size, flatten_outputs, reduce_to_scalar_loss, select_models
from coil.bench.output import Progress, fmt, machine_info, meta_markdown, render_markdown, render_table

MODES = ("fp32", "bf16", "train")


@dataclasses.dataclass
class BenchOptions:
    models: Optional[list[str]] = None
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
    traceback: Optional[str] = None


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
              mode: str, device: torch.device, autocast: bool = True) -> Callable[[], list]:
    """A zero-argument callable running one step of ``mode``; returns a list of tensors
    (outputs for inference; ``[loss, *grads]`` for ``train``)."""
    if mode in ("fp32", "bf16"):
        def infer():
            with torch.no_grad():
                return flatten_outputs(fn(*args, **kwargs))
        return infer

    use_autocast = autocast and device.type == "cuda"

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


# ---------------------------------------------------------------- one row

def run_row(compiler: Compiler, module: torch.nn.Module, args: tuple, kwargs: dict, mode: str,
            device: torch.device, ref: list, eager_out: list, opts: BenchOptions,
            row: Row) -> Row:
    """Measure one compiler on one prepared model (see the module docstring). Fills
    ``row`` in place and returns it; raises on failure (the caller records it)."""
    dtype = _mode_dtype(mode)
    eager_mod = _prepared_copy(module, mode, dtype)
    test_mod = _prepared_copy(module, mode, dtype)
    a, kw = _cast_inputs(args, dtype), _cast_inputs(kwargs, dtype)
    eager_step = make_step(eager_mod, [p for p in eager_mod.parameters() if p.requires_grad],
                           a, kw, mode, device)
    params = [p for p in test_mod.parameters() if p.requires_grad]
    timer = lambda fn: measure.time_once(fn, device)  # noqa: E731

    compiled, probe = compiler.compile(test_mod)
    step = make_step(compiled, params, a, kw, mode, device)
    measure.synchronize(device)
    t0 = time.perf_counter()
    first = step()
    measure.synchronize(device)
    cold = time.perf_counter() - t0
    first = _detach(first)
    counts = probe.read()
    if compiler.name != "eager":
        row.cold_compile_s = cold
    row.graphs, row.graph_breaks = counts.graphs, counts.graph_breaks

    verdict = measure.compare(ref, eager_out, first)
    row.status = "pass" if verdict.ok else "mismatch"
    row.accuracy_ratio = verdict.worst_ratio
    if not verdict.ok:
        row.error = verdict.reason
    elif compiler.name != "eager" and counts.graphs == 0:
        row.error = "note: no graph was compiled (the model ran eagerly)"
    del first

    for _ in range(opts.warmup):
        eager_step()
        step()
    eager_t, comp_t = measure.time_interleaved([eager_step, step], opts.repeat, timer,
                                               max_seconds=opts.max_timing_s)
    speed = measure.summarize(eager_t, comp_t)
    row.eager_ms, row.compiled_ms, row.speedup = speed.eager_s * 1e3, speed.compiled_s * 1e3, speed.speedup
    after = probe.read()
    if after.graphs is not None and counts.graphs is not None:
        row.recompiles = after.graphs - counts.graphs

    if device.type == "cuda":
        for fn, attr in ((eager_step, "eager_peak_mem_gb"), (step, "peak_mem_gb")):
            measure.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            fn()
            measure.synchronize(device)
            setattr(row, attr, torch.cuda.max_memory_allocated(device) / 2**30)

    if opts.warm_compile and compiler.name != "eager":
        del compiled, step
        compiler.reset()
        compiled2, _ = compiler.compile(test_mod)
        step2 = make_step(compiled2, params, a, kw, mode, device)
        measure.synchronize(device)
        t0 = time.perf_counter()
        step2()
        measure.synchronize(device)
        row.warm_compile_s = time.perf_counter() - t0
    return row


# ---------------------------------------------------------------- the suite

def _rows_for(spec: ModelSpec, mode: str, device: torch.device, compilers: list[Compiler],
              opts: BenchOptions, deadline: Optional[float], progress: Progress) -> list[Row]:
    rows = [Row(spec.name, mode, device.type, c.name) for c in compilers]

    def finish(row: Row, label: str) -> None:
        progress.advance(f"{spec.name}/{mode}/{row.compiler}: {label}")
        if opts.rows_jsonl:
            with open(opts.rows_jsonl, "a") as f:
                f.write(json.dumps(dataclasses.asdict(row)) + "\n")

    if deadline is not None and time.monotonic() > deadline:
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
        dtype = _mode_dtype(mode)
        ref_mod = _prepared_copy(built.module, mode, torch.float64)
        ref = _detach(make_step(ref_mod, [p for p in ref_mod.parameters() if p.requires_grad],
                                _cast_inputs(built.args, torch.float64),
                                _cast_inputs(built.kwargs, torch.float64), mode, device,
                                autocast=False)())
        del ref_mod
        low = _prepared_copy(built.module, mode, dtype)
        eager_out = _detach(make_step(low, [p for p in low.parameters() if p.requires_grad],
                                      _cast_inputs(built.args, dtype),
                                      _cast_inputs(built.kwargs, dtype), mode, device)())
        del low
    except Exception as e:
        for r in rows:
            r.status, r.error = "error", "eager/reference run failed: " + measure.short_error(e)
            r.traceback = traceback.format_exc()[-4000:]
            finish(r, "error")
        return rows

    for compiler, row in zip(compilers, rows):
        row.config = built.config
        if deadline is not None and time.monotonic() > deadline:
            row.status, row.error = "skipped", "time budget used up"
            finish(row, "skipped")
            continue
        progress.show(f"{spec.name}/{mode}/{compiler.name}: compiling")
        limit = opts.row_timeout
        if deadline is not None:
            limit = min(limit or 1e9, max(deadline - time.monotonic(), 1.0) + 60.0)
        try:
            with measure.time_limit(limit):
                run_row(compiler, built.module, built.args, built.kwargs, mode, device, ref,
                        eager_out, opts, row)
        except Exception as e:
            timed_out = measure.is_timeout(e)
            row.status = "timeout" if timed_out else "error"
            row.error = f"timed out after {limit:.0f} s" if timed_out else measure.short_error(e)
            row.traceback = traceback.format_exc()[-4000:]
        finally:
            compiler.reset()
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
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
    specs = select_models(opts.models)
    compilers = [resolve_compiler(c) for c in opts.compilers]
    for m in opts.modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; valid: {', '.join(MODES)}")
    meta = machine_info()
    meta.update(device=device.type, size=opts.size or default_size(device), repeat=opts.repeat,
                warmup=opts.warmup)
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
    are reported as ``error`` / ``timeout`` with the reason."""
    device = resolve_device(opts.device)
    specs = select_models(opts.models)
    meta = machine_info()
    meta.update(device=device.type, size=opts.size or default_size(device), isolated=True,
                repeat=opts.repeat, warmup=opts.warmup)
    deadline = time.monotonic() + opts.budget_s if opts.budget_s else None
    rows: list[dict] = []
    progress = Progress(len(specs), opts.progress)
    per_model = len(opts.modes) * len(opts.compilers) * (opts.row_timeout or 600.0) + 120
    for spec in specs:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            rows += [dataclasses.asdict(Row(spec.name, m, device.type, c, status="skipped",
                                            error="time budget used up"))
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
                            error=err or "no result from the subprocess")))
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
           "cold s", "warm s", "graphs", "breaks", "recomp", "peak GB", "acc ratio"]


def _cells(r: dict) -> list[str]:
    return [r["model"], r["mode"], r["compiler"], r["status"], fmt(r["speedup"], ".2f"),
            fmt(r["eager_ms"], ".2f"), fmt(r["compiled_ms"], ".2f"),
            fmt(r["cold_compile_s"], ".1f"), fmt(r["warm_compile_s"], ".1f"),
            fmt(r["graphs"]), fmt(r["graph_breaks"]), fmt(r["recompiles"]),
            fmt(r["peak_mem_gb"], ".2f"), fmt(r["accuracy_ratio"], ".2f")]


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


def format_text(result: dict) -> str:
    rows = result["rows"]
    text = render_table(HEADERS, [_cells(r) for r in rows])
    summ = summary(rows)
    text += "\n\n" + render_table(
        ["mode", "compiler", "pass", "errors", "mismatch", "geomean speedup"],
        [[s["mode"], s["compiler"], f"{s['pass']}/{s['rows']}", str(s["errors"]),
          str(s["mismatches"]), fmt(s["geomean_speedup"], ".2f")] for s in summ])
    errors = [r for r in rows if r["error"] and r["status"] != "skipped"]
    if errors:
        text += "\n\nerrors, mismatches and notes:\n" + "\n".join(
            f"  {r['model']}/{r['mode']}/{r['compiler']}: {r['error']}" for r in errors)
    return text


def format_markdown(result: dict) -> str:
    rows = result["rows"]
    summ = summary(rows)
    parts = [meta_markdown(result["meta"]), "",
             render_markdown(["mode", "compiler", "pass", "errors", "mismatch",
                              "geomean speedup (passing rows)"],
                             [[s["mode"], s["compiler"], f"{s['pass']}/{s['rows']}",
                               str(s["errors"]), str(s["mismatches"]),
                               fmt(s["geomean_speedup"], ".2f")] for s in summ]),
             "", render_markdown(HEADERS, [_cells(r) for r in rows])]
    errors = [r for r in rows if r["error"] and r["status"] != "skipped"]
    if errors:
        parts += ["", "Errors, mismatches and notes:", ""]
        parts += [f"- `{r['model']}/{r['mode']}/{r['compiler']}`: {r['error']}" for r in errors]
    return "\n".join(parts)
