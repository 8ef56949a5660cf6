"""What is live at a broad-suite row's peak of GPU memory, coil against torch.compile: per ``model:mode`` and
compiler (``eager``, ``coil``, ``inductor``), each in its own process, the step is run twice (compile, warm), then
once more with the caching allocator's history recorded (``torch.cuda.memory._record_memory_history``). The
allocation trace is replayed to find the moment the allocated bytes peak, and the blocks live then are printed
largest first, each with the innermost Python frame that allocated it (a line of coil's generated wrapper names
its buffer; torch.compile's output code likewise), then summed by that frame's file.

    python benchmarks/gpu_peak_memory.py b_mobilenetv2:bf16 b_swin_tiny:bf16 --out $OUT [--top 15]

Peaks are bytes allocated beyond what was live before the recorded step (parameters, inputs, the
compiled graphs' constants), in MB. docs/bench.md describes the suite's own peak column (reserved bytes).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys


def peak_blocks(trace: list) -> tuple[int, list]:
    """Replay one device's allocator trace (``snapshot["device_traces"][i]``: dicts with ``action``, ``addr``,
    ``size``, ``frames``) and return (peak bytes above the start, the blocks live at that peak as
    ``(size, frames)``). Only ``alloc`` and ``free_completed`` change what is live."""
    live: dict = {}
    total = peak = 0
    at_peak: list = []
    for ev in trace:
        act = ev.get("action")
        if act == "alloc":
            live[ev["addr"]] = (ev["size"], ev.get("frames") or [])
            total += ev["size"]
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif act == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    return peak, sorted(at_peak, key=lambda b: -b[0])


def _where(frames: list) -> str:
    """The innermost frame outside torch's own Python files (the generated wrapper's line, or the model's)."""
    for f in frames:
        fn = f.get("filename", "")
        if "/torch/" not in fn or "torchinductor" in fn or "/tmp/" in fn:
            return f"{os.path.basename(fn)}:{f.get('line')} {f.get('name', '')}"
    return f"{os.path.basename(frames[0].get('filename', '?'))}:{frames[0].get('line')}" if frames else "?"


def _child(name: str, mode: str, which: str, top: int) -> dict:
    import torch

    import coil
    from coil.bench import suite
    from coil.bench.broad import BROAD_MODELS

    dev = torch.device("cuda")
    built = BROAD_MODELS[name].build(dev, "full")
    dtype = suite._mode_dtype(mode)
    m = suite._prepared_copy(built.module, mode, dtype)
    fn = {"eager": lambda x: x, "coil": coil.compile, "inductor": torch.compile}[which](m)
    step = suite.make_step(fn, suite._trainable(m), suite._cast_inputs(built.args, dtype),
                           suite._cast_inputs(built.kwargs, dtype), mode, dev)
    step(), step()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, blocks = peak_blocks(snap["device_traces"][dev.index or 0])
    by_file = collections.Counter()
    for size, frames in blocks:
        by_file[_where(frames).split(":")[0]] += size
    return {"peak_mb": peak / 2**20,
            "top": [(size / 2**20, _where(frames)) for size, frames in blocks[:top]],
            "by_file": [(f, b / 2**20) for f, b in by_file.most_common(8)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", help="model:mode, e.g. b_mobilenetv2:bf16")
    ap.add_argument("--compilers", default="eager,coil,inductor")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=".")
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(*a.rows[0].split(":"), a.child, a.top)))
        return
    os.makedirs(a.out, exist_ok=True)
    for row in a.rows:
        lines = [f"##### {row}"]
        for which in a.compilers.split(","):
            r = subprocess.run([sys.executable, __file__, row, "--child", which, "--top", str(a.top)],
                               capture_output=True, text=True, timeout=420)
            if r.returncode:
                lines.append(f"{which}: error\n{r.stderr[-2000:]}")
                continue
            res = json.loads(r.stdout.strip().splitlines()[-1])
            lines.append(f"{which}: peak {res['peak_mb']:.1f} MB above the start; by file: " +
                         ", ".join(f"{f} {mb:.1f}" for f, mb in res["by_file"]))
            lines += [f"    {mb:8.2f} MB  {where}" for mb, where in res["top"]]
        text = "\n".join(lines)
        print(text, flush=True)
        with open(os.path.join(a.out, "peak_memory.txt"), "a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
