"""Per-call host time of a small graph compiled static vs with dynamic sizes (issue 17),
split by layer: ``python benchmarks/gpu_dynamic_overhead.py [--backend cpp|triton]
[--profile]``.

``x * y + 1`` on a 64 x 256 fp32 tensor and a 256 vector, compiled four ways:
``torch.compile(backend=coil_backend_entry)`` and ``coil.compile``, each static and
``dynamic=True`` (the dynamic ones warmed at 32 rows first, so that they serve any row
count). Each row times, best of ``--rounds`` rounds of ``--calls`` calls, all variants
interleaved (the CPU box is shared):

* ``call``: the compiled function as the user calls it;
* ``guard``: coil's capture guard of the entry alone (coil.compile only);
* ``graph``: the generated wrapper of the ATen graph (allocation, size symbols, launches);
* ``launch``: the kernel launchers alone, with the arguments the wrapper passed.

On CUDA the kernels run (the loop is synchronized at its end). On CPU, C++ kernels run;
Triton kernels (``--backend triton``, the interpreter) are replaced by a no-op after the
launcher's own Python (bucket choice included), so that the interpreter's time does not
hide the wrapper's. ``--profile`` adds a cProfile of the dynamic ``torch.compile`` call.

GPU: ``source benchmarks/gpu_env.sh; python benchmarks/gpu_dynamic_overhead.py --profile``.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
import types

import torch


def _fresh(fn, tag):
    """``fn`` with its own code object: each compiled variant gets its own cache."""
    return types.FunctionType(fn.__code__.replace(co_name=f"{fn.__name__}_{tag}"), fn.__globals__)


def _best(fn, calls: int, sync) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t) / calls * 1e6


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cpp", choices=["cpp", "triton"], help="CPU kernels")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    import coil
    import coil.codegen as cg
    from coil.backends.registry import coil_backend_entry
    from coil.capture.frame import _caches
    from coil.config import config
    import coil.runtime.triton_dynamic as td

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    noop_kernels = dev == "cpu" and a.backend == "triton"
    config.cpu_backend = a.backend
    if noop_kernels:  # keep the launchers' Python, drop the interpreter's run
        td.DynamicTritonLauncher._first_launch = lambda self, *_: (lambda *args: None)
    graphs: list = []
    orig = cg.compile_aten_graph

    def spy(gm, ex, device):
        g = orig(gm, ex, device)
        graphs.append(g)
        return g

    cg.compile_aten_graph = spy
    from coil import trace
    events: dict = {}
    log = trace.log

    def counting(event, **kw):  # what the runtime decided, for the report below
        if event in ("fast_launch_unavailable", "dynamic_launch_bucket", "kernel_compile_fallback",
                     "codegen_fallback", "autotune"):
            events[event] = events.get(event, 0) + 1
        return log(event, **kw)

    trace.log = counting

    def fn(x, y):
        return x * y + 1

    x, y = torch.randn(64, 256, device=dev), torch.randn(256, device=dev)
    rows: dict = {}
    for entry in ("torch.compile", "coil.compile"):
        for dynamic in (False, True):
            f = _fresh(fn, f"{entry.split('.')[0]}_{int(dynamic)}")
            n0 = len(graphs)
            if entry == "torch.compile":
                c = torch.compile(f, backend=coil_backend_entry, dynamic=dynamic)
            else:
                c = coil.compile(f, dynamic=dynamic)
            if dynamic:
                c(torch.randn(32, 256, device=dev), y)
            c(x, y)
            assert len(graphs) == n0 + 1, f"{entry} dynamic={dynamic}: {len(graphs) - n0} graphs"
            g = graphs[-1]
            gl = g.call.__globals__
            seen: dict = {}
            for k in g.kernels:  # the arguments each launcher gets, from one recorded call
                name = next(n for n, v in gl.items() if v is k.launcher)
                if noop_kernels and not isinstance(k.launcher, td.DynamicTritonLauncher):
                    k.launcher._call = lambda *args: None
                gl[name] = (lambda real, nm: lambda *args: (seen.setdefault(nm, (real, args)), real(*args))[1])(
                    k.launcher, name)
            inner = g.call
            g.call = lambda *args: (seen.setdefault("graph", (inner, args)), inner(*args))[1]
            c(x, y)
            g.call = inner
            for nm, (real, _) in seen.items():
                if nm != "graph":
                    gl[nm] = real
            parts = {"call": lambda c=c: c(x, y)}
            if entry == "coil.compile":
                e = _caches[f.__code__].entries[-1]
                parts["guard"] = lambda e=e: e.guard(x, y, f)
            ginner, gargs = seen["graph"]
            parts["graph"] = lambda gi=ginner, ga=gargs: gi(*ga)
            launches = [(r, ar) for nm, (r, ar) in seen.items() if nm != "graph"]
            parts["launch"] = lambda ls=launches: [r(*ar) for r, ar in ls]
            rows[(entry, dynamic)] = parts
            if not noop_kernels:
                torch.testing.assert_close(c(x, y), fn(x, y))
    best = {(k, part): float("inf") for k, parts in rows.items() for part in parts}
    for _ in range(a.rounds):
        for k, parts in rows.items():
            for part, run in parts.items():
                best[k, part] = min(best[k, part], _best(run, a.calls, sync))
    kind = dev if dev == "cuda" else f"cpu/{a.backend}" + (" (no-op kernels)" if noop_kernels else "")
    print(f"x * y + 1, 64 x 256 fp32, {kind}: µs per call, best of {a.rounds} x {a.calls}")
    print(f"{'entry':14} {'part':7} {'static':>8} {'dynamic':>8} {'ratio':>6}")
    for entry in ("torch.compile", "coil.compile"):
        for part in rows[(entry, False)]:
            s, d = best[(entry, False), part], best[(entry, True), part]
            print(f"{entry:14} {part:7} {s:8.2f} {d:8.2f} {d / s:6.2f}")
    print("runtime events:", events)
    for g in graphs:  # the launch function each kernel ended with (fast: the direct launch)
        for k in g.kernels:
            runs = getattr(k.launcher, "_runs", None)
            how = {b: getattr(r, "__name__", r) for b, r in runs.items()} if runs is not None else \
                getattr(getattr(k.launcher, "_call", None), "__name__", type(k.launcher).__name__)
            print(f"  {k.name}: {how}")
    if a.profile:
        c = rows[("torch.compile", True)]["call"]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            c()
        sync()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
