"""Why a compiled frame's fast guard goes stale (coil/capture/guard_versions.py): for a broad-suite
model and mode, each full-guard pass records the version tag of every watched dict; the next pass names
the dicts whose tag moved (their owner: a module's ``__dict__`` / ``_parameters`` / ``_buffers`` /
``_modules``, a config, a Python module's globals) and the keys whose value changed, was added or removed.

    python benchmarks/guard_stale_diag.py --model b_whisper --mode bf16   # the GPU machine, or CPU (small)
    python benchmarks/guard_stale_diag.py --model b_whisper --mode bf16 --eager-between   # as --paired times

Prints text.
"""
from __future__ import annotations

import argparse
import collections
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", default="bf16")
    ap.add_argument("--size", default=None)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--eager-between", action="store_true",
                    help="run an eager copy's step between coil's calls (the suite's --paired rounds)")
    a = ap.parse_args()
    import coil
    from coil.bench.broad import BROAD_MODELS
    from coil.bench.suite import _cast_inputs, _mode_dtype, _prepared_copy, _trainable, make_step
    from coil.capture import guard_versions as gv

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    built = BROAD_MODELS[a.model].build(dev, a.size or ("full" if dev.type == "cuda" else "small"))
    dt = _mode_dtype(a.mode)
    m = _prepared_copy(built.module, a.mode, dt)
    owners = {}
    for name, mod in m.named_modules():
        for attr in ("__dict__", "_parameters", "_buffers", "_modules"):
            owners[id(getattr(mod, attr))] = f"module {name or '<root>'}.{attr} ({type(mod).__name__})"
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "__dict__"):
            owners.setdefault(id(cfg.__dict__), f"config of {name or '<root>'} ({type(cfg).__name__}).__dict__")
    for modname, pm in list(sys.modules.items()):
        if hasattr(pm, "__dict__"):
            owners.setdefault(id(pm.__dict__), f"globals of {modname}")
    seen: dict = {}
    bad: dict = {}
    orig = gv._State.snap

    def snap(self, cache, roots, watched):
        prev = getattr(self, "_diag_prev", None)
        if prev is not None and len(prev) == len(watched):
            moved = []
            for i, (d, (tag, before)) in enumerate(zip(watched, prev)):
                if gv._tag(d) != tag:
                    keys = sorted({k for k in set(before) | set(d) if k not in before or k not in d
                                   or before[k] is not d[k]}, key=str)
                    moved.append(f"    [{i}] {owners.get(id(d), type(d).__name__ + ' ' + str(list(d)[:6]))}: "
                                 f"keys changed {keys[:8]}")
            moved += [f"    root [{i}] is a new object: {type(r).__name__}" for i, (r, q) in
                      enumerate(zip(roots, self._diag_roots)) if r is not q]
            key = "\n".join(moved)
            seen[key] = seen.get(key, 0) + 1
        for i, d in enumerate(watched):
            if not gv._plain_reads(d) and (type(d) is not collections.OrderedDict or i in self.exact and len(d) > 1):
                bad[f"    {type(d).__name__} [{i}, exact={i in self.exact}] "
                    f"{owners.get(id(d), 'keys ' + str(list(d)[:8]))}"] = 1
        self._diag_prev, self._diag_roots = [(gv._tag(d), dict(d)) for d in watched], roots
        return orig(self, cache, roots, watched)

    gv._State.snap = snap
    fn = coil.compile(m)
    step = make_step(fn, _trainable(m), _cast_inputs(built.args, dt), _cast_inputs(built.kwargs, dt), a.mode, dev)
    other = None
    if a.eager_between:
        e = _prepared_copy(built.module, a.mode, dt)
        other = make_step(e, _trainable(e), _cast_inputs(built.args, dt), _cast_inputs(built.kwargs, dt), a.mode, dev)
    hits = [0]
    orig_hit = gv._State.hit
    gv._State.hit = lambda self: (hits.__setitem__(0, hits[0] + 1), orig_hit(self))[1]
    for _ in range(a.calls):
        step()
        if other is not None:
            other()
    print(f"fast-guard hits: {hits[0]} of {a.calls} calls")
    print(f"{a.model} {a.mode} on {dev}, Python {sys.version.split()[0]}; full-guard passes that found a moved tag or a new root:")
    for key, n in seen.items():
        print(f"  {n} pass(es):\n{key or '    (none moved)'}")
    print("watched dicts without a usable version tag (the entry gives up on its fast guard):")
    print("\n".join(bad) or "    none")
    if not seen:
        print("  none (the fast guard held, or no frame had one)")


if __name__ == "__main__":
    main()
