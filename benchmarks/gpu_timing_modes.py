"""Why a broad-suite row's bench timing differs from a plain loop's: one model, one mode, timed several ways.

    python benchmarks/gpu_timing_modes.py --model b_marian --mode bf16     # the H200 / H100

Compiles eager, coil and torch.compile steps exactly as ``coil bench --paired`` does (``suite.prepare_row``), then
times every step four ways, printing ms per step (median) and the CUDA allocator's device mallocs and frees
(``num_device_alloc`` / ``num_device_free``) made meanwhile:

  bench      ``suite.time_steps``: interleaved rounds, each call alone between CUDA events, the cyclic
             garbage collector paused (what the suite reports);
  gc-on      the same rounds with the collector running;
  collect    the collector paused, ``gc.collect()`` before each timed call (outside the timer);
  loop       20 back-to-back steps per compiler, synchronized once (host and device overlap).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch


def _stats():
    if not torch.cuda.is_available():
        return 0, 0
    s = torch.cuda.memory_stats()
    return s.get("num_device_alloc", 0), s.get("num_device_free", 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", default="bf16")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (small sizes: a check of this script)")
    a = ap.parse_args()
    from coil.bench import measure, suite
    from coil.bench.broad import BROAD_MODELS
    from coil.bench.compilers import COMPILERS

    device = torch.device(a.device)
    built = BROAD_MODELS[a.model].build(device, "full" if device.type == "cuda" else "small")
    eager_step = suite._step_on_copy(built.module, built.args, built.kwargs, a.mode, device)
    eager_out = suite._detach(eager_step())
    preps = []
    for name in ("coil", "inductor"):
        row = suite.Row(a.model, a.mode, device.type, name, paired=True)
        t = time.perf_counter()
        preps.append(suite.prepare_row(COMPILERS[name], built.module, built.args, built.kwargs, a.mode, device,
                                       eager_out, eager_out, row))
        print(f"{name}: compiled and first call in {time.perf_counter() - t:.1f} s, status {row.status}")
    steps = {"eager": eager_step, **{p.compiler.name: p.step for p in preps}}
    for _ in range(3):
        for fn in steps.values():
            fn()
    measure.synchronize(device)

    def rounds(collect_each: bool, gc_on: bool):
        out = {k: [] for k in steps}
        was = gc.isenabled()
        (gc.enable if gc_on else gc.disable)()
        a0 = _stats()
        try:
            for r in range(a.rounds):
                names = list(steps)
                names = names[r % len(names):] + names[:r % len(names)]
                for k in names:
                    if collect_each:
                        gc.collect()
                    out[k].append(measure.time_once(steps[k], device) * 1e3)
        finally:
            (gc.enable if was else gc.disable)()
        a1 = _stats()
        return {k: statistics.median(v) for k, v in out.items()}, (a1[0] - a0[0], a1[1] - a0[1])

    lines = [f"{a.model} ({built.config}), mode {a.mode}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}"]
    suite_opts = suite.BenchOptions(repeat=a.rounds, warmup=0, paired=True)
    a0 = _stats()
    suite.time_steps(eager_step, preps, suite_opts, device)
    a1 = _stats()
    bench = {"eager": preps[0].row.eager_ms, **{p.compiler.name: p.row.compiled_ms for p in preps}}
    lines.append(f"bench    {_fmt(bench)}   device mallocs/frees {a1[0] - a0[0]}/{a1[1] - a0[1]}")
    for label, collect_each, gc_on in (("gc-on", False, True), ("collect", True, False), ("bench-2", False, False)):
        ms, (al, fr) = rounds(collect_each, gc_on)
        lines.append(f"{label:8} {_fmt(ms)}   device mallocs/frees {al}/{fr}")
    loop = {}
    for k, fn in steps.items():
        measure.synchronize(device)
        t = time.perf_counter()
        for _ in range(20):
            fn()
        measure.synchronize(device)
        loop[k] = (time.perf_counter() - t) / 20 * 1e3
    lines.append(f"loop     {_fmt(loop)}")
    print("\n".join(lines))
    return 0


def _fmt(ms: dict) -> str:
    return "  ".join(f"{k} {v:7.2f} ms" for k, v in ms.items()) + \
        f"  (coil / torch.compile speed {ms['inductor'] / ms['coil']:.2f})"


if __name__ == "__main__":
    raise SystemExit(main())
