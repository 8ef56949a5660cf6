"""``coil bench --mode dynamic``: one model, ten sequence lengths, how many compiles.

Real programs change the sequence length. For each model (transformers GPT-2 and a
LLaMA-style model, random weights, bf16 inference, the configs of
:mod:`coil.bench.models`) and each compiler, a fresh compiled copy runs the lengths in
order:

- ``coil``: ``coil.compile(m)`` (``dynamic=None``: the first length static, then one
  automatic-dynamic graph for the rest);
- ``coil-static``: ``coil.compile(m, dynamic=False)``: one compile per length, the
  baseline a dynamic graph's kernels are measured against;
- ``inductor``: ``torch.compile(m)`` (``dynamic=None``), to compare.

Every compiler's copy lives through the whole run of a model. Per length each copy's
first call is timed (compile included; which copy goes first rotates with the length)
and its logits are checked against eager's (``reduce_overhead._check``: rmse within
5e-2 of eager's rms in bf16); then, after ``warmup`` calls each, the copies are timed
side by side, ``repeat`` rounds interleaved in rotating order, each sample
:data:`CALLS_PER_SAMPLE` calls back to back, and the steady state is each one's median
per call (so the ratio of two rows is measured under one machine state, not minutes
apart). Per compiler the row reports
``graphs`` (graphs the backend compiled: coil's ``compile_aten_graph`` calls, torch's
``unique_graphs``), ``compile_s`` (the sum over lengths of first call minus steady-state
time) and ``ms`` per length. ``ratios`` holds ``coil / coil-static`` per length and their
geometric mean: the price of symbolic kernels (1.0: none).

``full`` (CUDA): GPT-2 124M and an 8-layer LLaMA (hidden 1024), batch 4, lengths
64..512; ``small`` (CPU, tests): the 2-layer configs, batch 2, lengths 8..64. A
``budget_s`` is split evenly over the models (what one leaves unused goes to the next);
past its share a model skips its remaining lengths (named in each row's note), so the
whole run ends in about the budget. On the H200 one model's ten lengths take about five
(GPT-2) and seven (LLaMA) minutes, so ``benchmarks/gpu_dynamic_bench.sh`` runs one model
per device call.
"""
from __future__ import annotations

import cProfile
import gc
import os
import pstats
import statistics
import time
import traceback
from typing import Callable, Optional, Sequence

import torch

from coil import trace
from coil.bench import measure
from coil.bench.models import _GPT2, _LLAMA, _ids
from coil.bench.output import Progress, fmt, machine_info, meta_markdown, render_markdown, render_table
from coil.bench.reduce_overhead import _check, _reset_compilers, resolve

MODE = "dynamic"

#: name -> (transformers model class, config class, configs by size)
MODELS = {"gpt2": ("GPT2LMHeadModel", "GPT2Config", _GPT2),
          "llama": ("LlamaForCausalLM", "LlamaConfig", _LLAMA)}
LENGTHS = {"full": [64, 96, 128, 160, 200, 256, 333, 400, 448, 512],
           "small": [8, 11, 16, 20, 24, 31, 40, 48, 57, 64]}
BATCH = {"full": 4, "small": 2}


def _coil(dynamic):
    def make(m):
        import coil
        # coil-static: one entry per length, and ten lengths pass the default limit of 8
        opts = {"recompile_limit": 2 * len(LENGTHS["full"])} if dynamic is False else None
        return coil.compile(m, dynamic=dynamic, options=opts)
    return make


#: compiler name -> ``compile(module)``
COMPILERS: dict[str, Callable] = {"coil": _coil(None), "coil-static": _coil(False),
                                  "inductor": lambda m: torch.compile(m)}
LABELS = {"coil": "coil", "coil-static": "coil static", "inductor": "torch.compile"}


def build(name: str, device: torch.device, size: str):
    """The model ``name`` in bf16 on ``device`` (eval mode, random weights)."""
    import transformers

    cls, conf_cls, cfgs = MODELS[name]
    torch.manual_seed(0)
    conf = getattr(transformers, conf_cls)(**cfgs[size])
    return getattr(transformers, cls)(conf).to(device, torch.bfloat16).eval()


class _GraphCounter:
    """Graphs compiled so far, per backend family: ``coil`` (calls of
    ``coil.codegen.compile_aten_graph``) and ``inductor`` (torch's ``unique_graphs``)."""

    def __enter__(self):
        import coil.codegen as cg
        from torch._dynamo.utils import counters

        counters.clear()
        self.coil, self.orig = 0, cg.compile_aten_graph

        def counting(*args):
            self.coil += 1
            return self.orig(*args)
        cg.compile_aten_graph = counting
        return self

    def count(self, compiler: str) -> int:
        if compiler == "inductor":
            from torch._dynamo.utils import counters
            return int(counters["stats"]["unique_graphs"])
        return self.coil

    def __exit__(self, *exc):
        import coil.codegen as cg
        cg.compile_aten_graph = self.orig


