"""Where coil's compile time goes: cProfile of the compiling calls of a transformers model.

    python benchmarks/compile_profile.py --out $OUT                         # the H200
    python benchmarks/compile_profile.py --device cpu --size small --out /tmp/p  # CPU smoke test

The model (transformers GPT-2 124M or the 8-layer LLaMA of ``coil bench``, bf16, eval,
batch 4) is compiled with ``coil.compile`` (``dynamic=None``) and called at ``--lengths``
in order (64, 96: the first compile is static, the second automatic dynamic). Per call:
its wall seconds; from the compile log (``COIL_TRACE``, which sees the compile threads a
profiler does not) each compile's stages by self time and its events by count (autotune,
compile-pool jobs, ...), and the runtime events the call logged with the seconds they
name; with ``--cprofile`` the top functions of the calling thread by cumulative time.
``--after inductor coil-static`` first compiles the model with those (kept alive) in the
same process, as ``coil bench --mode dynamic`` does: there coil's compiles took 2-3x
their time alone.
``--broad NAME --mode train|bf16`` instead profiles the first step of a broad-suite model
(``coil.bench.broad``, the step ``coil bench`` times: AMP training or bf16 inference) with
coil, then the same first step with torch.compile (wall seconds and its
``compile_times()``), each on a fresh copy of the model:

    python benchmarks/compile_profile.py --broad b_gpt2 --mode train --cprofile --out $OUT

The report goes to ``<out>/compile_profile_<model>.txt`` and stdout.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import torch


def _report(prof: cProfile.Profile, top: int) -> str:
    st = pstats.Stats(prof)
    out = io.StringIO()
    st.stream = out
    st.sort_stats("cumulative").print_stats(r"coil/|triton/|_subclasses|sym_node|symbolic_shapes|"
                                            r"proxy_tensor|subprocess|importlib", top)
    st.sort_stats("tottime").print_stats(top // 2)  # self time, every module
    n = t = 0.0
    for (fname, _, func), (_, nc, _, ct, _) in st.stats.items():
        if fname.endswith(os.path.join("triton", "compiler", "compiler.py")) and func == "compile":
            n, t = n + nc, t + ct
    head = f"triton.compiler.compile: {int(n)} calls, {t:.1f} s\n"
    return head + "\n".join(l[:230] for l in out.getvalue().splitlines())


class _Sampler:
    """Samples the calling thread's Python stack every ``interval`` seconds from a helper
    thread (``sys._current_frames``): a profile that another profiler or an eval-frame
    hook cannot disturb. :meth:`report` gives, per function, the share of samples in which
    it is on the stack (inclusive) and on top (self)."""

    def __init__(self, interval: float = 0.005):
        import collections
        import sys
        import threading
        self.interval, self.n = interval, 0
        self.incl, self.top = collections.Counter(), collections.Counter()
        self._tid, self._stop = threading.get_ident(), threading.Event()

        def run():
            while not self._stop.wait(self.interval):
                f = sys._current_frames().get(self._tid)
                seen = set()
                if f is not None:
                    self.n += 1
                    self.top[_where(f)] += 1
                while f is not None:
                    w = _where(f)
                    if w not in seen:
                        seen.add(w)
                        self.incl[w] += 1
                    f = f.f_back
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def report(self, top: int) -> str:
        self._stop.set()
        self._thread.join()
        n = max(self.n, 1)
        lines = [f"sampled profile: {self.n} samples every {self.interval * 1e3:.0f} ms; inclusive share:"]
        lines += [f"  {100 * c / n:5.1f}%  {w}" for w, c in self.incl.most_common(top)]
        lines.append("self share:")
        lines += [f"  {100 * c / n:5.1f}%  {w}" for w, c in self.top.most_common(top // 2)]
        return "\n".join(lines)


def _where(f) -> str:
    c = f.f_code
    parts = c.co_filename.split(os.sep)
    return f"{'/'.join(parts[-2:])}:{c.co_firstlineno}({c.co_name})"


def _log_summary(log_dir: str, seen: set) -> str:
    """Stages and event counts of the compiles (and loose runtime records) not in ``seen``."""
    import collections
    from coil.trace.report import read_log
    try:
        log = read_log(log_dir)
    except FileNotFoundError:
        return "(no compile log)"
    lines = []
    for c in log.compiles:
        if (c.pid, c.compile_id) in seen:
            continue
        seen.add((c.pid, c.compile_id))
        selfs = sorted(c.stage_self_totals().items(), key=lambda kv: -kv[1])[:12]
        lines.append(f"compile {c.compile_id}: {c.total_ms() / 1e3:.1f} s in stages; self s: "
                     + ", ".join(f"{k} {v / 1e3:.1f}" for k, v in selfs))
        counts = collections.Counter(r.get("event") for r in c.events)
        lines.append("  events: " + ", ".join(f"{k} x{n}" for k, n in counts.most_common(14)))
    new = [r for r in log.loose if id(r) not in seen]
    counts = collections.Counter(r.get("event") for r in new)
    secs = collections.Counter()
    for r in new:
        for k in ("seconds", "compile_s", "duration_s"):
            if isinstance(r.get(k), (int, float)):
                secs[r.get("event")] += r[k]
        if isinstance(r.get("duration_ms"), (int, float)):
            secs[r.get("event")] += r["duration_ms"] / 1e3
    lines.append("runtime events (all calls so far): " + ", ".join(
        f"{k} x{n}" + (f" ({secs[k]:.1f} s)" if secs[k] else "") for k, n in counts.most_common(14)))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--size", default="full", choices=["full", "small"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lengths", nargs="+", type=int, default=[64, 96])
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--out", default=".")
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--sample", action="store_true",
                    help="with --broad: a sampled profile of coil's first step (stack every 5 ms)")
    ap.add_argument("--after", nargs="*", default=[], choices=["inductor", "coil-static"],
                    help="first compile and call the same model with these (at --lengths[0]) "
                         "in this process: does a compiled copy slow coil's compiles down?")
    ap.add_argument("--broad", help="a broad-suite model name (coil.bench.broad)")
    ap.add_argument("--mode", default="train", choices=["train", "bf16"])
    a = ap.parse_args()
    if a.broad:
        return _broad(a)
    import coil
    from coil import trace
    from coil.bench.dynamic import build

    log_dir = os.path.join(a.out, "compile_profile_log")
    trace.set_dir(log_dir)
    seen: set = set()
    from coil.bench.models import _ids

    dev = torch.device(a.device)
    m = build(a.model, dev, a.size)
    text = [f"{a.model} ({a.size}) on {dev}, torch {torch.__version__}"]
    with torch.no_grad():
        for other in a.after:   # kept alive, as in `coil bench --mode dynamic`
            g = torch.compile(m) if other == "inductor" else coil.compile(m, dynamic=False)
            t0 = time.perf_counter()
            g(input_ids=_ids(4, a.lengths[0], m.config.vocab_size, dev))
            text.append(f"=== {other} first: {time.perf_counter() - t0:.2f} s")
            print(text[-1], flush=True)
            seen_log = _log_summary(log_dir, seen)  # noqa: F841 - marks its compiles seen
    f = coil.compile(m)
    with torch.no_grad():
        for length in a.lengths:
            ids = _ids(4, length, m.config.vocab_size, dev)
            prof = cProfile.Profile() if a.cprofile else None
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            f(input_ids=ids)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if prof:
                prof.disable()
            text.append(f"\n=== L={length}: first call {time.perf_counter() - t0:.2f} s\n"
                        + _log_summary(log_dir, seen) + ("\n" + _report(prof, a.top) if prof else ""))
            print(text[-1], flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"compile_profile_{a.model}.txt"), "w") as fh:
        fh.write("\n".join(text))


def _broad(a) -> None:
    """The first step of a broad-suite model, coil then torch.compile (see the docstring)."""
    import coil
    from coil import trace
    from coil.bench import suite
    from coil.bench.broad import BROAD_MODELS

    log_dir = os.path.join(a.out, "compile_profile_log")
    trace.set_dir(log_dir)
    dev = torch.device(a.device)
    built = BROAD_MODELS[a.broad].build(dev, "full" if dev.type == "cuda" else "small")
    text = [f"{a.broad} {a.mode} on {dev}, torch {torch.__version__}: {built.config}"]
    for name in ("coil", "torch.compile"):
        m = suite._prepared_copy(built.module, a.mode, suite._mode_dtype(a.mode))
        fn = coil.compile(m) if name == "coil" else torch.compile(m)
        step = suite.make_step(fn, suite._trainable(m), suite._cast_inputs(built.args, suite._mode_dtype(a.mode)),
                               suite._cast_inputs(built.kwargs, suite._mode_dtype(a.mode)), a.mode, dev)
        prof = cProfile.Profile() if a.cprofile and name == "coil" else None
        sampler = None
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        if a.sample and name == "coil":
            sampler = _Sampler()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if prof:
            prof.disable()
        text.append(f"\n=== {name}: first step {time.perf_counter() - t0:.2f} s")
        if name == "coil":
            text.append(_log_summary(log_dir, set()) + ("\n" + _report(prof, a.top) if prof else "")
                        + ("\n" + sampler.report(a.top) if sampler else ""))
        else:
            from torch._dynamo.utils import compile_times
            text.append(str(compile_times(repr="str", aggregate=True))[:4000])
        print("\n".join(text[-2:]), flush=True)
        del fn, m, step
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"compile_profile_{a.broad}_{a.mode}.txt"), "w") as fh:
        fh.write("\n".join(text))


if __name__ == "__main__":
    main()
