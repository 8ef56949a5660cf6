"""Per-call cost of a module tree's guards, the full guard alone vs the fast guard of dict
version tags (coil/capture/guard_versions.py): ``OMP_NUM_THREADS=1 python
benchmarks/guard_module_tree.py``.

A MobileNet-like net of 16 blocks (~250 modules, 306 parameters and buffers) compiled with the
coil backend twice, ``config.guard_versions`` off and on. Printed per call, best of 15 rounds,
the two timed interleaved: the guard function and the whole compiled call (CPU kernels)."""
import time

import torch
import torch.nn as nn

import coil
from coil.capture.frame import _caches


class SE(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.fc1, s.act, s.fc2, s.gate = nn.Conv2d(c, c // 4, 1), nn.ReLU(), nn.Conv2d(c // 4, c, 1), nn.Hardsigmoid()

    def forward(s, x):
        return x * s.gate(s.fc2(s.act(s.fc1(x.mean((2, 3), keepdim=True)))))


class Block(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.conv_pw, s.bn1, s.act1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.Hardswish()
        s.conv_dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        s.bn2, s.act2, s.se = nn.BatchNorm2d(c), nn.Hardswish(), SE(c)
        s.conv_pwl, s.bn3, s.drop_path = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.Identity()
        s.has_skip = True

    def forward(s, x):
        sc = x
        x = s.act1(s.bn1(s.conv_pw(x)))
        x = s.act2(s.bn2(s.conv_dw(x)))
        x = s.bn3(s.conv_pwl(s.se(x)))
        return s.drop_path(x) + sc if s.has_skip else x


class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.blocks = nn.Sequential(*[nn.Sequential(Block(16), Block(16)) for _ in range(8)])
        s.head = nn.Linear(16, 10)

    def forward(s, x):
        return s.head(s.blocks(x).mean((2, 3)))


def _build(m, x, versions):
    """The compiled module, its entry's guard and the guard's arguments."""
    coil.reset()
    with coil.config.patch(guard_versions=versions):
        cm = coil.compile(m)
        cm(x)
    entry = next(e for c in _caches.values() for e in c.entries)
    seen, guard = [], entry.guard
    entry.guard = lambda *a: seen.append(a) or guard(*a)
    cm(x)
    entry.guard = guard
    return cm, guard, seen[0]


def _per_call_us(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main():
    torch.manual_seed(0)
    m, x = Net().eval(), torch.randn(1, 16, 8, 8)
    with torch.no_grad():
        built = {k: _build(m, x, k) for k in (False, True)}
        best = {k: [float("inf")] * 2 for k in built}
        for _ in range(15):
            for k, (cm, guard, args) in built.items():
                assert guard(*args) is True
                g = _per_call_us(lambda: guard(*args), 300)
                call = _per_call_us(lambda: cm(x), 100)
                best[k] = [min(best[k][0], g), min(best[k][1], call)]
    for k, (g, call) in best.items():
        print(f"{'fast guard' if k else 'full guard'}: guard {g:7.1f} us   whole call {call:7.1f} us")
    print(f"guard speedup {best[False][0] / best[True][0]:.1f}x")


if __name__ == "__main__":
    main()