def _profiler(compiler: str, L: int):
    """A running cProfile of the first call of ``compiler`` at length ``L`` when
    ``COIL_BENCH_PROFILE=<compiler>:<L>`` names it (its 30 costliest functions are
    printed after the call), else None."""
    if os.environ.get("COIL_BENCH_PROFILE") != f"{compiler}:{L}":
        return None
    prof = cProfile.Profile()
    prof.enable()
    return prof


def _first_call(row: dict, fn, ids, L: int, ref, warmup: int, device, counter) -> None:
    """The call at a new length (compile included) into ``row``: seconds, graphs, check."""
    before = counter.count(row["compiler"])
    measure.synchronize(device)
    trace.log("bench_first_call", stage="bench", compiler=row["compiler"], length=L)
    prof = _profiler(row["compiler"], L)
    t0 = time.perf_counter()
    out = fn(input_ids=ids).logits
    measure.synchronize(device)
    row["first_s"][L] = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    trace.log("bench_first_call_done", stage="bench", compiler=row["compiler"], length=L,
              seconds=row["first_s"][L])
    ok, note = _check([ref], [out], torch.bfloat16)
    if not ok:
        row["status"] = "mismatch"
        row["notes"].append(f"L={L}: {note}")
    for _ in range(warmup):
        fn(input_ids=ids)
    row["graphs"] += counter.count(row["compiler"]) - before


#: calls timed back to back per sample: one host-bound call of a few milliseconds read
#: up to 1.27x apart between two equal graphs in one run (GPT-2, H200)
CALLS_PER_SAMPLE = 5


def _calls(fn, ids, n: int) -> Callable[[], None]:
    def run():
        for _ in range(n):
            fn(input_ids=ids)
    return run


def run_model(name: str, model, compilers: Sequence[str], lengths: Sequence[int], batch: int,
              device: torch.device, warmup: int, repeat: int,
              deadline: Optional[float]) -> list[dict]:
    """One row per compiler for model ``name``. Every compiler's copy lives through the
    run; per length each makes its first call (compile time, graphs, accuracy; the
    order rotates with the length), then the copies are timed side by side
    (``measure.time_interleaved``, rotating the order; a sample is
    :data:`CALLS_PER_SAMPLE` calls back to back), so a ratio between two rows is measured
    under the same machine state. A compiler that
    raises is dropped (its row holds the error); past ``deadline`` the remaining lengths
    are skipped (named in each row's note)."""
    _reset_compilers()
    rows = {c: {"model": name, "compiler": c, "status": "pass", "graphs": 0, "compile_s": 0.0,
                "ms": {}, "first_s": {}, "notes": [], "error": None} for c in compilers}
    fns: dict = {}
    vocab = model.config.vocab_size
    warm = torch.compile(model, backend="aot_eager") if device.type == "cuda" else None
    with _GraphCounter() as counter, torch.no_grad():
        for c in compilers:
            try:
                fns[c] = COMPILERS[c](model)
            except Exception as e:  # noqa: BLE001 - confined to this row
                _row_error(rows[c], e)
        for L in lengths:
            if deadline is not None and time.perf_counter() > deadline:
                for c in fns:
                    rows[c]["notes"].append("budget: skipped L=" + ",".join(
                        str(x) for x in lengths if x not in rows[c]["ms"]))
                break
            ids = _ids(batch, L, vocab, device)
            ref = model(input_ids=ids).logits
            # torch's one-time costs at a new shape (cuDNN's plans for the masked SDPA the
            # compiled graphs call, for one) are paid here, untimed, by an aot_eager copy (its
            # graphs call the same ATen ops), not by the compiler the rotation puts first
            _warm(warm, ids)
            # the first call's order still rotates with the length
            order = list(fns)
            k = lengths.index(L) % len(order) if order else 0
            for c in order[k:] + order[:k]:
                try:
                    _first_call(rows[c], fns[c], ids, L, ref, warmup, device, counter)
                except Exception as e:  # noqa: BLE001 - confined to this row
                    _row_error(rows[c], e)
                    del fns[c]
            live = list(fns)
            before = {c: counter.count(c) for c in live}
            calls = [_calls(fns[c], ids, CALLS_PER_SAMPLE) for c in live]
            gc.collect()  # (time_interleaved pauses the collector; what the first calls left goes first)
            ts = measure.time_interleaved(calls, repeat, lambda f: measure.time_once(f, device),
                                          rotate=True)
            for c, t in zip(live, ts):
                steady = statistics.median(t) / CALLS_PER_SAMPLE
                rows[c]["ms"][L] = steady * 1e3
                rows[c]["compile_s"] += max(rows[c]["first_s"][L] - steady, 0.0)
                if counter.count(c) != before[c]:
                    rows[c]["notes"].append(f"L={L}: compiled again while timed")
    for r in rows.values():
        r["note"] = "; ".join(r.pop("notes")) or None
    return list(rows.values())


