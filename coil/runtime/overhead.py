"""Measure the per-call overhead of compiled graphs: ``python -m coil.runtime.overhead``.

For tiny inputs the GPU work is a few µs, so the wall time of a call (without a
device synchronize between calls) is the host-side cost: the generated wrapper's
Python plus each kernel launch. Prints µs/call for coil and, on CUDA, for
torch.compile (inductor) and eager on the same graphs.

``--no-launch`` replaces every kernel launcher with a no-op to isolate the wrapper's
own Python (allocation, extern calls, bookkeeping); it works on CPU too.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def _graphs(device):
    def softmax(x):
        return torch.softmax(x, -1)

    def layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b)

    def mlp(x, w, b):
        return F.gelu(x @ w + b)

    def block_tail(x, y, w, b):
        h = x + y
        return F.layer_norm(h, (h.shape[-1],), w, b), h

    r = lambda *s: torch.randn(*s, device=device)
    return [("softmax[8x64]", softmax, (r(8, 64),)),
            ("layer_norm[8x64]", layer_norm, (r(8, 64), r(64), r(64))),
            ("gelu(x@w+b)[8x64]", mlp, (r(8, 64), r(64, 64), r(64))),
            ("residual+ln[8x64]", block_tail, (r(8, 64), r(8, 64), r(64), r(64)))]


def time_us(fn, args, iters: int, sync) -> float:
    for _ in range(10):
        fn(*args)
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn(*args)
    sync()
    return (time.perf_counter() - t) / iters * 1e6


def main(argv=None) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from coil.aot.decompositions import get_decompositions
    from coil.codegen import compile_aten_graph
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--no-launch", action="store_true")
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"{'graph':24s} {'kernels':>7s} {'coil us':>9s} {'inductor us':>12s} {'eager us':>9s}")
    for name, fn, args in _graphs(dev):
        gm = make_fx(fn, decomposition_table=get_decompositions())(*args)
        c = compile_aten_graph(gm, list(args), dev)
        if a.no_launch:
            noop = lambda *x: None
            c.call.__globals__.update({n: noop for n, v in c.call.__globals__.items()
                                       if n.startswith("k") and hasattr(v, "configs")})
        coil_us = time_us(c, args, a.iters, sync)
        ind = time_us(torch.compile(fn), args, a.iters, sync) if dev.type == "cuda" else float("nan")
        eager = time_us(fn, args, a.iters, sync)
        print(f"{name:24s} {c.kernel_count:7d} {coil_us:9.1f} {ind:12.1f} {eager:9.1f}")


if __name__ == "__main__":
    main()
