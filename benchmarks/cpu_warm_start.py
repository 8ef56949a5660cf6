"""Cold/warm start of coil on CPU in a fresh process (docs/cpp_backend.md, "Warm start").

``python benchmarks/cpu_warm_start.py MODEL CACHE_DIR`` builds a model (a ``coil.bench``
model at its small size, or ``gpt2_124m``: GPT-2 with the 124M configuration, random
weights, 1x64 tokens), compiles it with ``coil.compile`` using ``CACHE_DIR`` as coil's
cache, and prints the time of the first call (capture + AOT + codegen + load + one run)
with a breakdown by stage. Run it twice with the same directory: the first run is the
cold start, the second the warm start (disk cache). ``--inductor`` times
``torch.compile`` the same way (``TORCHINDUCTOR_CACHE_DIR=CACHE_DIR``).
"""
from __future__ import annotations

import collections
import functools
import os
import sys
import time


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("cache_dir")
    ap.add_argument("--inductor", action="store_true")
    a = ap.parse_args()
    if a.inductor:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = a.cache_dir
    import torch
    import coil
    import coil.aot
    import coil.codegen
    import coil.codegen.cpp
    import coil.codegen.cpp.launch
    import coil.ir.graph
    import coil.schedule.scheduler

    times = collections.defaultdict(float)

    def timed(owner, name, label):
        f = getattr(owner, name)

        @functools.wraps(f)
        def w(*args, **kw):
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                times[label] += time.perf_counter() - t
        setattr(owner, name, w)

    timed(coil.aot, "aot_compile", "aot_compile (AOT trace + codegen)")
    timed(coil.codegen, "compile_aten_graph", "  compile_aten_graph")
    timed(coil.ir.graph.GraphLowering, "lower", "    lowering")
    timed(coil.schedule.scheduler.Scheduler, "__init__", "    scheduler")
    timed(coil.codegen.cpp.CppBackend, "generate", "    C++ generate")
    timed(coil.codegen.cpp.launch.CppLauncher, "wait", "    build / load .so")
    if a.model == "gpt2_124m":
        import transformers
        conf = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257,
                                       n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0, use_cache=False)
        torch.manual_seed(0)
        m, args = transformers.GPT2LMHeadModel(conf).eval(), (torch.randint(0, 50257, (1, 64)),)
    else:
        from coil.bench.models import MODELS
        b = MODELS[a.model].build(torch.device("cpu"), "small")
        m, args = b.module.eval(), b.args
    coil.config.config.cache_dir = a.cache_dir
    t0 = time.perf_counter()
    cm = torch.compile(m) if a.inductor else coil.compile(m)
    with torch.no_grad():
        cm(*args)
    t1 = time.perf_counter()
    with torch.no_grad():
        cm(*args)
    t2 = time.perf_counter()
    print(f"compile + first call {t1 - t0:.3f} s (second call {t2 - t1:.3f} s)")
    for k, v in times.items():
        print(f"  {k:36s} {v:.3f} s")


if __name__ == "__main__":
    sys.exit(main())
