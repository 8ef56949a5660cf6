"""How a CUDA bf16 product with an unaligned N (GPT-2's LM head, K=768, N=50257) is fastest:
plain ``a @ W.t()`` (cuBLAS on a misaligned output), coil's ``matmul_padded`` (copies the
weight into a padded buffer every call), ``torch.mm(..., out=)`` into a row-padded output
view (no copy; cuBLAS sees aligned leading dimensions), and the whole product compiled by
coil and by torch.compile. One row per M, microseconds per call (CUDA events, median).

    python benchmarks/mm_alignment.py            # the H200: < 1 minute
    BIAS=1 N=250002 MS=512,4096 python benchmarks/mm_alignment.py   # XLM-R's LM head, with its bias

"pad+copy" is ``matmul_padded`` into a row-padded output followed by the copy to a contiguous one (what a padded
product costs when it is a graph output).
"""
from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def timed(fn, reps=50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1000)
    return statistics.median(ts)


def main() -> None:
    import coil
    from coil.codegen.wrapper import empty_row_padded, matmul_padded

    dev, dt = torch.device("cuda"), torch.bfloat16
    k, n = int(os.environ.get("K", 768)), int(os.environ.get("N", 50257))
    w = torch.randn(n, k, device=dev, dtype=dt)
    bias = torch.randn(n, device=dev, dtype=dt) if os.environ.get("BIAS") == "1" else None
    ms = [int(v) for v in os.environ.get("MS", "1,2,8,64,512,4096").split(",")]
    print(f"K={k} N={n} bf16, bias {bias is not None}, us per call (median of 50)")
    print(f"{'M':>6} {'plain':>8} {'padded':>8} {'out=pad':>8} {'coil':>8} {'tc':>8} {'pad+copy':>8}  max|coil-plain|")
    for m in ms:
        a = torch.randn(m, k, device=dev, dtype=dt)
        outp = empty_row_padded((m, n), -(-n // 8) * 8, dev, dt)
        f = (lambda a, w: a @ w.t()) if bias is None else (lambda a, w: torch.nn.functional.linear(a, w, bias))
        cf = coil.compile(f, dynamic=False)
        tf = torch.compile(f, dynamic=False)
        ref = f(a, w)
        got = cf(a, w)
        diff = (got.float() - ref.float()).abs().max().item()
        row = [timed(lambda: f(a, w)), timed(lambda: matmul_padded(outp, a, w.t(), bias)),
               timed(lambda: torch.mm(a, w.t(), out=outp)), timed(lambda: cf(a, w)),
               timed(lambda: tf(a, w)), timed(lambda: (matmul_padded(outp, a, w.t(), bias), outp.contiguous()))]
        print(f"{m:>6} " + " ".join(f"{v:8.1f}" for v in row) + f"  {diff:.3g}", flush=True)
        print(f"       output strides: eager {ref.stride()}, coil {got.stride()}, tc {tf(a, w).stride()}")


if __name__ == "__main__":
    main()
