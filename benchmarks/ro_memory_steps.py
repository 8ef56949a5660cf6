"""Where a reduce-overhead workload's memory goes, call by call: for one compiler alone, the device memory reserved and
allocated after each of the first calls (the warm-up, the recording, the replays), in the default pool and in total,
and what ``torch.cuda.empty_cache()`` would hand back (cached, unused). Finds memory a compiler leaves cached.

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
    for seg in torch.cuda.memory_snapshot():
        free = sum(b["size"] for b in seg["blocks"] if b["state"] != "active_allocated")
        if free == seg["total_size"]:
            print(f"  unused segment {seg['total_size'] / mib:.1f} MiB, pool {seg.get('segment_pool_id')}")
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    print(f"empty_cache after the calls hands back {(before - torch.cuda.memory_reserved()) / mib:.1f} MiB")


if __name__ == "__main__":
    main()
