"""Per-call cost of a dynamic cache entry's guard function against a static one's
(docs/dynamic_shapes.md, "Per-call guard cost"): ``python benchmarks/dynamic_guard_cost.py``.

Two programs: ``x @ w + y`` over three input tensors (every dim symbolic under
``dynamic=True``), and a module (an 8-layer MLP, batch dim symbolic: its 16 parameters
checked in the same C++ batch either way). Both guards of a program are compiled first,
then timed interleaved (best of 40 x 1000 calls each), so load from other processes
hits both alike."""
import time

import torch

import coil
from coil.capture.frame import _caches


def f(x, y, w):
    return (x @ w + y).relu()


def _guard(fn, args, dynamic):
    """The entry's guard function and the arguments a call passes it."""
    coil.reset()
    cf = coil.compile(fn, backend="eager", dynamic=dynamic)
    cf(*args)
    entry, seen = next(iter(_caches.values())).entries[0], []
    guard = entry.guard
    entry.guard = lambda *a: seen.append(a) or guard(*a)
    cf(*args)
    return guard, seen[0]


def _time(name, fn, args):
    (static, guard_args), (dynamic, dyn_args) = _guard(fn, args, False), _guard(fn, args, True)
    assert static(*guard_args) and dynamic(*dyn_args), "a guard rejects the call it was built for"
    best = {"static": float("inf"), "dynamic": float("inf")}
    for _ in range(40):
        for kind, g, a in (("static", static, guard_args), ("dynamic", dynamic, dyn_args)):
            t = time.perf_counter()
            for _ in range(1000):
                g(*a)
            best[kind] = min(best[kind], (time.perf_counter() - t) / 1000 * 1e6)
    print(f"{name}: guard per call: static {best['static']:.2f} us, dynamic "
          f"{best['dynamic']:.2f} us, ratio {best['dynamic'] / best['static']:.2f}")


def main():
    args = (torch.randn(8, 16), torch.randn(8, 32), torch.randn(16, 32))
    _time("x @ w + y (3 inputs, 6 symbolic dims)", f, args)
    mlp = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    _time("8-layer MLP (16 parameters, batch symbolic)", mlp, (torch.randn(8, 64),))


if __name__ == "__main__":
    main()
