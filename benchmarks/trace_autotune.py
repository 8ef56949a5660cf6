"""Print the autotune decisions and fast-launch fallbacks of a COIL_TRACE directory:
kernel, chosen config and each candidate's time (µs).

    python benchmarks/trace_autotune.py TRACE_DIR
"""
import glob
import json
import sys

for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")):
    for line in open(f):
        d = json.loads(line)
        if d.get("event") in ("autotune", "fast_launch_unavailable", "autotune_error",
                              "kernel_compile_fallback"):
            timings = [(t["config"], round(t["ms"] * 1e3, 1)) for t in d.get("timings", [])]
            print(d["event"], d.get("kernel"), d.get("chosen"), timings, d.get("error", "")[:300])
