"""Where the GPU time of one training step goes, coil against torch.compile, kernel by kernel.

    python benchmarks/gpu_train_profile.py --model b_efficientnet_b0 --out $OUT   # the H200
    python benchmarks/gpu_train_profile.py --model b_efficientnet_b0 --device cpu --size small

For a broad-suite model (``coil.bench.broad``, random weights) in the suite's AMP training
step (``coil.bench.suite.make_step``, mode ``train``): per compiler, the first call's
seconds, wall ms per step (synchronized), GPU ms per step (the sum of the kernels' device
time from ``torch.profiler``), kernels per step, and the top kernels by total device time
with calls per step. Kernels are grouped by family (the name with digits dropped), so
torch.compile's generated kernels of one kind read as one line each; coil's keep their
names, and each of coil's top kernels is followed by the generated kernel it was compiled
from (its header from the compile log: kind, sizes, fused buffers, loads) and its config.
The report goes to ``<out>/train_profile_<model>.txt`` and stdout.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter

import torch


def _family(name: str) -> str:
    if name.startswith("coil_"):
        return name  # a generated kernel: named by its source's hash (_coil_kernels)
    name = re.sub(r"\d+", "N", name)
    return name[:90]


def _coil_kernels(trace_dir: str) -> dict:
    """Compiled kernel name -> "generated name config {...}; header lines" from coil's compile log."""
    import json
    records = []
    for f in os.listdir(trace_dir):
        if f.endswith(".jsonl"):
            with open(os.path.join(trace_dir, f)) as fh:
                records += [json.loads(line) for line in fh]
    heads = {r["name"][7:]: [ln[2:] for ln in r.get("text", "").splitlines() if ln.startswith("# ")][:3]
             for r in records if r["event"] == "artifact" and r.get("name", "").startswith("kernel ")}
    return {r.get("compiled_name"): f"{r.get('kernel')} config {r.get('chosen')}; "
            + " | ".join(heads.get(r.get("kernel"), []))
            for r in records if r["event"] == "autotune"}


def _profile(step, steps: int, device: torch.device) -> tuple[float, int, Counter, Counter]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts, record_shapes=True, with_stack=device.type == "cuda") as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    times, calls = Counter(), Counter()
    for e in prof.events():
        dev = getattr(e, "device_type", None)
        if device.type == "cuda" and str(dev).endswith("CUDA") and not e.name.startswith("## "):
            # ("## Call CompiledFxGraph ... ##": torch.compile's user annotations, a whole graph's span, not a kernel)
            t = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        elif device.type == "cpu" and e.cpu_parent is None:
            t = e.cpu_time_total
        else:
            continue
        times[_family(e.name)] += t / steps / 1000.0
        calls[_family(e.name)] += 1
    total = sum(times.values())
    ops = Counter()
    for k in prof.key_averages():  # ATen ops by the device time of the kernels they launched themselves
        t = getattr(k, "self_device_time_total", None) or getattr(k, "self_cuda_time_total", 0)
        if t and k.key.startswith("aten::"):
            ops[k.key] += t / steps / 1000.0
    _profile.ops = ops
    shaped = sorted(((getattr(k, "self_device_time_total", 0) or 0) / steps / 1000.0, k.key, k.input_shapes)
                    for k in prof.key_averages(group_by_input_shape=True) if k.key.startswith("aten::"))
    _profile.shaped = shaped[::-1][:6]
    stacked = sorted(((getattr(k, "self_device_time_total", 0) or 0) / steps / 1000.0, k.key, k.stack)
                     for k in prof.key_averages(group_by_stack_n=6) if k.key.startswith("aten::"))
    _profile.stacked = stacked[::-1][:4]
    return total, sum(calls.values()) // steps, times, calls


_CLASSES = (("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk", "sm90_", "sm80_")),
            ("attention", ("sdpa", "flash", "fmha", "attention", "efficient")),
            ("conv", ("conv", "cudnn", "implicit", "winograd", "fft")),
            ("generated", ("coil_", "triton_")))


def _classes(times: Counter) -> str:
    """Device ms per step by kernel class (GEMM, attention, convolution, generated, other ATen)."""
    out = Counter()
    for name, ms in times.items():
        low = name.lower()
        kind = next((k for k, keys in _CLASSES if any(key in low for key in keys)), "other")
        out[kind] += ms
    return "  ".join(f"{k} {out[k]:.3f}" for k in [c for c, _ in _CLASSES] + ["other"])


