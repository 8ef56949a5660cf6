"""Where a reduce-overhead bench workload's time goes (by default the training step): coil vs
torch.compile, both ``mode="reduce-overhead"``, and eager, kernel by kernel and byte by byte.

    python benchmarks/gpu_ro_train_profile.py --out $OUT                 # the H200, < 3 minutes
    python benchmarks/gpu_ro_train_profile.py --device cpu --out /tmp/p  # a smoke test on CPU
    python benchmarks/gpu_ro_train_profile.py --out $OUT --workload gpt2_decode

``--workload`` names any workload of ``coil bench --mode reduce-overhead`` (a step is then
one call of that workload's step: a whole decoding loop for ``gpt2_decode``); the report goes
to ``<out>/ro_<workload>_profile.txt``, and for coil's top kernels it names the generated
kernel each was compiled from, with its header (kind, sizes, fused buffers) and its config.
The default workload is ``train_gpt`` of ``coil bench --mode reduce-overhead``
(coil/bench/reduce_overhead.py: SmallGPT 6 layers, d=512, 8x128, the loss inside the
compiled module under bf16 autocast, backward, eager AdamW; tiny on CPU). Each compiler
runs alone, one after the other (the previous copy freed first), and reports:

- compile s (the first step) and ms per step (median of ``--steps`` CUDA-event timed steps);
- memory in the bench's definition (docs/bench.md: steady-state ``max_memory_reserved``
  beyond the base before compiling) and beside it: the steady peak allocated, reserved
  and allocated after the warm-up, reserved once ``empty_cache`` dropped the default
  pool's unused cache, and per allocator pool (``torch.cuda.memory_snapshot``): the default pool
  and each CUDA graph pool made by this copy, reserved and allocated bytes;
- coil: its CUDA graph tree (nodes with kind, bytes of the outputs each owns, bytes of
  its input placeholders, copied and in-place inputs), the ``cudagraph_*`` events of its
  compile log, and the compile's top stages by self time;
- a ``torch.profiler`` window of 5 steps: GPU ms per step (the kernels' device time),
  kernels per step, wall ms per step, and the top 15 kernels by device time with their
  calls per step.

The report goes to ``<out>/ro_train_profile.txt`` and stdout. On CPU the kernel tables
list CPU ops and memory is not measured (a smoke test of the script, not a measurement).
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from coil.bench import measure, reduce_overhead as ro  # noqa: E402

GB = 2 ** 30


class Report:
    def __init__(self, path: str):
        self.f = open(path, "w")

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def pools(dev) -> dict:
    """``pool id -> [reserved bytes, allocated bytes]`` over the device's segments."""
    out: dict = {}
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", dev.index or 0) != (dev.index or 0):
            continue
        key = str(tuple(seg.get("segment_pool_id", (0, 0))))
        p = out.setdefault(key, [0, 0])
        p[0] += seg["total_size"]
        p[1] += seg["allocated_size"]
    return out


def pool_detail(rep: Report, dev, before: dict) -> None:
    """Segments and the largest active blocks of each pool this copy made or grew."""
    segs: dict = {}
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", dev.index or 0) == (dev.index or 0):
            segs.setdefault(str(tuple(seg.get("segment_pool_id", (0, 0)))), []).append(seg)
    for key, ss in sorted(segs.items()):
        if key in before and key == "(0, 0)" and not ss:
            continue
        sizes = sorted((s["total_size"] >> 20 for s in ss), reverse=True)
        blocks = sorted((b["size"] for s in ss for b in s["blocks"] if b["state"] == "active_allocated"),
                        reverse=True)
        rep(f"    pool {key}: {len(ss)} segments (MiB) {sizes[:24]}; {len(blocks)} active blocks, "
            f"{sum(blocks) / 2**20:.1f} MiB, largest (KiB) {[b >> 10 for b in blocks[:16]]}")


def time_steps(step, dev, n: int) -> float:
    """Median ms of ``n`` steps."""
    return statistics.median(measure.time_once(step, dev) for _ in range(n)) * 1e3


def profile(step, dev, steps: int = 5) -> tuple[dict, float]:
    """``({kernel: [total µs, calls]}, wall ms per step)`` over ``steps`` steps (CPU ops
    by self time on CPU)."""
    from torch.profiler import ProfilerActivity, profile as prof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    sync(dev)
    with prof(activities=acts) as p:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync(dev)
        wall = (time.perf_counter() - t0) * 1e3 / steps
    kernels: dict = {}
    for e in p.events():
        dtype = getattr(e, "device_type", None)
        on_device = dtype is not None and dtype.name == "CUDA"
        if dev.type == "cuda" and on_device:
            t = getattr(e, "device_time", None)
            t = getattr(e, "cuda_time", 0.0) if t is None else t
        elif dev.type != "cuda" and not on_device and e.name.startswith("aten::"):
            t = e.self_cpu_time_total
        else:
            continue
        k = kernels.setdefault(e.name, [0.0, 0])
        k[0] += t
        k[1] += 1
    return kernels, wall


