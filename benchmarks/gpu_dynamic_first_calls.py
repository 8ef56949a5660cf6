"""Where a dynamic graph's first call at a new length spends its time (issue 17).

    python benchmarks/gpu_dynamic_first_calls.py --model llama --out $OUT   # the H200, ~2 min

Compiles ``coil bench --mode dynamic``'s model (bf16, batch 4, random weights) with
``coil.compile`` (``dynamic=None``) and calls it at each ``--lengths`` value twice with
the compile log on. Per length: the first call's seconds, the second's, and the compile
log's events during the first call, counted by kind, with the kernels named by
``dynamic_launch_bucket`` (a new size bucket), ``autotune`` (candidates timed) and
``compile_pool_claim`` events, so a length that costs more than a launch shows why
(``--profile``: and a cProfile of each first call from the third length on).
The report goes to ``<out>/dynamic_first_calls.txt`` and stdout.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import collections
import glob
import json
import os
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama", choices=["gpt2", "llama"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 96, 128, 160, 200, 333, 400, 512])
    ap.add_argument("--size", default="full", choices=["full", "small"])
    ap.add_argument("--out", default=".")
    ap.add_argument("--profile", action="store_true",
                    help="a cProfile of each first call from the third length on")
    ap.add_argument("--static-at", type=int, nargs="*", default=[],
                    help="lengths at which to time the dynamic graph against a static compile")
    args = ap.parse_args()
    trace_dir = tempfile.mkdtemp(prefix="coil_first_calls_")
    from coil import trace
    trace.set_dir(trace_dir)
    import coil
    from coil.bench.dynamic import BATCH, build
    from coil.bench.models import _ids
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build(args.model, device, args.size)
    fn = coil.compile(model)
    lines = [f"{args.model} ({args.size}) on {device}, batch {BATCH[args.size]}"]
    spans, profiles = [], {}
    with torch.no_grad():
        for L in args.lengths:
            ids = _ids(BATCH[args.size], L, model.config.vocab_size, device)
            torch.cuda.synchronize() if device.type == "cuda" else None
            prof = cProfile.Profile() if args.profile and len(spans) >= 2 else None
            t0 = time.time()
            if prof:
                prof.enable()
            fn(input_ids=ids)
            torch.cuda.synchronize() if device.type == "cuda" else None
            if prof:
                prof.disable()
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
                profiles[L] = buf.getvalue()
            t1 = time.time()
            fn(input_ids=ids)
            torch.cuda.synchronize() if device.type == "cuda" else None
            spans.append((L, t0, t1, time.time() - t1))
    events = []
    for f in glob.glob(os.path.join(trace_dir, "*.jsonl")):
        with open(f) as fh:
            events += [json.loads(x) for x in fh]
    for L, t0, t1, second in spans:
        during = [e for e in events if t0 <= e["ts"] <= t1 and e["event"] != "artifact"]
        kinds = collections.Counter(e["event"] for e in during)
        lines.append(f"\nL={L}: first call {t1 - t0:.3f} s, second {second * 1e3:.2f} ms; "
                     f"{len(during)} events: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common(12)))
        for e in during:
            if e["event"] in ("dynamic_launch_bucket", "autotune", "compile_pool_claim", "recompile",
                              "triton_compile", "kernel_compile") or (e.get("duration_ms") or 0) > 50:
                detail = {k: v for k, v in e.items() if k not in ("ts", "pid", "compile_id", "event")}
                lines.append(f"  +{e['ts'] - t0:7.3f} s {e['event']}: {json.dumps(detail)[:220]}")
        if L in profiles:
            lines.append("\n".join(x for x in profiles[L].splitlines() if x.strip())[:6000])
    for L in args.static_at:
        lines.append(_against_static(fn, model, L, device, BATCH[args.size], _ids))
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dynamic_first_calls.txt"), "w") as fh:
        fh.write(text + "\n")


def _against_static(fn, model, L: int, device, batch: int, make_ids) -> str:
    """ms per call of the dynamic graph and of a ``dynamic=False`` compile at length ``L``:
    median over 40 interleaved rounds of 5 back-to-back calls (CUDA events)."""
    import coil
    from coil.bench import measure
    static = coil.compile(model, dynamic=False)
    ids = make_ids(batch, L, model.config.vocab_size, device)
    with torch.no_grad():
        for f in (fn, static):
            f(input_ids=ids)
            f(input_ids=ids)

        def five(f):
            def run():
                for _ in range(5):
                    f(input_ids=ids)
            return run
        ts = measure.time_interleaved([five(fn), five(static)], 40,
                                      lambda g: measure.time_once(g, device), rotate=True)
    med = [sorted(t)[len(t) // 2] / 5 * 1e3 for t in ts]
    return f"\nL={L}: dynamic {med[0]:.3f} ms, static {med[1]:.3f} ms per call ({med[0] / med[1]:.3f}x)"


if __name__ == "__main__":
    main()
