"""Per-call overhead of coil on CPU, layer by layer (docs/cpp_backend.md, "The wrapper").

``python benchmarks/cpu_overhead.py`` compiles ``Linear(8,8) -> ReLU -> Linear(8,8)`` on a
2x8 input (kernels cost ~nothing, so every µs is overhead) and prints µs/call (min over
20 chunks, one thread) for: eager, the generated wrapper ``call`` alone, the
``CompiledGraph`` (+ AOT inference runner), the whole ``coil.compile(m)(x)``,
``torch.compile(m)(x)``, and the wrapper's building blocks (a C++ kernel launch, addmm,
views, ``ensure_layout``, ``empty_strided``). ``--model NAME`` uses a bench model instead.
"""
from __future__ import annotations

import argparse
import time

import torch


def _bench(fn, n):
    for _ in range(min(200, n)):
        fn()
    best = float("inf")
    for _ in range(20):
        t = time.perf_counter()
        for _ in range(max(1, n // 20)):
            fn()
        best = min(best, (time.perf_counter() - t) / max(1, n // 20))
    return best * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a coil.bench model (default: tiny MLP)")
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--no-inductor", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    import coil
    import coil.codegen as cg

    graphs = []
    orig = cg.compile_aten_graph

    def recording(gm, ex, dev):
        c = orig(gm, ex, dev)
        graphs.append(c)
        return c

    cg.compile_aten_graph = recording
    if a.model:
        from coil.bench.models import MODELS
        b = MODELS[a.model].build(torch.device("cpu"), "small")
        m, x = b.module.eval(), b.args[0]
    else:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)).eval()
        x = torch.randn(2, 8)
    cm = coil.compile(m)
    rows = []
    with torch.no_grad():
        cm(x)
        g = graphs[0]
        seen = {}
        inner = g.call

        def once(*args):
            seen["args"] = args
            return inner(*args)

        g.call = once
        cm(x)
        g.call = inner
        args = seen["args"]
        rows += [("eager module", lambda: m(x)), ("wrapper call(...) alone", lambda: inner(*args)),
                 ("CompiledGraph", lambda: g(*args)), ("coil.compile(m)(x)", lambda: cm(x))]
        if not a.no_inductor:
            tc = torch.compile(m)
            tc(x)
            rows.append(("torch.compile(m)(x)", lambda: tc(x)))
        if not a.model:
            glb = inner.__globals__
            launcher = next(v for k, v in glb.items() if k.startswith("k") and k[1:].isdigit())
            b0, b1, w = torch.empty(2, 8), torch.empty(2, 8), m[0].weight
            rows += [("C++ kernel launch (2 tensors)", lambda: launcher(b0, b1)),
                     ("eager relu (2x8)", lambda: torch.relu(b0)),
                     ("addmm (allocates)", lambda: torch.addmm(m[0].bias, x, w.t())),
                     ("addmm out=", lambda: torch.addmm(m[0].bias, x, w.t(), out=b1)),
                     ("reinterpret (as_strided)", lambda: glb["reinterpret"](w, (8, 8), (1, 8), 0)),
                     ("ensure_layout (no copy)", lambda: glb["ensure_layout"](b0, (2, 8), (8, 1))),
                     ("empty_strided", lambda: torch.empty_strided((2, 8), (8, 1), dtype=torch.float32))]
        for name, fn in rows:
            print(f"{name:32s} {_bench(fn, a.calls):9.1f} us")


if __name__ == "__main__":
    main()
