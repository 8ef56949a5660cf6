"""Static vs dynamic time of memory-bound reductions on CUDA, interleaved, with the launch
config each chose: the dynamic graph warmed at half the rows first (as
gpu_dynamic_shapes.py).
Run: python benchmarks/gpu_dynamic_reduction_diag.py (on a CUDA machine)."""
import time

import torch
import torch._dynamo
import torch.nn.functional as F

import coil.codegen as cg
from coil.backends.registry import coil_backend_entry as COIL

graphs = []
orig = cg.compile_aten_graph


def spy(gm, ex, dev):
    r = orig(gm, ex, dev)
    graphs.append(r)
    return r


cg.compile_aten_graph = spy


def timed(f, *a, it=50):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(it):
        f(*a)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / it * 1e6


def configs():
    out = []
    for g in graphs:
        for k in getattr(g, "kernels", []):
            ln = k.launcher
            out.append((ln.name, getattr(ln, "chosen", None), getattr(ln, "_tuned", None)))
    return out


CASES = [("softmax", lambda x, y: torch.softmax(x, -1) + y, (32768, 4096)),
         ("layer_norm", lambda x, y: F.layer_norm(x, (4096,)) * y, (32768, 4096)),
         ("softmax 1000", lambda x, y: torch.softmax(x, -1) + y, (65536, 1000)),
         ("sum 50000", lambda x, y: x.sum(-1) + y[0], (2048, 50000))]
for name, fn, shape in CASES:
    x = torch.randn(*shape, device="cuda")
    y = torch.randn(shape[-1], device="cuda")
    fs = {}
    for mode in ("static", "dynamic"):
        graphs.clear()
        torch._dynamo.reset()
        f = torch.compile(fn, backend=COIL, dynamic=mode != "static")
        if mode != "static":
            f(torch.randn(shape[0] // 2, shape[1], device="cuda"), y)
        torch.testing.assert_close(f(x, y), fn(x, y), atol=1e-3, rtol=1e-3)
        for _ in range(5):
            f(x, y)
        fs[mode] = f
        print(name, mode, configs(), flush=True)
    ts = {m: [] for m in fs}
    for _ in range(7):
        for m, f in fs.items():
            ts[m].append(timed(f, x, y))
    med = {m: sorted(v)[len(v) // 2] for m, v in ts.items()}
    print(f"{name} {shape}: " + ", ".join(f"{m} {t:.1f} us ({t / med['static']:.3f})" for m, t in med.items()),
          flush=True)
