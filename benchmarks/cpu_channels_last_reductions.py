"""Channels-last reductions of the C++ backend against eager (FINDINGS_68 item 4; docs/cpp_backend.md, "Outer
reductions"): mean/sum over (2, 3), instance norm, adaptive average pool, pool + instance norm, a squeeze-excitation
block and group norm, NCHW and channels-last, coil.compile vs eager, float32.

    OMP_NUM_THREADS=1 nice python benchmarks/cpu_channels_last_reductions.py [case ...]

Prints the 10th percentile of up to 400 calls (1 s) per row and the largest difference from eager.
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import coil  # noqa: E402
torch.manual_seed(0)

class SE(torch.nn.Module):
    def __init__(self, c):
        super().__init__(); self.fc = torch.nn.Conv2d(c, c // 4, 1); self.fc2 = torch.nn.Conv2d(c // 4, c, 1)
    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc(s))))

def cases(c):
    se = SE(c).eval()
    return {
        "mean23": lambda x: x.mean((2, 3)),
        "sum23k": lambda x: x.sum((2, 3), keepdim=True),
        "inorm": lambda x: F.instance_norm(x),
        "aap1": lambda x: F.adaptive_avg_pool2d(x, 1),
        "pool_inorm": lambda x: F.instance_norm(F.avg_pool2d(x, 2)),
        "se": se,
        "gnorm": lambda x: F.group_norm(x, 8),
    }

def bench(f, x, n=None):
    for _ in range(3): f(x)
    ts = []; t0 = time.perf_counter()
    while len(ts) < 400 and time.perf_counter() - t0 < 1.0:
        t = time.perf_counter(); f(x); ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 10] * 1e3  # 10th percentile

only = sys.argv[1:] 
torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', '2')))
with torch.no_grad():
    for shape in [(8, 64, 56, 56), (32, 256, 14, 14)]:
        for name, fn in cases(shape[1]).items():
            if only and name not in only: continue
            row = []
            for fmt in ["nchw", "cl"]:
                x = torch.randn(shape)
                if fmt == "cl": x = x.to(memory_format=torch.channels_last)
                cf = coil.compile(fn)
                ref = fn(x); out = cf(x)
                err = (ref - out).abs().max().item()
                te, tc = bench(fn, x), bench(cf, x)
                row.append(f"{fmt}: eager {te:7.3f} coil {tc:7.3f} ({tc/te:4.2f}x) err {err:.1e}")
            print(f"{str(shape):18s} {name:10s} " + " | ".join(row), flush=True)
