"""Cold compile time of a transformer with and without ``torch.compiler.nested_compile_region``
(docs/hops.md, "Regional compilation").

    python benchmarks/regional_compile_time.py                      # CPU, C++ kernels
    python benchmarks/regional_compile_time.py --cpu-backend triton # CPU, Triton interpreter
    python benchmarks/regional_compile_time.py --device cuda        # the GPU, one call

A GPT-style model (``--layers`` pre-norm blocks: LayerNorm, causal attention through
``scaled_dot_product_attention``, GELU MLP; a linear head; the loss is the sum) is
compiled with ``coil.compile`` twice, each in a fresh process with empty kernel caches
(coil's and Triton's): once plain, once with the block's ``forward`` decorated with
``torch.compiler.nested_compile_region``. For each it prints the first step's seconds
(forward + backward: capture, AOT, lowering, code generation, kernel builds, one run),
the next step's seconds, the compile time (the time spent in capture's cache-miss
handler: capture and the backend's compile of the frame, forward and backward, without
running anything: the Triton interpreter's run time would drown it) and the ratio of
the regional compile time to the plain one. Each child also checks the loss and every
parameter's gradient against eager (same weights), and reports the compile log's
stage times (``--stages``: with ``COIL_TRACE`` on, which adds logging time). Each child
first compiles a one-op function, so coil's start-up (imports, the first kernel build)
is not counted for either; ``--no-warmup`` counts it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def build(layers: int, dim: int, heads: int, region: bool):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
            self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
            self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(dim, dim=-1)
            q, k, v = [z.view(b, t, heads, dim // heads).transpose(1, 2) for z in (q, k, v)]
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, dim))
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    if region:
        Block.forward = torch.compiler.nested_compile_region(Block.forward)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.head = torch.nn.Linear(dim, 16)

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return self.head(x).float().sum()

    return Model()


def child(a) -> dict:
    import copy

    import torch
    import coil

    torch.manual_seed(0)
    dev = torch.device(a.device)
    if not a.no_warmup:   # coil's one-time start-up (imports, first kernel build) apart
        w = torch.randn(8, device=dev, requires_grad=True)
        coil.compile(lambda v: (v.sin() * 2).sum())(w).backward()
    from coil.capture import frame   # capture + backend compile of a frame, no run

    spent = [0.0]
    miss = frame._miss_entry

    def timed_miss(*args):
        t = time.perf_counter()
        try:
            return miss(*args)
        finally:
            spent[0] += time.perf_counter() - t

    frame._miss_entry = timed_miss
    model = build(a.layers, a.dim, a.heads, a.region).to(dev)
    ref = copy.deepcopy(model)
    x = torch.randn(a.batch, a.seq, a.dim, device=dev)
    compiled = coil.compile(model)

    def step(m):
        loss = m(x)
        loss.backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return loss

    t0 = time.perf_counter()
    loss = step(compiled)
    first = time.perf_counter() - t0
    for p in model.parameters():
        p.grad = None
    t0 = time.perf_counter()
    loss = step(compiled)
    second = time.perf_counter() - t0
    ref_loss = step(ref)
    tol = dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(loss, ref_loss, **tol)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m: f"grad of {name}: {m}")
    return {"first_s": first, "second_s": second, "compile_s": spent[0]}


def stage_times(log_dir: str) -> dict:
    import collections
    import glob

    out: dict = collections.Counter()
    for f in glob.glob(os.path.join(log_dir, "*.jsonl")):
        for line in open(f):
            r = json.loads(line)
            if r.get("event") == "stage" and r.get("duration_ms") is not None:
                out[r.get("stage")] += r["duration_ms"] / 1e3
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def run_variant(a, region: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as log:
        env = dict(os.environ, COIL_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        if a.cpu_backend:
            env["COIL_CPU_BACKEND"] = a.cpu_backend
            if a.cpu_backend == "triton":
                env["TRITON_INTERPRET"] = "1"
        if a.stages:
            env["COIL_TRACE"] = log
        cmd = [sys.executable, __file__, "--child", "--device", a.device, "--layers", str(a.layers),
               "--dim", str(a.dim), "--heads", str(a.heads), "--seq", str(a.seq),
               "--batch", str(a.batch)] + (["--region"] if region else []) + \
            (["--no-warmup"] if a.no_warmup else [])
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"child failed ({'region' if region else 'plain'}):\n{p.stderr[-4000:]}")
        res = json.loads(p.stdout.strip().splitlines()[-1])
        if a.stages:
            res["stages_s"] = stage_times(log)
        return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cpu-backend", default="", help="cpp (default) or triton (interpreter)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--stages", action="store_true", help="also the compile log's stage times")
    ap.add_argument("--no-warmup", action="store_true",
                    help="time coil's start-up too (by default each child first compiles a "
                         "one-op function, so imports and the first kernel build are not counted)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--region", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a)))
        return
    print(f"# {a.layers} layers, d={a.dim}, {a.batch}x{a.seq} tokens, device {a.device}"
          f"{', cpu backend ' + a.cpu_backend if a.cpu_backend else ''}; cold caches, fresh "
          f"processes{', start-up included' if a.no_warmup else ''}")
    rows = {name: run_variant(a, region) for name, region in (("plain", False), ("region", True))}
    for name, r in rows.items():
        print(f"{name:>7}: first step {r['first_s']:7.2f} s, next step {r['second_s']:.3f} s, "
              f"compile {r['compile_s']:7.2f} s" + (f"  stages {r['stages_s']}" if "stages_s" in r else ""))
    ratio = rows["region"]["compile_s"] / rows["plain"]["compile_s"]
    print(f"regional / plain compile time: {ratio:.3f} (values and gradients equal to eager)")
    print(json.dumps({"config": vars(a), "results": rows, "ratio": ratio}))


if __name__ == "__main__":
    main()
