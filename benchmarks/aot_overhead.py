"""Per-call overhead of coil's AOT runtime wrapper on a tiny function, in microseconds.

    python benchmarks/aot_overhead.py

Compares, on 4-element CPU tensors (so kernel time is negligible):
- the ATen graph called directly (``gm.forward``: what the compiled halves cost),
- the inference wrapper (``aot_compile`` under no_grad),
- the training wrapper forward (autograd.Function) and forward+backward,
- eager PyTorch for the same function.
Also reports compile time (ms) of each path.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from coil.aot import aot_compile  # noqa: E402

GRAPHS = {}


def keep(gm, example_inputs):
    GRAPHS.setdefault("graphs", []).append(gm)
    return gm.forward


def f(x, w):
    return (x * w).sin() + x


def timeit(fn, n=20000):
    for _ in range(200):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    x = torch.randn(4)
    w = torch.randn(4, requires_grad=True)
    with torch.no_grad():
        aot_compile(lambda a, b: a + b, [x, w], lambda gm, ex: gm.forward)  # warm-up: imports, tables
    GRAPHS.clear()
    t0 = time.perf_counter()
    with torch.no_grad():
        inf = aot_compile(f, [x, w], keep)
    t_inf = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    train = aot_compile(f, [x, w], keep)
    t_train = (time.perf_counter() - t0) * 1e3
    graph = GRAPHS["graphs"][0]

    rows = []
    with torch.no_grad():
        rows.append(("eager f, no_grad", timeit(lambda: f(x, w))))
        rows.append(("ATen graph gm.forward, no_grad", timeit(lambda: graph.forward(x, w))))
        rows.append(("inference wrapper, no_grad", timeit(lambda: inf(x, w))))
    rows.append(("eager f, forward (grad)", timeit(lambda: f(x, w))))
    rows.append(("training wrapper, forward", timeit(lambda: train(x, w))))
    rows.append(("eager f, forward+backward", timeit(lambda: f(x, w).sum().backward(), 5000)))
    rows.append(("training wrapper, forward+backward", timeit(lambda: train(x, w).sum().backward(), 5000)))
    print(f"compile: inference path {t_inf:.1f} ms, training path {t_train:.1f} ms")
    print("| what | µs / call |")
    print("|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
