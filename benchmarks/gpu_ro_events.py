"""The CUDA-graph decisions of one timm model under ``mode="reduce-overhead"``: every
``cudagraph_*`` event of the compile log (skips, splits, recordings with their reasons),
the graphs compiled, and ms per call with the host time. CUDA, batch 1 x 224, bf16.

    python benchmarks/gpu_ro_events.py mobilenetv3_large_100 [--profile]

``--profile`` adds a cProfile of 200 steady-state calls (top functions by self time).
"""
import cProfile
import os
import pstats
import sys
import tempfile
import time

import torch


def main() -> None:
    import timm
    import coil
    from coil import trace
    from coil.trace.report import read_log

    name = sys.argv[1] if len(sys.argv) > 1 else "mobilenetv3_large_100"
    log = tempfile.mkdtemp()
    trace.set_dir(log)
    m = timm.create_model(name, pretrained=False).cuda().to(torch.bfloat16).eval()
    x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    f = coil.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            f(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            f(x)
        host = (time.perf_counter() - t0) / 50
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 50
    print(f"{name}: {wall * 1e3:.3f} ms per call, {host * 1e3:.3f} ms host", flush=True)
    # guard time without a profiler's per-call cost: _find_entry (the guard functions) timed
    from coil.capture import frame
    spent, find = [0.0], frame._find_entry

    def timed(*a):
        t = time.perf_counter()
        try:
            return find(*a)
        finally:
            spent[0] += time.perf_counter() - t
    frame._find_entry = timed
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(200):
            f(x)
        host2 = (time.perf_counter() - t0) / 200
    frame._find_entry = find
    print(f"guards {spent[0] / 200 * 1e6:.1f} us of {host2 * 1e6:.1f} us host per call", flush=True)
    if "--profile" in sys.argv:
        prof = cProfile.Profile()
        with torch.no_grad():
            prof.enable()
            for _ in range(200):
                f(x)
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    lg = read_log(log)
    print("compiles:", len(lg.compiles))
    for r in [r for c in lg.compiles for r in c.events] + lg.loose:
        if str(r.get("event", "")).startswith(("cudagraph", "graph_break", "recompile")):
            print({k: v for k, v in r.items() if k not in ("ts", "pid")}, flush=True)


if __name__ == "__main__":
    main()
