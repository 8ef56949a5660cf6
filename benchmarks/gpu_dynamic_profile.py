"""Why a dynamic graph runs slower than the static one: a model's forward, kernel by kernel.

    python benchmarks/gpu_dynamic_profile.py --out $OUT          # the H200 (< 3 minutes)
    python benchmarks/gpu_dynamic_profile.py --device cpu --size small --out /tmp/p

transformers GPT-2 (``coil bench``'s configs, bf16 on CUDA, batch 4, eval, no_grad) at
``--length`` tokens, compiled by coil twice: ``dynamic=False`` (one static graph) and
``dynamic=True`` (warmed at ``--warm-length`` first, so the call at ``--length`` runs the
symbolic graph). For each: ms per forward (median of synchronized calls), the GPU time
per forward (sum of the kernels' device time in a ``torch.profiler`` window), the host
time, kernels per forward, and the top kernels by device time; then the kernels whose
total time differs most between the two (matched by name with the trailing ``_<n>``
index dropped). The report goes to ``<out>/dynamic_profile.txt`` and stdout.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import time

import torch


def _forward_ms(f, ids, dev, n=20) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f(input_ids=ids)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def _kernels(f, ids, dev, steps=5) -> collections.Counter:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            f(input_ids=ids)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    per = collections.Counter()
    for e in prof.events():
        if dev.type == "cuda" and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if dev.type != "cuda" and e.device_type != torch.autograd.DeviceType.CPU:
            continue
        t = getattr(e, "device_time", None) if dev.type == "cuda" else e.self_cpu_time_total
        per[e.name] += (t or 0.0) / steps
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", default="full", choices=["full", "small"])
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--length", type=int, default=96)
    ap.add_argument("--warm-length", type=int, default=64)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    import coil
    from coil.bench.dynamic import build
    from coil.bench.models import _ids

    dev = torch.device(a.device)
    m = build(a.model, dev, a.size)
    ids = _ids(4, a.length, m.config.vocab_size, dev)
    lines = [f"{a.model} ({a.size}) on {dev}, batch 4, L={a.length}, torch {torch.__version__}"]
    per = {}
    with torch.no_grad():
        ref = m(input_ids=ids).logits.float()
        for name, dyn in (("static", False), ("dynamic", True)):
            f = coil.compile(m, dynamic=dyn)
            t0 = time.perf_counter()
            if dyn:
                f(input_ids=_ids(4, a.warm_length, m.config.vocab_size, dev))
            out = f(input_ids=ids).logits.float()
            compile_s = time.perf_counter() - t0
            ms = _forward_ms(f, ids, dev)
            k = per[name] = _kernels(f, ids, dev)
            gpu = sum(k.values()) / 1e3
            lines.append(f"\n[{name}] first calls {compile_s:.1f} s, max |out - eager| "
                         f"{(out - ref).abs().max().item():.3g}; {ms:.3f} ms per forward, "
                         f"kernel time {gpu:.3f} ms in {len(k)} distinct kernels")
            for kname, us in k.most_common(12):
                lines.append(f"    {us:9.1f} us  {kname[:120]}")
            print("\n".join(lines[-13:]), flush=True)

    def norm(counter):
        c = collections.Counter()
        for kname, us in counter.items():
            c[re.sub(r"_\d+$", "", kname)] += us
        return c
    s, d = norm(per["static"]), norm(per["dynamic"])
    diffs = sorted(set(s) | set(d), key=lambda n: -abs(d[n] - s[n]))[:15]
    lines.append("\nlargest differences (us per forward, static -> dynamic):")
    for n in diffs:
        lines.append(f"    {s[n]:9.1f} -> {d[n]:9.1f}  {n[:120]}")
    print("\n".join(lines[-16:]))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "dynamic_profile.txt"), "w") as fh:
        fh.write("\n".join(lines))


if __name__ == "__main__":
    main()