def _host_profile(step, steps: int, top: int, sync) -> str:
    """The host (Python) side of ``steps`` steps under cProfile: the ``top`` functions by own time, µs per step."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    sync()
    prof.disable()
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]
    total = sum(v[2] for v in st.stats.values())
    out = [f"   host, cProfile: {total / steps * 1e6:.0f} us/step of own time; top functions (us/step, calls/step):"]
    for (file, line, fn), (cc, nc, tt, ct, _) in rows:
        out.append(f"     {tt / steps * 1e6:8.1f} {nc / steps:7.1f}  {os.path.basename(file)}:{line} {fn}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=".")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", default=None, help="full (default on CUDA) or small")
    ap.add_argument("--compilers", nargs="+", default=["coil", "inductor"])
    ap.add_argument("--mode", default="train")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--pyprof", type=int, default=0,
                    help="also cProfile the host side of each compiler's steps: the top N functions by own time")
    ap.add_argument("--trace-dir", default=None,
                    help="write coil's compile log here (kernel sources, graphs) instead of a temporary folder")
    a = ap.parse_args()
    import coil
    from coil.bench.broad import BROAD_MODELS
    from coil.bench.suite import _cast_inputs, _mode_dtype, _prepared_copy, _trainable, make_step

    device = torch.device(a.device)
    size = a.size or ("full" if device.type == "cuda" else "small")
    built = BROAD_MODELS[a.model].build(device, size)
    lines = [f"{a.model} ({built.config}), mode {a.mode}, {device}, torch {torch.__version__}"]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    report = {}
    import tempfile
    from coil import trace
    trace_dir = a.trace_dir or tempfile.mkdtemp(prefix="coil_train_profile_")
    for comp in a.compilers:
        torch._dynamo.reset()
        coil.reset()
        if comp == "coil":
            trace.set_dir(trace_dir)
        m = _prepared_copy(built.module, a.mode, _mode_dtype(a.mode))
        fn = {"coil": coil.compile, "inductor": torch.compile}.get(comp, lambda x: x)(m)
        dt = _mode_dtype(a.mode)
        step = make_step(fn, _trainable(m), _cast_inputs(built.args, dt), _cast_inputs(built.kwargs, dt),
                         a.mode, device)
        sync()
        t = time.perf_counter()
        step()
        sync()
        first = time.perf_counter() - t
        for _ in range(3):
            step()
        sync()
        t = time.perf_counter()
        for _ in range(a.steps):
            step()
        sync()
        wall = (time.perf_counter() - t) / a.steps * 1000
        total, kernels, times, calls = _profile(step, a.steps, device)
        report[comp] = times
        lines.append(f"\n== {comp}: first call {first:.1f} s, wall {wall:.2f} ms/step, device "
                     f"{total:.2f} ms/step, {kernels} kernels/step")
        lines.append(f"   by class (ms/step): {_classes(times)}")
        lines.append("   ATen ops by their own kernels' device time (ms/step): " + ", ".join(
            f"{k[6:]} {v:.3f}" for k, v in _profile.ops.most_common(12)))
        lines += [f"     {ms:7.3f} ms  {key} {shapes}" for ms, key, shapes in _profile.shaped if ms > 0]
        lines += [f"     {ms:7.3f} ms  {key} from " + " <- ".join(stack or []) for ms, key, stack in _profile.stacked
                  if ms > 0]
        outs = [o for o in step() if isinstance(o, torch.Tensor)][:4]
        lines.append("   first outputs (shape, stride): " + "; ".join(f"{tuple(o.shape)} {o.stride()}" for o in outs))
        if a.pyprof:
            lines.append(_host_profile(step, a.steps, a.pyprof, sync))
        info = _coil_kernels(trace_dir) if comp == "coil" else {}
        for name, ms in times.most_common(a.top):
            lines.append(f"  {ms:8.3f} ms  {calls[name] / a.steps:6.1f}x  {name}")
            if name in info:
                lines.append(f"        {info[name][:300]}")
    text = "\n".join(lines)
    print(text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"train_profile_{a.model}" + ("" if a.mode == "train" else f"_{a.mode}") + ".txt"), "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
