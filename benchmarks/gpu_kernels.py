"""One kernel, coil vs torch.compile, in detail: for the GPU machine.

    python benchmarks/gpu_kernels.py layer_norm rms_norm "gelu bf16"

For each case (the large shapes of benchmarks/microbench.py): the time (ms, median of
``triton.testing.do_bench``) and % of copy bandwidth for coil and torch.compile; coil's
autotune timings per candidate config (from the compile log's ``autotune`` events) and
its generated Triton source; torch.compile's generated code (its kernels and launch
heuristics, from ``run_and_get_code``). Output is text on stdout.
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
    n, d = (32768, 4096) if dev == "cuda" else (64, 256)  # cpu: a smoke test of this script

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dev)

    if name == "layer_norm":
        return (lambda x, w, b: F.layer_norm(x, (d,), w, b)), [r(n, d), r(d), r(d)]
    if name == "rms_norm":
        return (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w), [r(n, d), r(d)]
    if name == "gelu":
        return (lambda x, b: F.gelu(x + b)), [r(n, d), r(d)]
    if name == "gelu bf16":
        return (lambda x, b: F.gelu(x + b)), [r(n, d).bfloat16(), r(d).bfloat16()]
    if name == "softmax":
        return (lambda x: torch.softmax(x, -1)), [r(n, d)]
    if name == "softmax small long":  # microbench's small long-row shape
        return (lambda x: torch.softmax(x, -1)), [r(256, 8192)]
    if name == "softmax long":
        return (lambda x: torch.softmax(x, -1)), [r(n // 4, d * 8)]
    raise SystemExit(f"unknown case {name!r}")


def main(argv: list[str]) -> int:
    import coil
    from coil import trace
    from coil.backends import lookup_backend

    dev = os.environ.get("GPU_KERNELS_DEVICE", "cuda")
    if dev == "cuda":
        from triton.testing import do_bench
    else:
        import time

        def do_bench(f, return_mode=None):
            f()
            t0 = time.perf_counter()
            for _ in range(3):
                f()
            return (time.perf_counter() - t0) / 3 * 1e3
    src = torch.empty(1 << 28, device=dev)
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() * 4 / (do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3) / 1e9
    del src, dst
    print(f"copy bandwidth {copy_bw:.0f} GB/s")
    for name in argv:
        fn, inputs = _case(name, dev)
        ref = fn(*inputs)
        nbytes = sum(t.numel() * t.element_size() for t in inputs + [ref])
        tdir = tempfile.mkdtemp()
        trace.set_dir(tdir)
        torch._dynamo.reset()
        coil.reset()
        cfn = torch.compile(fn, backend=lookup_backend("coil"))
        out = cfn(*inputs)
        trace.set_dir(None)
        ok = torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
        ms_c = do_bench(lambda: cfn(*inputs), return_mode="median")
        torch._dynamo.reset()
        from torch._inductor.utils import run_and_get_code
        ifn = torch.compile(fn)
        _, codes = run_and_get_code(ifn, *inputs)
        ms_i = do_bench(lambda: ifn(*inputs), return_mode="median")
        pct = lambda ms: 100 * nbytes / (ms * 1e-3) / 1e9 / copy_bw  # noqa: E731
        print(f"\n=== {name}: coil {ms_c:.4f} ms ({pct(ms_c):.1f}%){'' if ok else ' WRONG'}, "
              f"torch.compile {ms_i:.4f} ms ({pct(ms_i):.1f}%), coil/inductor {ms_c / ms_i:.3f}")
        sources = []
        for path in glob.glob(os.path.join(tdir, "*.jsonl")):
            for line in open(path):
                e = json.loads(line)
                if e.get("event") == "autotune":
                    p = e.get("payload", e)
                    print(f"  coil autotune {p.get('compiled_name')}: " + ", ".join(
                        f"{t['config']} {t['ms'] * 1e3:.1f}us" for t in p.get("timings", [])))
                text = json.dumps(e)
                if "@triton.jit" in text:
                    def walk(v):
                        if isinstance(v, dict):
                            for x in v.values():
                                walk(x)
                        elif isinstance(v, list):
                            for x in v:
                                walk(x)
                        elif isinstance(v, str) and "@triton.jit\ndef triton_" in v:
                            sources.append(v[v.index("@triton.jit\ndef triton_"):])
                    walk(e)
        for s in dict.fromkeys(sources):
            print("  --- coil kernel\n" + s)
        for code in codes:
            start = code.find("@triton_heuristics")
            print("  --- torch.compile code\n" + (code[max(0, start - 200):start + 3500] if start >= 0 else code[:2000]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
