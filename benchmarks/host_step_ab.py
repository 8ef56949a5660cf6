"""Where one compiled step's host time goes: for a broad-suite model and mode, coil's step
timed as the suite times it (CUDA events around one synchronized call, median of ``--iters``),
as throughput (``--iters`` calls back to back, one synchronize), and under cProfile (the
``--top`` functions by own time, µs per step). Run it from two trees to compare them:

    python benchmarks/host_step_ab.py --model b_whisper --mode bf16            # the GPU machine
    (cd old && PYTHONPATH=$PWD python ../benchmarks/host_step_ab.py --model b_whisper --mode bf16)

Prints text; the tree is the one ``coil`` is imported from.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", default="bf16")
    ap.add_argument("--size", default=None)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sync-debug", action="store_true",
                    help="report each host-device synchronization in coil's step, with its Python stack")
    a = ap.parse_args()
    import coil
    from coil.bench import measure
    from coil.bench.broad import BROAD_MODELS
    from coil.bench.suite import _cast_inputs, _mode_dtype, _prepared_copy, _trainable, make_step

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    built = BROAD_MODELS[a.model].build(dev, a.size or ("full" if dev.type == "cuda" else "small"))
    dt = _mode_dtype(a.mode)
    print(f"coil from {os.path.dirname(coil.__file__)}; {a.model} {built.config} {a.mode}")
    for name in ("eager", "coil"):
        m = _prepared_copy(built.module, a.mode, dt)
        fn = coil.compile(m) if name == "coil" else m
        step = make_step(fn, _trainable(m), _cast_inputs(built.args, dt), _cast_inputs(built.kwargs, dt),
                         a.mode, dev)
        for _ in range(4):
            step()
        events = statistics.median(measure.time_once(step, dev) for _ in range(a.iters)) * 1e3
        measure.synchronize(dev)
        t = time.perf_counter()
        for _ in range(a.iters):
            step()
        measure.synchronize(dev)
        thr = (time.perf_counter() - t) / a.iters * 1e3
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.iters):
            step()
        measure.synchronize(dev)
        prof.disable()
        st = pstats.Stats(prof)
        own = sum(v[2] for v in st.stats.values()) / a.iters * 1e6
        print(f"\n== {name}: events {events:.2f} ms/step, throughput {thr:.2f} ms/step, "
              f"cProfile own time {own:.0f} us/step")
        if name == "coil" and a.sync_debug and dev.type == "cuda":
            import traceback
            import warnings
            seen = set()

            def show(msg, *args, **kwargs):
                stack = "".join(traceback.format_stack(limit=8)[:-2])
                if stack not in seen:
                    seen.add(stack)
                    print(f"  sync: {msg}\n{stack}")
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            step()
            torch.cuda.set_sync_debug_mode(0)
            print(f"  {len(seen)} distinct synchronizing call sites in one step")
        if name == "coil":
            rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:a.top]
            for (file, line, func), (cc, nc, tt, ct, _) in rows:
                print(f"  {tt / a.iters * 1e6:8.1f} us {nc / a.iters:7.1f}x  "
                      f"{os.path.basename(file)}:{line} {func}")


if __name__ == "__main__":
    main()
