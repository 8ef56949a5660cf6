"""GPU check of dynamic-shape kernels (issue 17): values over several sizes with one compiled
graph, Triton binaries per kernel, and static vs dynamic time of memory-bound kernels.
Run: python benchmarks/gpu_dynamic_shapes.py (on a CUDA machine)."""
import torch, torch._dynamo, time, sys, coil
import torch.nn.functional as F
from coil.backends.registry import coil_backend_entry as COIL  # torch.compile(backend=...) without the entry point
import coil.codegen as cg
graphs = []
orig = cg.compile_aten_graph
def spy(gm, ex, dev):
    r = orig(gm, ex, dev); graphs.append(r); return r
cg.compile_aten_graph = spy
dev = "cuda"
def check(name, fn, mk, sizes):
    graphs.clear(); torch._dynamo.reset()
    f = torch.compile(fn, backend=COIL, dynamic=True)
    for n in sizes:
        a = mk(n)
        got, exp = f(*a), fn(*a)
        got = got if isinstance(got, tuple) else (got,); exp = exp if isinstance(exp, tuple) else (exp,)
        for g, e in zip(got, exp):
            tol = dict(atol=1e-2, rtol=1.6e-2) if g.dtype == torch.bfloat16 else dict(atol=2e-3, rtol=2e-3)
            torch.testing.assert_close(g, e, **tol)
    bins = []
    for g in graphs:
        for k in getattr(g, "kernels", []):
            jf = k.launcher.fn
            c = getattr(jf, "device_caches", None) or getattr(jf, "cache", None)
            try:
                nb = sum(len(v[0]) if isinstance(v, tuple) else len(v) for v in c.values())
                if "-v" in sys.argv:
                    for v in c.values():
                        for key in (v[0] if isinstance(v, tuple) else v):
                            print("   key", str(key)[:400])
            except Exception:
                nb = str(type(c))
            bins.append(nb)
    print(name, "graphs", len(graphs), [type(g).__name__ for g in graphs], "binaries per kernel", bins, flush=True)
    return f
check("pointwise", lambda x, y: torch.sigmoid(x * 2 + y), lambda n: (torch.randn(n, 77, device=dev), torch.randn(77, device=dev)), [3, 17, 100, 1000])
check("softmax", lambda x: torch.softmax(x, -1), lambda n: (torch.randn(8, n, device=dev),), [5, 33, 600, 5000])
check("layernorm", lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b), lambda n: (torch.randn(n, 256, device=dev), torch.randn(256, device=dev), torch.randn(256, device=dev)), [3, 50, 700])
check("gelu_bf16", lambda x, b: F.gelu(x + b), lambda n: (torch.randn(n, 1024, device=dev, dtype=torch.bfloat16), torch.randn(1024, device=dev, dtype=torch.bfloat16)), [5, 64, 300])
# timing: static vs dynamic memory-bound kernels
def bench(f, *a, it=50):
    for _ in range(5): f(*a)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(it): f(*a)
    torch.cuda.synchronize(); return (time.perf_counter() - t) / it * 1e6
for name, fn, shape in [("add_mul", lambda x, y: x * y + 1, (32768, 4096)), ("softmax", lambda x, y: torch.softmax(x, -1) + y, (32768, 4096)),
                        ("layer_norm", lambda x, y: F.layer_norm(x, (4096,)) * y, (32768, 4096)), ("small_add", lambda x, y: x * y + 1, (64, 256))]:
    x = torch.randn(*shape, device=dev); y = torch.randn(shape[-1], device=dev)
    torch._dynamo.reset(); fs = torch.compile(fn, backend=COIL, dynamic=False)
    ts = bench(fs, x, y)
    torch._dynamo.reset(); fd = torch.compile(fn, backend=COIL, dynamic=True)
    fd(torch.randn(shape[0] // 2, shape[1], device=dev), y)
    fd(x, y)
    td = bench(fd, x, y)
    print(f"{name} {shape}: static {ts:.1f} us, dynamic {td:.1f} us, ratio {td/ts:.3f}", flush=True)
