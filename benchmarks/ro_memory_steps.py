"""Where a reduce-overhead workload's memory goes, call by call: for one compiler alone, the device memory reserved and
allocated after each of the first calls (the warm-up, the recording, the replays), in the default pool and in total,
and what ``torch.cuda.empty_cache()`` would hand back (cached, unused); then the segments by pool, stream and
size class (2 MiB small / large), with the bytes in use. Finds memory a compiler leaves cached. ``--history``: at
each segment made or freed, the blocks of its size class live on its stream and the code that allocated them (why a
pool needs another segment).

    python benchmarks/ro_memory_steps.py --workload gpt2_b8 --compiler coil     # the GPU machine, < 1 minute
"""
from __future__ import annotations

import argparse
import copy
import gc

import torch

from coil.bench import reduce_overhead as ro


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="gpt2_b8")
    ap.add_argument("--compiler", default="coil", choices=sorted(ro.COMPILERS))
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--history", action="store_true", help="record the allocator's history and, at each segment "
                    "made or freed, print the blocks of its size class live then and where they were allocated")
    a = ap.parse_args()
    if a.history:
        torch.cuda.memory._record_memory_history(max_entries=500000)
    dev = torch.device("cuda")
    built = ro.WORKLOADS[a.workload].build(dev, "full")
    module = copy.deepcopy(built.module)
    gc.collect()
    torch.cuda.empty_cache()
    base_r, base_a = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    step = built.step_for(ro.COMPILERS[a.compiler](module, built.dynamic), module,
                          ro.MARK_STEP.get(a.compiler, lambda: None))
    mib = 2 ** 20
    for k in range(a.calls):
        out = step()
        torch.cuda.synchronize()
        st = torch.cuda.memory_stats()
        small = st.get("reserved_bytes.small_pool.current", 0)
        print(f"call {k}: reserved {(torch.cuda.memory_reserved() - base_r) / mib:8.1f} MiB, allocated "
              f"{(torch.cuda.memory_allocated() - base_a) / mib:8.1f} MiB, outputs "
              f"{sum(t.numel() * t.element_size() for t in out) / mib:6.1f} MiB, small pool {small / mib:.1f} MiB")
        print("   " + by_pool(torch.cuda.memory_snapshot()))
        del out
        gc.collect()
    if a.history:
        small_segments(torch.cuda.memory._snapshot())
    groups: dict = {}
    for seg in torch.cuda.memory_snapshot():
        used = sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        g = groups.setdefault((tuple(seg.get("segment_pool_id") or ()), seg.get("stream"),
                               seg["total_size"] < 2 ** 21 + 1), [0, 0, 0, 0])
        g[0], g[1], g[2], g[3] = g[0] + 1, g[1] + seg["total_size"], g[2] + used, g[3] + (used == 0)
    for (pool, stream, small), (n, total, used, unused) in sorted(groups.items(), key=str):
        print(f"  pool {pool} stream {stream} {'small' if small else 'large'}: {n} segments, {total / mib:.1f} MiB, "
              f"{used / mib:.2f} MiB in use, {unused} unused")
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    print(f"empty_cache after the calls hands back {(before - torch.cuda.memory_reserved()) / mib:.1f} MiB")


def by_pool(segments: list) -> str:
    """Reserved MiB (MiB in use) per pool and size class: the default pool is ``()`` / ``(0, 0)``."""
    g: dict = {}
    for seg in segments:
        key = (tuple(seg.get("segment_pool_id") or ()), "small" if seg["total_size"] <= 2 ** 21 else "large")
        used = sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        t = g.setdefault(key, [0, 0])
        t[0], t[1] = t[0] + seg["total_size"], t[1] + used
    return ", ".join(f"{p} {k} {r / 2**20:.1f} ({u / 2**20:.1f})" for (p, k), (r, u) in sorted(g.items(), key=str))


def _where(entry: dict) -> str:
    """The innermost frames of an allocation that are not torch's own Python."""
    frames = [f for f in entry.get("frames", []) if f.get("filename") and "/torch/" not in f["filename"]
              and not f["filename"].endswith((".cpp", ".h", ".cu")) and "??" not in f["filename"]]
    return " < ".join(f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" for f in frames[:3]) or "?"


def small_segments(snapshot: dict) -> None:
    """At each segment the allocator made, the blocks of its size class (small: <= 1 MiB) live on that stream then."""
    live: dict = {}
    for ev in (e for trace in snapshot["device_traces"] for e in trace):
        act, addr, size = ev["action"], ev["addr"], ev["size"]
        if act == "alloc":
            live[addr] = ev
        elif act in ("free_requested", "free_completed"):
            live.pop(addr, None)
        elif act in ("segment_alloc", "segment_free"):
            small = size <= 2 ** 21
            mine = sorted((e for e in live.values() if e["stream"] == ev["stream"] and (e["size"] <= 2 ** 20) == small),
                          key=lambda e: -e["size"])
            print(f"  {'new' if act == 'segment_alloc' else 'freed'} {'small' if small else 'large'} segment of "
                  f"{size / 2**20:.1f} MiB on stream {ev['stream']}: {sum(e['size'] for e in mine) / 2**20:.1f} MiB of "
                  f"{'small' if small else 'large'} blocks live in {len(mine)} blocks; the largest:")
            for e in mine[:4 if small else 6]:
                print(f"    {e['size'] / 2**10:8.1f} KiB  {_where(e)}")

if __name__ == "__main__":
    main()
