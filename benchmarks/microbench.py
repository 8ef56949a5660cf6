"""Memory-bound microbenchmarks: achieved bandwidth of coil's kernels vs torch.compile.

For each case the bytes a kernel must move are counted (every input read once, every
output written once) and divided by the median time (CUDA events via
``triton.testing.do_bench``); the ceiling is a measured device-to-device copy.
Graphs are captured by torch's capture and compiled by each backend, so this measures
code generation alone (``--capture coil`` uses coil's capture instead).

Usage:  python benchmarks/microbench.py [--device cuda] [--json out.json]
Prints a markdown table: case, shape, GB/s and % of copy bandwidth for coil and
inductor, and coil/inductor time ratio (< 1 means coil is faster); then the same
function captured in a CUDA graph and replayed (µs per replay, and the ratio): the
kernels' own time, since small shapes' default-mode times are mostly host work.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F


def _cases(dev: str, large: bool):
    g = torch.Generator(device="cpu").manual_seed(0)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dev, dtype)

    n, d = (32768, 4096) if large else (256, 1024)
    cases = []
    x = r(n, d)
    cases.append(("softmax", (n, d), lambda x: torch.softmax(x, -1), [x]))
    w, b = r(d), r(d)
    cases.append(("layer_norm", (n, d), lambda x, w, b: F.layer_norm(x, (d,), w, b), [x, w, b]))
    cases.append(("rms_norm", (n, d),
                  lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, [x, w]))
    cases.append(("gelu(x+b)", (n, d), lambda x, b: F.gelu(x + b), [x, b]))
    xb = x.to(torch.bfloat16)
    cases.append(("gelu(x+b) bf16", (n, d), lambda x, b: F.gelu(x + b), [xb, b.to(torch.bfloat16)]))
    v = 32000 if large else 1000
    logits = r(n // 4 if large else n, v)
    tgt = torch.randint(0, v, (logits.shape[0],), generator=g).to(dev)
    cases.append(("cross_entropy", tuple(logits.shape), lambda l, t: F.cross_entropy(l, t), [logits, tgt]))
    p, gr, m1, m2 = r(n * d // 4), r(n * d // 4), r(n * d // 4), r(n * d // 4).abs()

    def adam(p, g, m, v):
        m2 = m * 0.9 + g * 0.1
        v2 = v * 0.999 + g * g * 0.001
        return p - 1e-3 * m2 / (v2.sqrt() + 1e-8), m2, v2

    cases.append(("adam_update", (n * d // 4,), adam, [p, gr, m1, m2]))
    lr, lc = (8192, 32768) if large else (256, 8192)  # rows an LM's vocabulary long: looped
    xl = r(lr, lc)
    cases.append(("softmax(long rows)", (lr, lc), lambda x: torch.softmax(x, -1), [xl]))
    cases.append(("sum(last)", (n, d), lambda x: x.sum(-1), [x]))
    cases.append(("sum(first)", (n, d), lambda x: x.sum(0), [x]))
    return cases


def _bytes(args, out) -> int:
    outs = out if isinstance(out, (tuple, list)) else [out]
    return sum(t.numel() * t.element_size() for t in list(args) + list(outs) if isinstance(t, torch.Tensor))


def _graph_ms(cfn, inputs, do_bench):
    """Median time (ms) of one CUDA-graph replay of ``cfn(*inputs)``: the kernels alone,
    without the host's per-call work (guards, wrapper, launches), which decides the
    small shapes' default-mode times. None off CUDA or when capture fails."""
    if not torch.cuda.is_available():
        return None
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                cfn(*inputs)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            cfn(*inputs)
        return do_bench(g.replay, return_mode="median")
    except Exception as e:  # noqa: BLE001 - report, keep going
        print(f"    graph capture failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--capture", default="torch", choices=["torch", "coil"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dev = args.device
    import coil
    from coil.backends import lookup_backend
    from triton.testing import do_bench

    copy_src = torch.empty(1 << 28, device=dev)
    copy_dst = torch.empty_like(copy_src)
    t = do_bench(lambda: copy_dst.copy_(copy_src), return_mode="median")
    copy_bw = 2 * copy_src.numel() * 4 / (t * 1e-3) / 1e9
    del copy_src, copy_dst
    rows = []
    print(f"copy bandwidth: {copy_bw:.0f} GB/s")
    print("| case | shape | coil GB/s | coil % copy | inductor GB/s | inductor % copy | coil/inductor time "
          "| graph replay µs coil / inductor | graph coil/inductor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for large in (True, False):
        for name, shape, fn, inputs in _cases(dev, large):
            row = {"case": name, "shape": list(shape)}
            ref = fn(*inputs)
            nbytes = _bytes(inputs, ref)
            for comp in ("coil", "inductor"):
                torch._dynamo.reset()
                try:
                    if comp == "coil" and args.capture == "coil":
                        cfn = coil.compile(fn)
                    else:
                        cfn = torch.compile(fn, backend=lookup_backend(comp))
                    out = cfn(*inputs)
                    outs = out if isinstance(out, (tuple, list)) else [out]
                    refs = ref if isinstance(ref, (tuple, list)) else [ref]
                    ok = all(torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2) for a, b in zip(outs, refs))
                    ms = do_bench(lambda: cfn(*inputs), return_mode="median")
                    row[comp] = {"ms": ms, "gbps": nbytes / (ms * 1e-3) / 1e9, "correct": ok,
                                 "graph_ms": _graph_ms(cfn, inputs, do_bench)}
                except Exception as e:  # report, keep going
                    row[comp] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            rows.append(row)
            c, i = row["coil"], row["inductor"]
            def fmt(x):
                if "error" in x:
                    return "error", "—"
                mark = "" if x["correct"] else " (WRONG)"
                return f"{x['gbps']:.0f}{mark}", f"{100 * x['gbps'] / copy_bw:.0f}%"
            ratio = f"{c['ms'] / i['ms']:.2f}" if "ms" in c and "ms" in i else "—"
            gc, gi = c.get("graph_ms"), i.get("graph_ms")
            graph = (f"{gc * 1e3:.1f} / {gi * 1e3:.1f} | {gc / gi:.2f}" if gc and gi else "— | —")
            print(f"| {name} | {'x'.join(map(str, shape))} | {' | '.join(fmt(c))} | {' | '.join(fmt(i))} "
                  f"| {ratio} | {graph} |")
            if "error" in c:
                print(f"    coil error: {c['error']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbps": copy_bw, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
