"""What an AMP weight gradient's cast costs, and whether cuBLAS can write it in float32 directly.

Under bf16 autocast a linear layer's weight gradient is a bf16 product ``g.t() @ x`` (cuBLAS rounds its float32
accumulator to bf16), then a cast to float32 for the float32 parameter's ``.grad``: the cast reads 2 and writes 4
bytes an element in a kernel of its own (a LLaMA-style step, 4 layers, hidden 2048: 0.65 ms of 7.7 ms of device time
on an H100, 2026-12-06). ``torch.mm(a, b, out_dtype=torch.float32)`` (``aten.mm.dtype``, CUDA only) writes the
accumulator as float32 instead: no cast kernel, 2 more bytes an element in the product's epilogue, and no bf16
rounding of the gradient (more accurate than eager's). Per shape (M x K @ K x N, the backward's ``g.t() @ x`` of
batch 4 x 512 tokens), microseconds per call (CUDA events, median of 50) of: the bf16 product, the bf16 product and
its cast, the product written as float32, and the largest difference between the last two relative to the result's
rms (the rounding the cast path adds: about 2^-9).

    python benchmarks/mm_out_dtype.py          # any CUDA card, < 30 s
    SHAPES=2048x2048x5632,768x4096x3072 python benchmarks/mm_out_dtype.py
"""
from __future__ import annotations

import os

import torch

from mm_alignment import timed  # (this directory is on sys.path when the script runs)


def main() -> None:
    shapes = os.environ.get("SHAPES", "5632x2048x2048,2048x2048x2048,512x2048x2048,2048x2048x5632,32000x2048x2048")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'M x K x N':>20s} {'bf16 mm':>9s} {'mm + cast':>10s} {'mm fp32 out':>12s} {'saved':>7s} {'max diff/rms':>13s}")
    for spec in shapes.split(","):
        m, k, n = (int(v) for v in spec.split("x"))
        a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t()  # g.t(): a transposed operand, as the backward
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        t_mm = timed(lambda: torch.mm(a, b))
        t_cast = timed(lambda: torch.mm(a, b).float())
        try:
            t_out = timed(lambda: torch.mm(a, b, out_dtype=torch.float32))
            ref, got = torch.mm(a, b).float(), torch.mm(a, b, out_dtype=torch.float32)
            diff = float((ref - got).abs().max() / got.pow(2).mean().sqrt())
            print(f"{spec:>20s} {t_mm:9.1f} {t_cast:10.1f} {t_out:12.1f} {t_cast - t_out:7.1f} {diff:13.2e}")
        except (RuntimeError, TypeError, NotImplementedError) as e:
            print(f"{spec:>20s} {t_mm:9.1f} {t_cast:10.1f}  out_dtype unavailable: {str(e).splitlines()[0][:80]}")


if __name__ == "__main__":
    main()