def _warm(warm, ids) -> None:
    """One call of the aot_eager copy ``warm`` (None: nothing to warm); a failure only loses the warm-up."""
    if warm is not None:
        try:
            warm(input_ids=ids)
        except Exception:  # noqa: BLE001 - the timed compilers still run
            pass


def _row_error(row: dict, e: Exception) -> None:
    row["status"], row["error"] = "error", measure.short_error(e)
    row["traceback"] = traceback.format_exc()[-4000:]


def ratios(rows: list[dict]) -> dict:
    """``{model: {"per_length": {L: coil ms / coil-static ms}, "geomean": g}}``."""
    out = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        by = {r["compiler"]: r for r in rows if r["model"] == name}
        if "coil" not in by or "coil-static" not in by:
            continue
        dyn, st = by["coil"]["ms"], by["coil-static"]["ms"]
        per = {L: dyn[L] / st[L] for L in dyn if L in st and st[L] > 0}
        out[name] = {"per_length": per, "geomean": measure.geomean(list(per.values()))}
    return out


def run(models: Optional[Sequence[str]] = None, device: str = "auto", size: Optional[str] = None,
        compilers: Sequence[str] = ("coil", "coil-static", "inductor"),
        lengths: Optional[Sequence[int]] = None, warmup: int = 2, repeat: int = 10,
        budget_s: Optional[float] = None, progress: bool = True,
        on_workload: Optional[Callable[[dict], None]] = None) -> dict:
    """Run the dynamic-shape benchmark; returns ``{"meta", "rows", "ratios"}`` (also handed
    to ``on_workload`` after each model, so a run killed from outside keeps what finished).

    Raises ValueError for an unknown model or compiler name."""
    names, dev, size = resolve(models, MODELS, "models", compilers, COMPILERS, device, size)
    lengths = list(lengths or LENGTHS[size])
    meta = machine_info()
    meta.update(mode=MODE, device=str(dev), size=size, compilers=list(compilers),
                lengths=lengths, batch=BATCH[size], dtype="bfloat16")
    rows: list = []
    start = time.perf_counter()
    bar = Progress(len(names), enabled=progress)
    for i, name in enumerate(names):
        bar.show(name)
        deadline = None
        if budget_s is not None:   # this model's share of what is left
            left = budget_s - (time.perf_counter() - start)
            deadline = time.perf_counter() + left / (len(names) - i)
        model = build(name, dev, size)
        rows += run_model(name, model, compilers, lengths, BATCH[size], dev, warmup, repeat,
                          deadline)
        bar.advance(name)
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        if on_workload is not None:
            on_workload({"meta": meta, "rows": rows, "ratios": ratios(rows)})
    bar.close()
    return {"meta": meta, "rows": rows, "ratios": ratios(rows)}


def _table(result: dict) -> tuple[list[str], list[list[str]]]:
    lengths = result["meta"]["lengths"]
    headers = ["model", "compiler", "status", "graphs", "compile s",
               *[f"L={L} ms" for L in lengths], "note"]
    cells = []
    for r in result["rows"]:
        ms = {int(k): v for k, v in r["ms"].items()}
        cells.append([r["model"], LABELS.get(r["compiler"], r["compiler"]), r["status"],
                      fmt(r["graphs"]), fmt(r["compile_s"], ".1f"),
                      *[fmt(ms.get(L), ".3f") for L in lengths],
                      r["error"] or r["note"] or ""])
    for name, rt in result["ratios"].items():
        per = {int(k): v for k, v in rt["per_length"].items()}
        cells.append([name, "coil / coil static", "", "", "", *[fmt(per.get(L), ".2f") for L in lengths],
                      f"geomean {fmt(rt['geomean'], '.2f')}"])
    return headers, cells


def format_text(result: dict) -> str:
    """The rows as a text table (one column per length, then the dynamic/static ratios)."""
    m = result["meta"]
    return (f"dynamic shapes: {m['device']}, {m['size']} configs, batch {m['batch']}, bf16\n"
            + render_table(*_table(result)))


def format_markdown(result: dict) -> str:
    """A markdown block: how it was made, then the table."""
    return meta_markdown(result["meta"]) + "\n\n" + render_markdown(*_table(result)) + "\n"
