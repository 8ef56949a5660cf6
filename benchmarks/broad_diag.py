"""Why a broad-suite row is slow or fails: per ``model:mode`` (``coil.bench.broad``, modes
``bf16`` / ``train`` as ``coil bench`` runs them), coil's first step under the compile log,
then its graph breaks (reason, user stack), eager-fallback and codegen-fallback events, the
full traceback of an error, and eager vs coil step times (median of ``--iters``).

    python benchmarks/broad_diag.py b_mixtral_moe:bf16 b_wav2vec2:train --out $OUT [--profile]
"""
from __future__ import annotations

import argparse
import collections
import os
import time
import traceback

import torch


def _median_ms(step, iters: int, device) -> float:
    ts = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[len(ts) // 2]


def _profile(step, n: int = 5) -> list:
    """cProfile of ``n`` steps: the top functions by own time, then coil's by cumulative time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumtime").print_stats("coil", 25)
    return [f"cProfile of {n} coil steps:", buf.getvalue()]


def diagnose(name: str, mode: str, out: str, iters: int, profile: bool = False) -> str:
    import coil
    from coil import trace
    from coil.bench import suite
    from coil.bench.broad import BROAD_MODELS
    from coil.trace.report import read_log

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log_dir = os.path.join(out, f"log_{name}_{mode}")
    trace.set_dir(log_dir)
    coil.reset()
    built = BROAD_MODELS[name].build(dev, "full" if dev.type == "cuda" else "small")
    dtype = suite._mode_dtype(mode)
    lines = [f"##### {name} {mode}: {built.config}"]
    steps = {}
    for which in ("eager", "coil"):
        m = suite._prepared_copy(built.module, mode, dtype)
        fn = coil.compile(m) if which == "coil" else m
        steps[which] = suite.make_step(fn, suite._trainable(m), suite._cast_inputs(built.args, dtype),
                                       suite._cast_inputs(built.kwargs, dtype), mode, dev)
    t0 = time.perf_counter()
    try:
        steps["coil"]()
        lines.append(f"first coil step {time.perf_counter() - t0:.1f} s")
    except Exception:
        tb = traceback.format_exc()     # the inner error's own frames come first
        lines.append("coil ERROR:\n" + (tb if len(tb) < 12000 else tb[:9000] + "\n...\n" + tb[-3000:]))
        steps.pop("coil")
    log = read_log(log_dir)
    counts = collections.Counter()
    for c in log.compiles:
        for r in c.events:
            ev = r.get("event")
            counts[ev] += 1
            if ev == "graph_break":
                lines.append(f"[{c.compile_id}] graph break in {r.get('frame')}: {r.get('reason')}")
                lines += ["    " + s for s in (r.get("user_stack") or [])[-4:]]
            elif "fallback" in str(ev) or "eager" in str(ev):
                lines.append(f"[{c.compile_id}] {ev}: " + str({k: v for k, v in r.items()
                                                              if k not in ("ts", "pid", "compile_id")})[:600])
    lines.append(f"compiles {len(log.compiles)}; events: " + ", ".join(
        f"{k} x{n}" for k, n in counts.most_common(25)))
    for which, step in steps.items():
        step()
        lines.append(f"{which}: {_median_ms(step, iters, dev):.2f} ms")
    if profile and "coil" in steps:
        lines += _profile(steps["coil"])
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", help="model:mode, e.g. b_wav2vec2:train")
    ap.add_argument("--out", default=".")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="add a cProfile of 5 coil steps")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for row in a.rows:
        name, mode = row.split(":")
        try:
            text = diagnose(name, mode, a.out, a.iters, a.profile)
        except Exception:
            text = f"##### {row}: harness error\n{traceback.format_exc()[-3000:]}"
        print(text, flush=True)
        with open(os.path.join(a.out, "broad_diag.txt"), "a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
