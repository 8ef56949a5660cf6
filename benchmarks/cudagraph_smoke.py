"""Per-call latency of a small GPT-like model at batch 1 in bf16 (inference), median ms
over CUDA events: eager, coil default, coil mode="reduce-overhead" (CUDA graph trees),
torch.compile mode="reduce-overhead". Needs a CUDA device.

    python benchmarks/cudagraph_smoke.py [--layers 4] [--no-torch]
"""
import argparse
import statistics
import time

import torch

import coil
from coil.bench.models import SmallGPT


def median_ms(fn, x, n: int = 100) -> float:
    """Median over ``n`` calls of the GPU time from before the call's first launch to
    after its last (host gaps between launches included)."""
    for _ in range(5):
        fn(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(x)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = SmallGPT(vocab=8192, d=512, heads=8, layers=a.layers, max_seq=64).cuda().to(torch.bfloat16).eval()
    x = torch.randint(0, 8192, (1, 64), device="cuda")
    rows = []
    with torch.no_grad():
        ref = model(x).float()
        variants = [("eager", lambda: model),
                    ("coil default", lambda: coil.compile(model)),
                    ("coil reduce-overhead", lambda: coil.compile(model, mode="reduce-overhead"))]
        if not a.no_torch:
            variants.append(("torch.compile reduce-overhead",
                             lambda: torch.compile(model, mode="reduce-overhead")))
        for name, make in variants:
            t0 = time.perf_counter()
            fn = make()
            out = fn(x).float()
            compile_s = time.perf_counter() - t0
            err = ((out - ref).norm() / ref.norm()).item()
            ms = median_ms(fn, x)
            rows.append((name, ms, compile_s, err))
            print(f"{name:32s} {ms:8.3f} ms   first call {compile_s:6.1f} s   rel err {err:.1e}", flush=True)
            if name == "coil reduce-overhead":
                from coil.runtime import cudagraph_trees
                t = cudagraph_trees._TREES.get(0)
                print(f"  coil tree: {t.nodes if t else 0} recorded graphs, "
                      f"{t.replays if t else 0} replays", flush=True)
    base = rows[0][1]
    print(f"\nSmallGPT d=512 layers={a.layers} vocab=8192, batch 1 x 64 tokens, bf16, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, ms, _, _ in rows:
        print(f"| {name} | {ms:.3f} ms | {base / ms:.2f}x |")


if __name__ == "__main__":
    main()
