"""How many partial reductions a leading (column) reduction should split into on the GPU: the weight gradient of a
norm layer, ``(g * xhat).sum(0)`` over the tokens, for the GPU machine.

    python benchmarks/gpu_leading_split.py [--rows 2048 --cols 2048] [--splits 1 2 4 8 16 32]

The LLaMA-style training profile (4 layers, hidden 2048, 4 x 512 tokens; ``gpu_train_profile.py --model b_llama_gqa``)
showed coil's RMSNorm weight-gradient reductions split in 2 chunks of 1024 rows (``_split_decision``'s
``leading_few_programs`` rule, coil/ir/lowering.py): 4096 partials, autotuned to XBLOCK 32, ~85 µs for three fused
weight gradients, against ~20 µs per torch.compile kernel. Per shape (rows x cols, bf16 inputs, fp32 sum like
autocast's weight gradients) this compiles ``fn`` with coil once per forced split factor (the rule's own choice
first) and with torch.compile, and prints each one's kernel time: the median of ``triton.testing.do_bench`` in µs,
and the bandwidth it reaches over the bytes the inputs hold. Off CUDA it runs a smoke test on the CPU.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import coil  # noqa: E402
from coil.ir import lowering  # noqa: E402


def fn(g, x, r):
    """Three norm-weight-gradient-like column sums over the same rows (RMSNorm's ``g * x * rstd``)."""
    xh = x.float() * r
    return (g.float() * xh).sum(0), (g.float() * x.float()).sum(0), g.float().sum(0)


def _time(f, args, dev) -> float:
    if dev.type != "cuda":
        f(*args)
        return float("nan")
    from triton.testing import do_bench
    f(*args)
    torch.cuda.synchronize()
    return do_bench(lambda: f(*args), warmup=25, rep=100, return_mode="median") * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--cols", type=int, nargs="+", default=[768, 2048, 4096])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu":
        a.rows, a.cols, a.splits = [256], [64], [1, 2]
    decide = lowering._split_decision
    for rows in a.rows:
        for cols in a.cols:
            g = torch.randn(rows, cols, device=dev, dtype=torch.bfloat16)
            x = torch.randn(rows, cols, device=dev, dtype=torch.bfloat16)
            r = torch.rand(rows, 1, device=dev) + 0.5
            ref = fn(g, x, r)
            nbytes = (g.numel() + x.numel()) * 2 + r.numel() * 4
            chosen = []

            def spy(ranges, numel_r, rt, leading=False, device=None):
                s = decide(ranges, numel_r, rt, leading, device)
                chosen.append(s)
                return s
            lowering._split_decision = spy
            rows_out = []
            try:
                coil.reset()
                f = coil.compile(fn)
                rows_out.append(("coil rule", _time(f, (g, x, r), dev)))
                rule = chosen[0] if chosen else None
                for s in a.splits:
                    lowering._split_decision = (lambda ranges, numel_r, rt, leading=False, device=None, s=s:
                                                (s, "sweep") if leading and s > 1 else (1, "sweep"))
                    coil.reset()
                    f = coil.compile(fn)
                    out = f(g, x, r)
                    for o, e in zip(out, ref):
                        torch.testing.assert_close(o, e, rtol=2e-2, atol=2e-2 * rows ** 0.5)
                    rows_out.append((f"coil split {s}", _time(f, (g, x, r), dev)))
            finally:
                lowering._split_decision = decide
            tc = torch.compile(fn)
            rows_out.append(("torch.compile", _time(tc, (g, x, r), dev)))
            print(f"== {rows} x {cols} (bf16; rule: {rule})")
            for name, us in rows_out:
                print(f"  {name:16s} {us:9.1f} µs  {nbytes / (us * 1e-6) / 1e12 if us == us else float('nan'):6.2f} TB/s")


if __name__ == "__main__":
    main()
