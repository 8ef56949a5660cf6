"""``coil demo``: the main job in one command.

Builds ``transformers``' GPT-2 from a config with random weights (coil's own small GPT
when ``transformers`` is not installed), compiles it with coil on the best device
present, runs it eagerly and compiled, checks the outputs agree (the bench's rule:
compiled error against a float64 run within 2x eager's own error), and prints graphs,
graph breaks, compile time, eager and compiled time and the speedup. The compile log
goes to ``<out>/trace`` (``coil.trace.set_dir``) and the HTML report to
``<out>/report``; both paths are printed. Each compile stage shows on a progress line
while it runs (``coil.trace.add_stage_listener``).

Sizes: CPU uses GPT-2 with 2 layers, width 128, batch 2 x 64 tokens (so the demo ends
in well under two minutes on two cores); CUDA uses GPT-2 small's 124M config at batch
8 x 512.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Optional

import torch

from coil.bench import measure
from coil.bench.models import MODELS, default_size, flatten_outputs
from coil.bench.output import fmt, render_table


class StageProgress:
    """Shows the compile stage being run: one redrawn line on a terminal, one line per
    finished top-level stage otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.stack: list[str] = []
        self.t0 = time.perf_counter()
        self.counts: dict[str, int] = {}

    def __call__(self, stage: str, event: str, ms: Optional[float]) -> None:
        if event == "start":
            self.stack.append(stage)
            if self.tty:
                el = time.perf_counter() - self.t0
                self.stream.write(f"\r\033[K  compiling [{el:5.1f} s] " + " > ".join(self.stack[-4:]))
                self.stream.flush()
            return
        if self.stack and self.stack[-1] == stage:
            self.stack.pop()
        self.counts[stage] = self.counts.get(stage, 0) + 1
        if not self.tty and len(self.stack) <= 1 and (ms or 0) >= 20:
            # a stage ends before its parent: name the parent ("capture > backend")
            path = " > ".join(self.stack + [stage])
            self.stream.write(f"  {path}: {ms:.0f} ms\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _model(device: torch.device, size: str):
    spec = MODELS["hf_gpt2"] if MODELS["hf_gpt2"].available() else MODELS["small_gpt"]
    built = spec.build(device, size)
    built.module.eval()
    return spec.name, built


def main(device: str = "auto", out_dir: str = "coil_demo", backend: str = "coil",
         repeat: int = 10, size: Optional[str] = None) -> int:
    """Run the demo; returns 0 when the compiled outputs match eager, 1 otherwise."""
    from coil import trace
    from coil.bench.compilers import StatsProbe
    from coil.bench.suite import make_step, resolve_device
    from coil.backends import lookup_backend
    import coil

    dev = resolve_device(device)
    size = size or default_size(dev)
    out_dir = os.path.abspath(out_dir)
    trace_dir, report_dir = os.path.join(out_dir, "trace"), os.path.join(out_dir, "report")
    os.makedirs(trace_dir, exist_ok=True)
    for f in os.listdir(trace_dir):  # a fresh log for this run
        if f.endswith(".jsonl"):
            os.remove(os.path.join(trace_dir, f))

    name, built = _model(dev, size)
    print(f"coil demo: {name} ({built.config}, random weights) on {dev.type}, backend {backend!r}")
    model = built.module
    ref_mod = __import__("copy").deepcopy(model).double()
    cast = lambda xs: tuple(x.double() if x.is_floating_point() else x for x in xs)  # noqa: E731
    ref = [t.detach() for t in make_step(ref_mod, [], cast(built.args), {}, "fp32", dev)()]
    del ref_mod
    eager_step = make_step(model, [], built.args, built.kwargs, "fp32", dev)
    eager_out = [t.detach().clone() for t in eager_step()]

    probe = StatsProbe("coil")
    probe.start()
    listener = StageProgress()
    trace.set_dir(trace_dir)
    trace.add_stage_listener(listener)
    error = None
    try:
        compiled = coil.compile(model, backend=probe.counting(lookup_backend(backend)))
        step = make_step(compiled, [], built.args, built.kwargs, "fp32", dev)
        measure.synchronize(dev)
        t0 = time.perf_counter()
        first = [t.detach().clone() for t in step()]
        measure.synchronize(dev)
        compile_s = time.perf_counter() - t0
    except Exception as e:
        error = e
        tb = traceback.format_exc()
    finally:
        listener.close()
        trace.remove_stage_listener(listener)
    counts = probe.read()

    rows = [["model", f"{name} ({built.config})"], ["device", dev.type],
            ["graphs", fmt(counts.graphs)], ["graph breaks", fmt(counts.graph_breaks)]]
    ok = False
    if error is None:
        verdict = measure.compare(ref, eager_out, first)
        ok = verdict.ok
        maxdiff = max(float((a.double() - b.double()).abs().max()) for a, b in zip(first, eager_out))
        for _ in range(2):
            eager_step(), step()
        timer = lambda fn: measure.time_once(fn, dev)  # noqa: E731
        e_t, c_t = measure.time_interleaved([eager_step, step], repeat, timer, max_seconds=15.0)
        speed = measure.summarize(e_t, c_t)
        rows += [["compile time (first call)", f"{compile_s:.2f} s"],
                 ["eager time (median)", f"{speed.eager_s * 1e3:.2f} ms"],
                 [f"{backend} time (median)", f"{speed.compiled_s * 1e3:.2f} ms"],
                 ["speedup", f"{speed.speedup:.2f}x ({len(e_t)} interleaved rounds)"],
                 ["outputs match eager", ("yes" if ok else "NO: " + verdict.reason)
                  + f" (max abs diff {maxdiff:.2e})"]]
    else:
        rows += [["compile", "FAILED: " + measure.short_error(error, 500)]]
    trace.set_dir(None)
    print(render_table(["result", ""], rows))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1):
        print(f"note: this machine is busy (load average {load:.1f} on {os.cpu_count()} cores); "
              "times are not reliable")
    if error is None and counts.graphs == 0:
        print("note: coil compiled no graph, so the model ran eagerly; the compile log says why")

    report_path = None
    try:
        from coil.trace import report

        report_path = report.write_report(trace_dir, report_dir)
    except Exception as e:
        print(f"(HTML report not written: {measure.short_error(e)})")
    print(f"\ncompile log: {trace_dir}")
    if report_path:
        print(f"report:      {report_path}")
    if error is not None:
        print("\n" + tb, file=sys.stderr)
    return 0 if ok else 1
