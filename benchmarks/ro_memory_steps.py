"""Where a reduce-overhead workload's memory goes, call by call: for one compiler alone, the device memory reserved and
allocated after each of the first calls (the warm-up, the recording, the replays), in the default pool and in total,
and what ``torch.cuda.empty_cache()`` would hand back (cached, unused); then the segments by pool, stream and
size class (2 MiB small / large), with the bytes in use. Finds memory a compiler leaves cached.

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
    a = ap.parse_args()
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
        del out
        gc.collect()
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


if __name__ == "__main__":
    main()
