"""Where a dynamic-shape graph's per-call host time goes on a GPU (issue 17): cProfile of
50 calls of a small pointwise graph compiled with dynamic=True, after warm-up."""
import cProfile, pstats, time, torch, torch._dynamo
from coil.backends.registry import coil_backend_entry as COIL
import coil.runtime.triton_dynamic as td
counts = {"bucket": 0}
orig = td.DynamicTritonLauncher._for_bucket
def fb(self, *a):
    counts["bucket"] += 1
    return orig(self, *a)
td.DynamicTritonLauncher._for_bucket = fb
fn = lambda x, y: x * y + 1
x, y = torch.randn(64, 256, device="cuda"), torch.randn(256, device="cuda")
f = torch.compile(fn, backend=COIL, dynamic=True)
for _ in range(10):
    f(x, y)
torch.cuda.synchronize()
print("buckets chosen", counts)
pr = cProfile.Profile(); pr.enable()
t = time.perf_counter()
for _ in range(50):
    f(x, y)
torch.cuda.synchronize()
pr.disable()
print("per call us", (time.perf_counter() - t) / 50 * 1e6, "buckets chosen", counts)
pstats.Stats(pr).sort_stats("cumulative").print_stats(18)
