"""Why a dynamic graph runs slower than the static one: a model's forward, kernel by kernel.

    python benchmarks/gpu_dynamic_profile.py --out $OUT          # the H200 (< 3 minutes)
    python benchmarks/gpu_dynamic_profile.py --device cpu --size small --out /tmp/p

transformers GPT-2 (``coil bench``'s configs, bf16 on CUDA, batch 4, eval, no_grad) at
``--length`` tokens, compiled by coil twice: ``dynamic=False`` (one static graph) and
``dynamic=True`` (warmed at ``--warm-length`` first, so the call at ``--length`` runs the
symbolic graph). For each: ms per forward (median of synchronized calls), the GPU time
per forward (sum of the kernels' device time in a ``torch.profiler`` window), the host
time until the call returns, the synchronizing CUDA calls of one forward, kernels per
forward, and the top kernels by device time; then the kernels whose
total time differs most between the two (matched by name with the trailing ``_<n>``
index dropped). The report goes to ``<out>/dynamic_profile.txt`` and stdout.
``--profile`` adds a cProfile of both forwards (top functions, largest differences).

``--host`` compares the host time alone on CPU (no GPU needed; ``TRITON_INTERPRET=1``
is set): the model in fp32 with coil's Triton kernels replaced by no-ops after their
launcher's own Python (as benchmarks/gpu_dynamic_overhead.py does), so the wrapper,
launchers, guards and extern calls are what is timed. ``--width`` shrinks GPT-2's
width and vocabulary (default 48 and 256 with ``--host``; layers and heads as
``--size``) so that ATen's matmuls do not hide the host time; their time is reported
apart (cProfile's ATen built-ins)::

    python benchmarks/gpu_dynamic_profile.py --host --size full --length 24 --warm-length 16 --out /tmp/p
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
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


def _profile(f, ids, n=30) -> pstats.Stats:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        f(input_ids=ids)
    pr.disable()
    return pstats.Stats(pr, stream=io.StringIO())


def _profile_lines(stats: dict, n: int, top: int = 15) -> list:
    """Top functions by self time per call of each profile, then the largest
    static -> dynamic differences (µs per forward)."""
    per: dict = {}
    for k, s in stats.items():  # kernels' launchers (named by their buffers) as one row
        d = per[k] = collections.Counter()
        for (fn, ln, name), st in s.stats.items():
            d[re.sub(r"<coil launcher .*>:1", "<coil launchers>", f"{os.path.basename(fn)}:{ln}({name})")] \
                += st[2] / n * 1e6
    out = []
    for k, d in per.items():
        out.append(f"\n[{k}] cProfile, self time, us per forward (total {sum(d.values()):.0f}):")
        out += [f"    {us:9.1f}  {name[:110]}" for name, us in sorted(d.items(), key=lambda x: -x[1])[:top]]
    s_, d_ = per["static"], per["dynamic"]
    out.append("\nlargest self-time differences (us per forward, static -> dynamic):")
    for name in sorted(set(s_) | set(d_), key=lambda x: -abs(d_.get(x, 0) - s_.get(x, 0)))[:top]:
        out.append(f"    {s_.get(name, 0):9.1f} -> {d_.get(name, 0):9.1f}  {name[:110]}")
    return out


def _noop_triton_kernels() -> None:
    """Coil's Triton kernels on CPU do nothing after their launcher's own Python."""
    import coil.runtime.triton_dynamic as td
    import coil.runtime.triton_runtime as tr
    td.DynamicTritonLauncher._first_launch = lambda self, *_: (lambda *args: None)
    choose = tr.TritonLauncher._choose

    def noop_choose(self, cfg):
        choose(self, cfg)
        self._call = lambda *args: None
    tr.TritonLauncher._choose = noop_choose


def host_main(a) -> None:
    """``--host``: static vs dynamic host time per forward on CPU (see module docstring)."""
    import transformers
    import coil
    import coil.codegen as cg
    from coil.bench.dynamic import MODELS
    from coil.config import config

    config.cpu_backend = "triton"
    _noop_triton_kernels()
    torch.set_num_threads(1)
    cls, conf_cls, cfgs = MODELS[a.model]
    cfg = dict(cfgs[a.size])
    width = a.width or 48
    cfg.update({"n_embd": width, "vocab_size": 256} if "n_embd" in cfg else
               {"hidden_size": width, "intermediate_size": 4 * width, "vocab_size": 256})
    torch.manual_seed(0)
    m = getattr(transformers, cls)(getattr(transformers, conf_cls)(**cfg)).eval()
    graphs: list = []
    orig = cg.compile_aten_graph

    def spy(gm, ex, device):
        graphs.append(orig(gm, ex, device))
        return graphs[-1]
    cg.compile_aten_graph = spy
    ids = torch.randint(0, 256, (4, a.length), generator=torch.Generator().manual_seed(1))
    lines = [f"{a.model} ({a.size} layers, width {width}, fp32) on CPU, Triton kernels no-ops, "
             f"batch 4, L={a.length}: host time, torch {torch.__version__}"]
    fs = {}
    with torch.no_grad():
        for name, dyn in (("static", False), ("dynamic", True)):
            f = fs[name] = coil.compile(m, dynamic=dyn)
            n0 = len(graphs)
            if dyn:
                f(input_ids=ids[:, :a.warm_length].contiguous())
            f(input_ids=ids)
            g = graphs[-1]
            lines.append(f"[{name}] {len(graphs) - n0} graph(s); launches per forward: "
                         f"{len(getattr(g, 'kernels', []))} kernels, "
                         f"{g.source.count('= extern')} extern calls")
        best = dict.fromkeys(fs, float("inf"))
        for _ in range(a.rounds):  # interleaved: the CPU box is shared
            for name, f in fs.items():
                t0 = time.perf_counter()
                for _ in range(10):
                    f(input_ids=ids)
                best[name] = min(best[name], (time.perf_counter() - t0) / 10 * 1e3)
        stats = {name: _profile(f, ids) for name, f in fs.items()}
    aten, rest = {}, {}
    for k, st in stats.items():  # ATen's built-ins (the kernels' work) vs the rest, per forward
        own = [(fname.startswith("<built-in method torch"), v[2]) for (_, _, fname), v in st.stats.items()]
        aten[k] = sum(t for is_aten, t in own if is_aten) / 30 * 1e3
        rest[k] = sum(t for is_aten, t in own if not is_aten) / 30 * 1e3
    for name in fs:
        lines.append(f"[{name}] {best[name]:.3f} ms per forward (best of {a.rounds} x 10); under "
                     f"cProfile: ATen built-ins {aten[name]:.3f} ms, the rest {rest[name]:.3f} ms")
    lines.append(f"dynamic / static, the rest (host Python) under cProfile: {rest['dynamic'] / rest['static']:.2f}")
    lines += _profile_lines(stats, 30)
    print("\n".join(lines))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "dynamic_host_profile.txt"), "w") as fh:
        fh.write("\n".join(lines))


def _host_and_syncs(f, ids, dev) -> tuple:
    """Host milliseconds from call to return (best of 20; the GPU may still run after it:
    a forward whose host time nears its wall time waits for the GPU somewhere) and the
    messages of the synchronizing CUDA calls one forward makes (sync debug mode)."""
    import warnings
    best = float("inf")
    for _ in range(20):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        f(input_ids=ids)
        best = min(best, time.perf_counter() - t0)
    if dev.type != "cuda":
        return best * 1e3, []
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            f(input_ids=ids)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return best * 1e3, [str(w.message) for w in caught if "synchroniz" in str(w.message)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", default="full", choices=["full", "small"])
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--length", type=int, default=96)
    ap.add_argument("--warm-length", type=int, default=64)
    ap.add_argument("--out", default=".")
    ap.add_argument("--profile", action="store_true", help="cProfile both forwards")
    ap.add_argument("--host", action="store_true", help="CPU host time alone (no-op kernels)")
    ap.add_argument("--width", type=int, default=0, help="--host: the model's width (48)")
    ap.add_argument("--rounds", type=int, default=10, help="--host: timing rounds")
    a = ap.parse_args()
    if a.host:
        os.environ["TRITON_INTERPRET"] = "1"
        return host_main(a)
    import coil
    from coil.bench.dynamic import build
    from coil.bench.models import _ids

    dev = torch.device(a.device)
    m = build(a.model, dev, a.size)
    ids = _ids(4, a.length, m.config.vocab_size, dev)
    lines = [f"{a.model} ({a.size}) on {dev}, batch 4, L={a.length}, torch {torch.__version__}"]
    per, stats = {}, {}
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
            host_ms, syncs = _host_and_syncs(f, ids, dev)
            k = per[name] = _kernels(f, ids, dev)
            gpu = sum(k.values()) / 1e3
            lines.append(f"\n[{name}] first calls {compile_s:.1f} s, max |out - eager| "
                         f"{(out - ref).abs().max().item():.3g}; {ms:.3f} ms per forward, "
                         f"kernel time {gpu:.3f} ms in {len(k)} distinct kernels; host "
                         f"{host_ms:.3f} ms until the call returns, {len(syncs)} host syncs"
                         + (f" (first: {syncs[0][:200]})" if syncs else ""))
            for kname, us in k.most_common(12):
                lines.append(f"    {us:9.1f} us  {kname[:120]}")
            print("\n".join(lines[-13:]), flush=True)
            if a.profile:
                stats[name] = _profile(f, ids)

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
    if a.profile:
        prof = _profile_lines(stats, 30)
        lines += prof
        print("\n".join(prof))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "dynamic_profile.txt"), "w") as fh:
        fh.write("\n".join(lines))


if __name__ == "__main__":
    main()
