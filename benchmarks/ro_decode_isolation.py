"""Is the reduce-overhead decode row's coil time set by what else runs in the process?
Runs ``coil bench --mode reduce-overhead``'s decode workload with the compilers given (eager
is always timed), prints each compiler's ms, and for coil the main thread's CPU time per step.

    python benchmarks/ro_decode_isolation.py coil             # eager + coil
    python benchmarks/ro_decode_isolation.py inductor coil    # as the bench runs it
"""
import sys
import time

import torch

from coil.bench import reduce_overhead as ro

res = ro.run(["gpt2_decode"], compilers=tuple(sys.argv[1:]) or ("coil",), repeat=10,
             max_timing_s=10, progress=False)
for r in res["rows"]:
    print(f"{r['compiler']:14s} {r.get('ms') or 0:8.3f} ms  peak {r.get('peak_gb')}  {r.get('error') or ''}")
