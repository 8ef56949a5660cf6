"""Launch-config sweep of coil's kernels against torch.compile's: for the GPU machine.

    python benchmarks/gpu_sweep.py "layer_norm" "rms_norm small" "cross_entropy small"

For each case (microbench.py's shapes; ``small`` = its small shapes) and each code
generation variant (persistent reductions up to the default row length, and looped ones
with ``triton_persistent_rnumel=0``), coil is compiled with a wide grid of launch configs
(XBLOCK, RBLOCK, num_warps, num_stages) in place of its 3-4 candidates; its autotuner
times all of them (``triton.testing.do_bench``, µs) and the 6 best are printed per kernel.
Then, per variant, the CUDA-graph replay time (µs; the kernels alone) of coil with its
default candidates, of coil with the best swept config and of torch.compile, and
torch.compile's chosen configs (its ``*.best_config`` cache files) and kernels per call.
Output is text on stdout. Off CUDA (``GPU_SWEEP_DEVICE=cpu``) a smoke test of the script.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F


def _case(name: str, dev: str):
    g = torch.Generator(device="cpu").manual_seed(0)
    small = name.endswith(" small")
    base = name[: -len(" small")] if small else name
    n, d = (256, 1024) if small or dev != "cuda" else (32768, 4096)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dev, dtype)

    if base == "layer_norm":
        return (lambda x, w, b: F.layer_norm(x, (d,), w, b)), [r(n, d), r(d), r(d)]
    if base == "rms_norm":
        return (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w), [r(n, d), r(d)]
    if base == "softmax":
        return (lambda x: torch.softmax(x, -1)), [r(n, d)]
    if base == "softmax long":
        shape = (256, 8192) if small or dev != "cuda" else (8192, 32768)
        return (lambda x: torch.softmax(x, -1)), [r(*shape)]
    if base == "gelu bf16":
        return (lambda x, b: F.gelu(x + b)), [r(n, d, dtype=torch.bfloat16), r(d, dtype=torch.bfloat16)]
    if base == "cross_entropy":
        rows, v = (n, 1000) if small or dev != "cuda" else (n // 4, 32000)
        t = torch.randint(0, v, (rows,), generator=g).to(dev)
        return (lambda l, t: F.cross_entropy(l, t)), [r(rows, v), t]
    raise SystemExit(f"unknown case {name!r}")


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def sweep_configs(numel, rnumel, persistent, gpu, outer=False, elem_bytes=4):
    """The swept grid (replaces ``triton_runtime.candidate_configs``): every power-of-two
    block shape of 256-16384 elements, num_warps 1-32 giving 2-64 elements per thread,
    num_stages 1 and 3."""
    xcap, rcap = _pow2(numel), _pow2(rnumel)
    out = []
    if rnumel == 1:
        shapes = [(xb, None) for xb in (256, 512, 1024, 2048, 4096, 8192) if xb <= max(xcap, 256)]
    elif persistent:
        shapes = [(xb, rcap) for xb in (1, 2, 4, 8, 16, 32) if xb <= xcap and 128 <= xb * rcap <= 16384]
    else:
        shapes = [(xb, rb) for xb in (1, 2, 4, 8) for rb in (256, 512, 1024, 2048, 4096)
                  if xb <= xcap and rb <= rcap and 256 <= xb * rb <= 8192]
    for xb, rb in shapes:
        elems = xb * (rb or 1)
        for nw in (1, 2, 4, 8, 16, 32):
            if not 2 <= elems // (32 * nw) <= 64:
                continue
            for ns in ((1, 3) if not persistent else (1,)):
                c = dict(XBLOCK=xb, num_warps=nw, num_stages=ns)
                if rb:
                    c["RBLOCK"] = rb
                out.append(c)
    return out or [dict(XBLOCK=min(xcap, 1024), num_warps=4)]


def _graph_us(fn, inputs, do_bench):
    """µs per CUDA-graph replay of ``fn(*inputs)`` (microbench.py's timing); None off
    CUDA or when capture fails."""
    from microbench import _graph_ms
    ms = _graph_ms(fn, inputs, do_bench)
    return None if ms is None else ms * 1e3


def _coil(fn, inputs, options, grid: bool):
    """coil-compiled ``fn`` (its kernels launched once) and its autotune events."""
    import coil
    from coil import trace
    from coil.backends import lookup_backend
    from coil.config import patch
    from coil.runtime import triton_runtime as rt
    tdir = tempfile.mkdtemp()
    saved = rt.candidate_configs
    rt._tuned_in_process.clear()
    trace.set_dir(tdir)
    try:
        if grid:
            rt.candidate_configs = sweep_configs
        torch._dynamo.reset()
        coil.reset()
        with patch(cache_dir=tempfile.mkdtemp(), **options):
            cfn = torch.compile(fn, backend=lookup_backend("coil"))
            cfn(*inputs)
    finally:
        rt.candidate_configs = saved
        trace.set_dir(None)
    events = []
    for path in glob.glob(os.path.join(tdir, "*.jsonl")):
        for line in open(path):
            e = json.loads(line)
            if e.get("event") == "autotune":
                events.append(e.get("payload", e))
    return cfn, events


def _inductor(fn, inputs):
    """torch.compile'd ``fn`` and its chosen launch configs (from a fresh cache dir)."""
    cdir = tempfile.mkdtemp()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cdir
    torch._dynamo.reset()
    ifn = torch.compile(fn)
    ifn(*inputs)
    best = []
    for path in sorted(glob.glob(os.path.join(cdir, "**", "*.best_config"), recursive=True)):
        try:
            cfg = json.load(open(path))
        except (OSError, ValueError):
            continue
        best.append({k: v for k, v in cfg.items() if k in ("XBLOCK", "YBLOCK", "R0_BLOCK", "num_warps",
                                                           "num_stages")})
    return ifn, best


def _kernels_per_call(fn, inputs) -> list[str]:
    """CUDA kernel names launched by one call (torch.profiler)."""
    if not torch.cuda.is_available():
        return []
    from torch.profiler import ProfilerActivity, profile
    fn(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*inputs)
        torch.cuda.synchronize()
    return [e.name[:60] for e in prof.events() if e.device_type.name == "CUDA"]


def main(argv: list[str]) -> int:
    dev = os.environ.get("GPU_SWEEP_DEVICE", "cuda")
    if dev == "cuda":
        from triton.testing import do_bench
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")

        def do_bench(f, return_mode=None):
            f()
            return 0.0
    variants = {"persistent": {}, "looped": {"triton_persistent_rnumel": 0}}
    opts = {} if dev == "cuda" else {"cpu_backend": "triton"}
    for name in argv:
        fn, inputs = _case(name, dev)
        ref = fn(*inputs)
        ifn, ibest = (None, []) if dev != "cuda" else _inductor(fn, inputs)
        i_us = _graph_us(ifn, inputs, do_bench) if ifn else None
        print(f"\n=== {name}: torch.compile graph {i_us and round(i_us, 2)} µs, configs {ibest}, "
              f"kernels {_kernels_per_call(ifn, inputs) if ifn else []}")
        for vname, vopts in variants.items():
            row = []
            for grid in (False, True):
                cfn, events = _coil(fn, inputs, {**opts, **vopts}, grid)
                out = cfn(*inputs)
                ok = torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
                us = _graph_us(cfn, inputs, do_bench)
                row.append((us, ok, events))
            (d_us, d_ok, d_ev), (s_us, s_ok, s_ev) = row
            ratio = (f"{d_us / i_us:.3f} / {s_us / i_us:.3f}" if d_us and s_us and i_us else "-")
            print(f"  [{vname}] coil graph µs default {d_us and round(d_us, 2)}{'' if d_ok else ' WRONG'}, "
                  f"swept best {s_us and round(s_us, 2)}{'' if s_ok else ' WRONG'}; vs torch.compile {ratio}; "
                  f"kernels {_kernels_per_call(cfn, inputs)}")
            for e in d_ev:
                print(f"    default {e.get('compiled_name')}: " + ", ".join(
                    f"{t['config']} {t['ms'] * 1e3:.2f}" for t in e.get("timings", [])))
            for e in s_ev:
                t = e.get("timings", [])
                print(f"    swept {e.get('compiled_name')} ({len(t)} configs): " + ", ".join(
                    f"{c['config']} {c['ms'] * 1e3:.2f}" for c in t[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