def coil_tree(rep: Report, dev) -> None:
    from coil.runtime import cudagraph_trees

    tree = cudagraph_trees._TREES.get(dev.index or 0)
    if tree is None:
        rep("  coil tree: none (no CUDA graphs recorded)")
        return
    rep(f"  coil tree: {tree.nodes} nodes, {tree.replays} replays, {tree.steps} steps")
    total = 0
    for n in tree.all_nodes:
        owned = sum(nb for _, nb, _ in n.plan.slots)
        ph = sum(p.numel() * p.element_size() for p in n.placeholders)
        total += owned + ph
        saved = f", saved outputs {n.fn.saved}" if n.fn.saved else ""
        if n.consumes:
            saved += ", reuses the memory of " + ", ".join(
                f"{len(s)} saved storages of {f.fn.name}" for f, s in n.consumes.items())
        rep(f"    {n.fn.name:14s} {n.fn.kind:9s} depth {n.depth}: owns {owned / 2**20:8.1f} MiB of "
            f"outputs ({len(n.plan.slots)} storages), placeholders {ph / 2**20:6.1f} MiB "
            f"({len(n.copied)} copied inputs), {len(n.inplace)} in-place inputs{saved}")
    rep(f"    outputs + placeholders owned by the tree: {total / GB:.3f} GB")


def coil_log(rep: Report, trace_dir: str, top_kernels=()) -> None:
    records = []
    for f in os.listdir(trace_dir):
        if f.endswith(".jsonl"):
            with open(os.path.join(trace_dir, f)) as fh:
                records += [json.loads(line) for line in fh]
    for r in records:
        if r["event"].startswith("cudagraph_") and r["event"] != "cudagraph_record":
            rep(f"    {r['event']}: " + json.dumps({k: v for k, v in r.items() if k not in
                                                    ("ts", "pid", "event", "duration_ms")})[:300])
    selfs: dict = {}
    top = 0.0
    for r in records:
        if r["event"] != "stage":
            continue
        ms = float(r.get("duration_ms") or 0.0)
        selfs[r["stage"]] = selfs.get(r["stage"], 0.0) + ms
        if r.get("parent"):
            selfs[r["parent"]] = selfs.get(r["parent"], 0.0) - ms
        else:
            top += ms
    kernels = sum(1 for r in records if r["event"] == "artifact" and r.get("name", "").startswith("kernel "))
    tunes = [r for r in records if r["event"] == "autotune"]
    # what each top coil kernel is: the generated kernel it was compiled from, its header
    heads = {r["name"][7:]: [ln for ln in r.get("text", "").splitlines() if ln.startswith("# ")][:2]
             for r in records if r["event"] == "artifact" and r.get("name", "").startswith("kernel ")}
    named = {r.get("compiled_name"): r for r in tunes}
    for k in top_kernels:
        r = named.get(k)
        if r is not None:
            rep(f"    {k}: {r.get('kernel')} config {r.get('chosen')}; "
                + " | ".join(h[2:] for h in heads.get(r.get("kernel"), []))[:400])
    rep(f"  {kernels} kernels generated; {len(tunes)} autotuned ({len({r.get('compiled_name') for r in tunes})} "
        f"distinct bodies) over {sum(len(r.get('timings', ())) for r in tunes)} configs")
    rep(f"  coil compile stages (self ms; top-level total {top:.0f} ms; the rest of the first "
        "step is runtime: Triton compiles at first launch, autotuning, the recordings):")
    for name, ms in sorted(selfs.items(), key=lambda kv: -kv[1])[:12]:
        rep(f"    {name:28s} {ms:9.0f}")


