"""Whether a compiled step's time depends on what runs between its calls: for a broad-suite model and mode,
coil's step timed (CUDA events around one synchronized call, median of ``--iters``) alone, interleaved with the
eager step, and interleaved with eager and torch.compile's step (the suite's ``--paired`` rounds), plus each
neighbour's own time. Run it from two trees to compare them:

    python benchmarks/interleave_diag.py --model b_whisper --mode bf16     # the GPU machine

Prints text; the tree is the one ``coil`` is imported from.
"""
from __future__ import annotations

import argparse
import os
import statistics

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", default="bf16")
    ap.add_argument("--size", default=None)
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()
    import coil
    from coil.bench import measure
    from coil.bench.broad import BROAD_MODELS
    from coil.bench.suite import _cast_inputs, _mode_dtype, _prepared_copy, _trainable, make_step

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    built = BROAD_MODELS[a.model].build(dev, a.size or ("full" if dev.type == "cuda" else "small"))
    dt = _mode_dtype(a.mode)
    print(f"coil from {os.path.dirname(coil.__file__)}; {a.model} {built.config} {a.mode}")
    steps = {}
    for name in ("eager", "coil", "inductor"):
        m = _prepared_copy(built.module, a.mode, dt)
        fn = {"eager": m, "coil": coil.compile(m) if name == "coil" else None,
              "inductor": torch.compile(m) if name == "inductor" else None}[name]
        steps[name] = make_step(fn, _trainable(m), _cast_inputs(built.args, dt), _cast_inputs(built.kwargs, dt),
                                a.mode, dev)
        for _ in range(3):
            steps[name]()

    hits = [0]
    try:  # coil's fast guard (coil/capture/guard_versions.py), where the tree has one
        from coil.capture import guard_versions as gv
        orig_hit = gv._State.hit
        gv._State.hit = lambda self: (hits.__setitem__(0, hits[0] + 1), orig_hit(self))[1]
    except ImportError:
        hits[0] = None

    def rounds(names):
        times = {n: [] for n in names}
        before = hits[0]
        for _ in range(a.iters):
            for n in names:
                times[n].append(measure.time_once(steps[n], dev) * 1e3)
        fast = "" if before is None or "coil" not in names else f"  (coil's fast guard held {hits[0] - before} of {a.iters})"
        return "  ".join(f"{n} {statistics.median(v):.2f}" for n, v in times.items()) + fast

    for names in (["coil"], ["eager", "coil"], ["eager", "coil", "inductor"], ["coil"], ["inductor"],
                  ["eager", "inductor"]):
        print(f"{' + '.join(names):28s} ms/step: {rounds(names)}")


if __name__ == "__main__":
    main()
