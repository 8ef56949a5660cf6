"""Repro: a Conv + BatchNorm model trained 3 SGD steps under coil.compile(mode=M), then evaluated (eval(),
no_grad): max |coil - eager| of the eval outputs, per variant. A user probe (benchmarks/ro_probe.py
batchnorm_train_buffers) found 0.09 under reduce-overhead on an H100.

    python benchmarks/ro_bn_eval_repro.py      # the GPU machine; prints one line per variant
"""
import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


def run(mode, train_steps=3, no_grad=True, dev="cuda", tf32=None):
    coil.reset()
    torch.manual_seed(10)
    em = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                       nn.Conv2d(8, 8, 3, stride=2), nn.BatchNorm2d(8),
                       nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).to(dev)
    cmod = copy.deepcopy(em)
    cm = coil.compile(cmod, mode=mode)
    eo, co = torch.optim.SGD(em.parameters(), lr=0.1), torch.optim.SGD(cmod.parameters(), lr=0.1)
    worst_buf = 0.0
    for _ in range(train_steps):
        x, y = torch.randn(4, 3, 12, 12, device=dev), torch.randint(0, 5, (4,), device=dev)
        F.cross_entropy(em(x), y).backward()
        F.cross_entropy(cm(x), y).backward()
        for o in (eo, co):
            o.step()
            o.zero_grad()
        for bc, be in zip(cmod.buffers(), em.buffers()):
            worst_buf = max(worst_buf, float((bc.double() - be.double()).abs().max()))
    worst_p = max(float((a - b).abs().max()) for a, b in zip(cmod.parameters(), em.parameters()))
    em.eval()
    cm.eval()
    errs = []
    ctx = torch.no_grad() if no_grad else torch.enable_grad()
    with ctx:
        for k in range(3):
            x = torch.randn(2, 3, 12, 12, device=dev)
            errs.append(float((cm(x) - em(x)).abs().max()))
    # the same eval graph in a fresh compile of the trained module
    coil.reset()
    fresh = coil.compile(cmod, mode=mode)
    with ctx:
        x = torch.randn(2, 3, 12, 12, device=dev)
        fresh_err = float((fresh(x) - em(x)).abs().max())
    print(f"mode={mode} steps={train_steps} no_grad={no_grad}: eval errs {['%.2g' % e for e in errs]}, "
          f"fresh compile {fresh_err:.2g}; after training: params {worst_p:.2g}, buffers {worst_buf:.2g}", flush=True)


if __name__ == "__main__":
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for mode, steps, ng in [("default", 3, True), ("reduce-overhead", 3, True), ("reduce-overhead", 3, False),
                            ("reduce-overhead", 0, True), ("reduce-overhead", 1, True), ("reduce-overhead", 2, True)]:
        try:
            run(mode, steps, ng, dev)
        except Exception as e:  # noqa: BLE001
            print(f"mode={mode} steps={steps} no_grad={ng}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
    sys.exit(0)
