"""Per-call overhead of coil's capture (guards + entry) vs torch.compile, backend="eager".

Both sides run the same captured FX graph eagerly, so the difference per call is the
cost of the frame machinery: argument binding, guard evaluation, fetching inputs
(parameters included) and rebuilding outputs. Two programs (issue 3):

  (a) a 4-input pointwise function on tiny tensors;
  (b) a 12-layer GPT-2 (transformers, random weights, n_embd=64) on 1x8 tokens;
  (c) a ResNet-shaped conv net (a stem conv, 16 bottleneck blocks of conv-BN-ReLU x3 with
      a residual, pool, linear: 292 parameters and buffers, ~100 modules) at batch 1:
      per module, the guard checks its type, hook dicts and the constants forward read.

Run: ``python benchmarks/guard_overhead.py [--iters N] [--only convnet]``. Prints per-call
microseconds for eager Python, coil and torch.compile, coil's guard function alone, and
the ratio coil / torch.compile (< 1 means coil is faster). The conv net can also run
through the whole pipeline: ``--backend coil --mode reduce-overhead --device cuda`` (one
H200 call: ``source benchmarks/gpu_env.sh`` first) times a CUDA-graph replay per call,
where the host cost (guard, entry, replay) is what differs from torch.compile.
"""
from __future__ import annotations

import argparse
import time

import torch

import coil


def _per_call_us(fn, args, kwargs, iters):
    for _ in range(20):
        fn(*args, **kwargs)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*args, **kwargs)
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def _guard_us(code, args, fn, iters):
    from coil.capture.frame import _caches

    entry = _caches[code].entries[0]
    bound = tuple(args)
    t0 = time.perf_counter()
    for _ in range(iters):
        entry.guard(*bound, fn)
    return (time.perf_counter() - t0) / iters * 1e6


def pointwise(iters):
    def f(a, b, c, d):
        return (a * b + c).relu() - d

    args = [torch.randn(8) for _ in range(4)]
    coil.reset()
    torch._dynamo.reset()
    cf = coil.compile(f, backend="eager")
    tf = torch.compile(f, backend="eager", dynamic=False)
    res = {"eager": _per_call_us(f, args, {}, iters),
           "coil": _per_call_us(cf, args, {}, iters),
           "torch.compile": _per_call_us(tf, args, {}, iters)}
    res["coil guard only"] = _guard_us(f.__code__, args, f, iters)
    return res


def gpt2(iters):
    import transformers

    cfg = transformers.GPT2Config(n_layer=12, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                  use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 128, (1, 8))
    coil.reset()
    torch._dynamo.reset()
    cm = coil.compile(model, backend="eager")
    tm = torch.compile(model, backend="eager", dynamic=False)
    with torch.no_grad():
        res = {"eager": _per_call_us(model, (), {"input_ids": ids}, iters),
               "coil": _per_call_us(cm, (), {"input_ids": ids}, iters),
               "torch.compile": _per_call_us(tm, (), {"input_ids": ids}, iters)}
        code = cm._compiled_call._coil_code
        from coil.capture.frame import _caches

        entry = _caches[code].entries[0]
        fn = entry  # noqa: F841
        t0 = time.perf_counter()
        n = max(iters // 10, 10)
        for _ in range(n):
            entry.guard(model, (), {"input_ids": ids}, cm._compiled_call._coil_fn)
        res["coil guard only"] = (time.perf_counter() - t0) / n * 1e6
        res["coil guard count"] = len(entry.guards.guards)
    return res


class _Bottleneck(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        nn = torch.nn
        self.c1, self.b1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c3, self.b3 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        return torch.relu(self.b3(self.c3(y)) + x)


def convnet(iters, backend="eager", mode=None, device="cpu"):
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), *[_Bottleneck(8) for _ in range(16)],
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)).eval().to(device)
    x = torch.randn(1, 3, 4, 4, device=device)
    coil.reset()
    torch._dynamo.reset()
    cm = coil.compile(net, backend=backend, mode=mode)
    tm = torch.compile(net, backend="inductor" if backend == "coil" else backend,
                       mode=mode if backend == "coil" else None, dynamic=False)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def timed(fn):
        def run(*a):
            fn(*a)
            sync()
        return run
    with torch.no_grad():
        res = {name: _per_call_us(timed(lambda x, f=f: [f(x) for _ in range(10)]), (x,), {},
                                  max(iters // 10, 5)) / 10
               for name, f in (("eager", net), ("coil", cm), ("torch.compile", tm))}
        from coil.capture.frame import _caches

        entry = _caches[cm._compiled_call._coil_code].entries[0]
        bound = (net, (x,), {}, cm._compiled_call._coil_fn)
        assert entry.guard(*bound)
        res["coil guard only"] = min(_guard_call_us(entry.guard, bound, iters) for _ in range(5))
        res["coil guard count"] = len(entry.guards.guards)
    return res


def _guard_call_us(guard, bound, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        guard(*bound)
    return (time.perf_counter() - t0) / iters * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--only", choices=["pointwise", "gpt2", "convnet"], default=None)
    p.add_argument("--backend", default="eager", help="the conv net's backend (coil: both "
                   "compilers' full pipelines, torch.compile with inductor)")
    p.add_argument("--mode", default=None, help="the conv net's mode (reduce-overhead)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    cases = (("pointwise", "pointwise 4-input", pointwise, args.iters),
             ("gpt2", "GPT-2 12-layer", gpt2, max(args.iters // 20, 20)),
             ("convnet", "conv net 16 blocks", lambda n: convnet(n, args.backend, args.mode,
                                                               args.device), max(args.iters // 10, 20)))
    for key, name, bench, iters in cases:
        if args.only not in (None, key):
            continue
        r = bench(iters)
        ratio = r["coil"] / r["torch.compile"]
        over_c = r["coil"] - r["eager"]
        over_t = r["torch.compile"] - r["eager"]
        print(f"{name}: " + ", ".join(f"{k} {v:.1f}{'' if 'count' in k else ' us'}"
                                      for k, v in r.items()))
        print(f"  coil/torch.compile per call = {ratio:.2f}; overhead over eager: "
              f"coil {over_c:.1f} us, torch.compile {over_t:.1f} us")


if __name__ == "__main__":
    main()