def run_one(rep: Report, name: str, built, dev, steps: int, trace_dir: str, host_steps: int = 0) -> None:
    ro._reset_compilers()
    gc.collect()
    cuda = dev.type == "cuda"
    if cuda:
        sync(dev)
        torch.cuda.empty_cache()
        base, base_alloc, before = torch.cuda.memory_reserved(dev), torch.cuda.memory_allocated(dev), pools(dev)
    module = copy.deepcopy(built.module)
    if name == "coil":
        from coil import trace
        trace.set_dir(trace_dir)
    fn = module if name == "eager" else ro.COMPILERS[name](module, built.dynamic)
    step = built.step_for(fn, module, ro.MARK_STEP.get(name, lambda: None))
    t0 = time.perf_counter()
    loss = step()[0]
    sync(dev)
    compile_s = time.perf_counter() - t0
    for _ in range(4):
        loss = step()[0]
    sync(dev)
    if name == "coil":
        from coil import trace
        trace.set_dir(None)
    rep(f"\n=== {ro.LABELS[name]}: first step {compile_s:.1f} s, "
        f"first output after 5 steps {float(loss.flatten()[0]):.5f}")
    if cuda:
        rsv, alloc, after = torch.cuda.memory_reserved(dev), torch.cuda.memory_allocated(dev), pools(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        for _ in range(3):
            step()
        sync(dev)
        peak = (torch.cuda.max_memory_reserved(dev) - base) / GB
        peak_alloc = (torch.cuda.max_memory_allocated(dev) - base_alloc) / GB
        torch.cuda.empty_cache()
        trimmed = (torch.cuda.memory_reserved(dev) - base) / GB
        rep(f"  memory (GB beyond the base): steady peak reserved {peak:.3f} (the bench's peak GB), "
            f"steady peak allocated {peak_alloc:.3f}; after warm-up reserved {(rsv - base) / GB:.3f}, "
            f"allocated {(alloc - base_alloc) / GB:.3f}; reserved after empty_cache {trimmed:.3f}")
        for key, (r, a) in sorted(after.items()):
            r0, a0 = before.get(key, (0, 0))
            if (r, a) != (r0, a0):
                kind = "default pool" if key == "(0, 0)" else "graph pool"
                rep(f"    {kind} {key}: reserved {(r - r0) / GB:+.3f} GB, allocated {(a - a0) / GB:+.3f} GB")
    ms = time_steps(step, dev, steps)
    sync(dev)
    gcs: list = []

    def on_gc(phase, info, t=[0.0]):
        if phase == "start":
            t[0] = time.perf_counter()
        else:
            gcs.append((info["generation"], time.perf_counter() - t[0]))
    gc.callbacks.append(on_gc)
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        step()
    sync(dev)
    w1, c1 = time.perf_counter(), time.thread_time()
    gc.callbacks.remove(on_gc)
    rep(f"  gc during {steps} steps: " + ", ".join(
        f"gen{g} x{sum(1 for x in gcs if x[0] == g)} {sum(d for x, d in gcs if x == g) * 1e3:.1f} ms"
        for g in range(3)))
    rep(f"  main thread: wall {(w1 - w0) * 1e3 / steps:.3f} ms per step, CPU {(c1 - c0) * 1e3 / steps:.3f} ms "
        f"per step; {len(os.listdir('/proc/self/task'))} OS threads, {len(gc.get_objects())} gc objects")
    if cuda:
        pool_detail(rep, dev, before)
    kernels, wall = profile(step, dev)
    gpu_ms = sum(t for t, _ in kernels.values()) / 1e3 / 5
    calls = sum(c for _, c in kernels.values()) / 5
    rep(f"  {ms:.3f} ms per step (median of {steps}); profiled: GPU {gpu_ms:.3f} ms per step in "
        f"{calls:.0f} kernels, wall {wall:.3f} ms per step")
    rep("  top kernels by device time (µs per step, calls per step):")
    for k, (t, c) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:15]:
        rep(f"    {t / 5:9.1f} µs {c / 5:5.1f}x  {k[:110]}")
    if host_steps:
        import cProfile
        import io
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(host_steps):
            step()
        sync(dev)
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(25)
        rep(f"  host: cProfile of {host_steps} steps (inflates Python-heavy code), by self time:")
        for ln in buf.getvalue().splitlines()[4:40]:
            if ln.strip():
                rep("    " + ln[:200])
    if name == "coil":
        coil_tree(rep, dev)
        top = [k for k, _ in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:15] if k.startswith("coil_")]
        coil_log(rep, trace_dir, top)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default="gpu_results")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--compilers", nargs="*", default=["eager", "inductor", "coil"])
    ap.add_argument("--workload", default="train_gpt", help="any of coil bench --mode reduce-overhead's")
    ap.add_argument("--host", type=int, default=0, metavar="N",
                    help="add a cProfile of N steps: where each compiler's host time goes")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rep = Report(os.path.join(a.out, f"ro_{a.workload}_profile.txt"))
    _, dev, size = ro.resolve([a.workload], ro.WORKLOADS, "workloads", [], ro.COMPILERS, a.device, None)
    built = ro.WORKLOADS[a.workload].build(dev, size)
    rep(f"{a.workload} ({built.config}) on {dev}, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else " (smoke test: tiny config)"))
    trace_dir = tempfile.mkdtemp(prefix="coil_ro_train_")
    for name in a.compilers:
        try:
            run_one(rep, name, built, dev, a.steps, trace_dir, a.host)
        except Exception:  # noqa: BLE001 - the other compilers still run
            rep(f"\n=== {name} failed:\n{traceback.format_exc()[-3000:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
