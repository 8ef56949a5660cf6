"""Per-call cost of a dynamic cache entry's guard function against a static one's
(docs/dynamic_shapes.md, "Per-call guard cost"): ``python benchmarks/dynamic_guard_cost.py``.

Both guards are compiled first, then timed interleaved (best of 40 x 1000 calls each),
so load from other processes hits both alike."""
import time

import torch

import coil
from coil.capture.frame import _caches


def f(x, y, w):
    return (x @ w + y).relu()


def _guard(dynamic):
    coil.reset()
    cf = coil.compile(f, backend="eager", dynamic=dynamic)
    args = (torch.randn(8, 16), torch.randn(8, 32), torch.randn(16, 32))
    cf(*args)
    return next(iter(_caches.values())).entries[0].guard, args + (f,)


def main():
    static, args = _guard(False)
    dynamic, _ = _guard(True)
    best = {"static": float("inf"), "dynamic": float("inf")}
    for _ in range(40):
        for name, g in (("static", static), ("dynamic", dynamic)):
            t = time.perf_counter()
            for _ in range(1000):
                g(*args)
            best[name] = min(best[name], (time.perf_counter() - t) / 1000 * 1e6)
    print(f"guard per call: static {best['static']:.2f} us, dynamic {best['dynamic']:.2f} us, "
          f"ratio {best['dynamic'] / best['static']:.2f}")


if __name__ == "__main__":
    main()
