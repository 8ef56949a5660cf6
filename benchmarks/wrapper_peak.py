"""Planned peak memory of coil's generated wrappers on the CPU: the largest sum of intermediate buffers live at once
(``empty_strided`` allocations and extern kernels' outputs, held while any name refers to them; ``# reuse`` and
``# in place`` bind a name to a live buffer), per compiled graph, in MB, with ``config.inplace_buffers`` on and off.
The graph inputs (parameters, activations saved for the backward) are not counted: this is what the wrapper adds.

    OMP_NUM_THREADS=1 python benchmarks/wrapper_peak.py b_mobilenetv2 --mode infer
    OMP_NUM_THREADS=1 python benchmarks/wrapper_peak.py b_llama_gqa --mode train

The broad suite's small configs (``benchmarks/compile_time_cpu.py``'s stand-ins without timm), fp32 on the C++
backend (``infer``: one ``no_grad`` forward of the model in eval mode at batch 1; ``train``: ``coil bench``'s
training step). Extern outputs are sized by their ``ensure_layout`` line.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1, "uint8": 1, "float64": 8,
          "int8": 1}


def _extent(sizes: str, strides: str) -> int:
    dims = [int(d) for d in sizes.split(",") if d.strip()]
    st = [int(d) for d in strides.split(",") if d.strip()]
    return 1 + sum((d - 1) * s for d, s in zip(dims, st)) if all(dims) else 0


def planned_peak(wrapper: str, extern_bytes: int = 4) -> int:
    """Peak bytes of intermediate buffers the wrapper source ``wrapper`` holds at once (static shapes)."""
    refs: dict = {}
    size: dict = {}
    live = peak = 0
    for line in (ln.strip() for ln in wrapper.splitlines()):
        if m := re.match(r"(buf\d+) = (?:torch\.)?empty_strided\(\(([^)]*)\), \(([^)]*)\).*torch\.(\w+)", line):
            sid = len(size) + 1
            size[sid] = _extent(m.group(2), m.group(3)) * _BYTES.get(m.group(4), 4)
        elif m := re.match(r"(buf\d+) = ensure_layout\(\1, \(([^)]*)\), \(([^)]*)\)\)", line):
            if m.group(1) in refs:
                continue
            sid = len(size) + 1
            size[sid] = _extent(m.group(2), m.group(3)) * extern_bytes
        elif m := re.match(r"(buf\d+) = (buf\d+)  # (reuse|in place)", line):
            refs[m.group(1)] = refs.get(m.group(2))
            continue
        elif (m := re.match(r"del (buf\d+)", line)) and m.group(1) in refs:
            sid = refs.pop(m.group(1))
            if sid is not None and sid not in refs.values():
                live -= size[sid]
            continue
        else:
            continue
        refs[m.group(1)] = sid
        live += size[sid]
        peak = max(peak, live)
    return peak


def _wrappers(name: str, mode: str, inplace: bool) -> list[str]:
    import coil
    from coil import trace
    from coil.trace.report import read_log
    from compile_time_cpu import _broad_step, STAND_INS

    d = tempfile.mkdtemp()
    trace.set_dir(d)
    coil.reset()
    compile_fn = lambda m: coil.compile(m, options={"inplace_buffers": inplace})  # noqa: E731
    try:
        if mode == "train":
            _, step = _broad_step(name, compile_fn)
            step()
        else:
            if name in STAND_INS:
                module, res = STAND_INS[name]()
                args, kwargs = (torch.randn(1, 3, res, res),), {}
            else:
                from coil.bench.broad import BROAD_MODELS
                built = BROAD_MODELS[name].build(torch.device("cpu"), "small")
                module, args, kwargs = built.module, built.args, built.kwargs
            with torch.no_grad():
                compile_fn(module.eval())(*args, **kwargs)
    finally:
        trace.set_dir(None)
    log = read_log(d)
    shutil.rmtree(d, ignore_errors=True)
    return [a.get("text") or "" for c in log.compiles for a in c.artifacts if a.get("name") == "wrapper"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--mode", choices=("infer", "train"), default="infer")
    a = ap.parse_args()
    for name in a.models:
        row = {ip: [planned_peak(w) / 2**20 for w in _wrappers(name, a.mode, ip)] for ip in (False, True)}
        print(f"{name} {a.mode}: MB per graph, inplace_buffers off -> on: " + ", ".join(
            f"{x:.3f} -> {y:.3f}" for x, y in zip(row[False], row[True])), flush=True)


if __name__ == "__main__":
    main()
