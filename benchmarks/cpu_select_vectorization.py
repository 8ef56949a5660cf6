"""Pointwise kernels of the C++ backend against eager, one thread: whether the generated loops vectorize.

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/cpu_select_vectorization.py

Each row compiles one small function with ``coil.compile`` (C++ kernels on the CPU), checks it against eager, and
prints the best of 30 calls for both on 2^20 float32 elements (softmax, rotate_half, pad: 256 x 4096). A row far below 1.0 is a loop
GCC left scalar (check the kernel with ``-fopt-info-vec``: docs/cpp_backend.md, "Selects are bit masks").
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import coil  # noqa: E402

FNS = {
    "exp": lambda x: x.exp(),
    "tanh": lambda x: x.tanh(),
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "sigmoid*x": lambda x: torch.sigmoid(x) * x,
    "log(abs+1)": lambda x: (x.abs() + 1).log(),
    "relu*2": lambda x: torch.relu(x) * 2,
    "where": lambda x: torch.where(x > 0, x, x * 0.1),
    "softmax": lambda x: torch.softmax(x, -1),
    # masked blocks along the inner dim (docs/cpp_backend.md, "Inner-loop pieces for cat and pad"); 256 x 4096
    "rotate_half": lambda x: x * 0.5 + torch.cat((-x[..., 2048:], x[..., :2048]), -1) * 0.25,
    "pad": lambda x: torch.nn.functional.pad(x[:, 3:-5], (3, 5)) * 2,
}


def best_ms(f, a, n=30) -> float:
    f(a)
    best = float("inf")
    for _ in range(n):
        s = time.perf_counter()
        f(a)
        best = min(best, time.perf_counter() - s)
    return best * 1e3


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, xb = torch.randn(1 << 20), torch.randn(256, 4096)
    for name, f in FNS.items():
        a = xb if name in ("softmax", "rotate_half", "pad") else x
        cf = coil.compile(f)
        torch.testing.assert_close(cf(a), f(a), rtol=1e-5, atol=1e-5)
        e, c = best_ms(f, a), best_ms(cf, a)
        print(f"{name:12s} eager {e:7.3f} ms  coil {c:7.3f} ms  coil speedup over eager {e / c:5.2f}", flush=True)


if __name__ == "__main__":
    main()
