"""How far apart two equal compiled graphs read in ``coil bench --mode dynamic``'s timing.

    python benchmarks/gpu_dynamic_noise.py --out $OUT            # the H200 (about 3 minutes)

The bench's steady state per length is the median of ``repeat`` interleaved samples of
five calls (``coil.bench.dynamic``). Its GPT-2 and LLaMA calls are host-bound (about 1 ms of
kernels in 2-4 ms per call), and some lengths read a dynamic graph 10-16% off the static
one in one run and not in the next. This script measures that spread directly: per length,
``static-a`` and ``static-b`` (two ``coil.compile(model, dynamic=False)`` copies at that
length, an A/A pair) and ``dynamic`` (one ``dynamic=True`` copy, warmed at the first
length) are timed side by side in ``--trials`` independent measurements of the bench's
kind (collected first, then ``measure.time_interleaved``: the collector paused while timing). Printed per
length: each trial's ``static-b / static-a`` and ``dynamic / static-a`` ratios of medians
(and of minima). The A/A ratio is the measurement's own spread.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics

import torch

from coil.bench import measure
from coil.bench.dynamic import CALLS_PER_SAMPLE, _calls, build
from coil.bench.models import _ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--lengths", default="64,96,256,333")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    import coil

    dev = torch.device("cuda")
    model = build(a.model, dev, "full")
    lengths = [int(x) for x in a.lengths.split(",")]
    vocab = model.config.vocab_size
    dyn = coil.compile(model, dynamic=True)
    lines = [f"{a.model}, batch 4, bf16, torch {torch.__version__}; {a.trials} trials of "
             f"{a.repeat} interleaved rounds x {CALLS_PER_SAMPLE} calls, median per call"]
    with torch.no_grad():
        for L in lengths:
            ids = _ids(4, L, vocab, dev)
            fns = {"static-a": coil.compile(model, dynamic=False, options={"recompile_limit": 64}),
                   "static-b": coil.compile(model, dynamic=False, options={"recompile_limit": 64}),
                   "dynamic": dyn}
            for f in fns.values():
                for _ in range(3):
                    f(input_ids=ids)
            torch.cuda.synchronize()
            calls = [_calls(f, ids, CALLS_PER_SAMPLE) for f in fns.values()]
            row = []
            for _ in range(a.trials):
                gc.collect()  # as the bench does before a length's rounds
                ts = measure.time_interleaved(calls, a.repeat, lambda f: measure.time_once(f, dev),
                                              rotate=True)
                ms = [statistics.median(t) / CALLS_PER_SAMPLE * 1e3 for t in ts]
                mn = [min(t) / CALLS_PER_SAMPLE * 1e3 for t in ts]
                row.append(f"a {ms[0]:.3f} ms: b/a {ms[1] / ms[0]:.3f} dyn/a {ms[2] / ms[0]:.3f}"
                           f" (min: b/a {mn[1] / mn[0]:.3f} dyn/a {mn[2] / mn[0]:.3f})")
            lines.append(f"L={L}: " + " | ".join(row))
            print(lines[-1], flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"dynamic_noise_{a.model}.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
