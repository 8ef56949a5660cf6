"""coil's host overhead per training step and per generated-kernel launch, on CPU, kernels left out.

A RegNetY-like CNN built from torch.nn (no timm: grouped 3x3 convs, squeeze-excitation, BatchNorm, ReLU/SiLU,
residual adds; BLOCKS blocks) is compiled with the Triton backend on CPU (``cpu_backend="triton"``), trained one real
step (kernels in Triton's interpreter: minutes), then every ``TritonLauncher``'s launch (``_call``) becomes a no-op:
what remains is the wrappers' Python (allocations, views, ``ensure_layout``, ``del``), each launcher's own dispatch,
the extern ATen calls (convolutions: real work) and coil's runtime around the graphs (guards, autograd Function,
saved tensors, outputs), plus the eager loss and autograd's engine. (a) the externs, timed call by call, are taken
out: (b) = step - (a), per launch = (b) / launches. Less noisy, the step again with every extern call returning the
recorded step's outputs (no extern work; their outputs then are not freed, and weight gradients are copied by
AccumulateGrad). A GPU launch itself (a C call of a few µs) is in no number. Times: this thread's CPU time (the
machine may be shared), the least of ROUNDS means of STEPS steps, the three kinds of rounds alternating.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/host_overhead_cpu.py [--blocks 20] [--size 32] [--batch 2] [--amp]
"""
import argparse
import itertools
import time

import torch
import torch.nn as nn


class SE(nn.Module):
    def __init__(self, c, r):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * self.fc2(torch.relu(self.fc1(s))).sigmoid()


class Block(nn.Module):
    def __init__(self, cin, cout, stride, group_width=8):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(cout, cout, 3, stride, 1, groups=cout // group_width, bias=False),
                               nn.BatchNorm2d(cout), nn.SiLU())
        self.se = SE(cout, max(cin // 4, 4))
        self.c = nn.Sequential(nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else None)

    def forward(self, x):
        sc = x if self.down is None else self.down(x)
        return torch.relu(self.c(self.se(self.b(self.a(x)))) + sc)


class RegNetLike(nn.Module):
    def __init__(self, blocks=20, widths=(16, 32, 64, 128), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        per = [blocks // 4 + (i < blocks % 4) for i in range(4)]
        layers, cin = [], widths[0]
        for w, n in zip(widths, per):
            for j in range(n):
                layers.append(Block(cin, w, 2 if j == 0 and w != widths[0] else 1))
                cin = w
        self.body, self.head = nn.Sequential(*layers), nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).mean((2, 3)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--amp", action="store_true", help="under torch.autocast('cpu', bfloat16)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    clock = time.thread_time  # this thread's CPU time: the machine may be shared
    import gc
    import coil
    from coil.codegen import CompiledGraph
    from coil.runtime.triton_runtime import TritonLauncher

    torch.manual_seed(0)
    model = RegNetLike(a.blocks)
    cm, params = coil.compile(model, options={"cpu_backend": "triton"}), list(model.parameters())
    x, y = torch.randn(a.batch, 3, a.size, a.size), torch.randint(0, 10, (a.batch,))

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=a.amp):
            loss = nn.functional.cross_entropy(cm(x), y)
        loss.backward()
        for p in params:
            p.grad = None

    t = time.perf_counter()
    step()  # compiles; kernels run in the interpreter
    print(f"first step (compile + interpreter): {time.perf_counter() - t:.0f} s")
    launchers = [o for o in gc.get_objects() if isinstance(o, TritonLauncher)]
    graphs = [o for o in gc.get_objects() if isinstance(o, CompiledGraph)]
    count = [0]
    for lau in launchers:  # the launch itself: gone (counted once)
        lau._call = lambda *args: count.__setitem__(0, count[0] + 1)
    step()
    launches = count[0]
    for lau in launchers:
        lau._call = lambda *args: None
    ext, record = [0.0, 0], {}  # extern ATen calls of the wrappers (their ``extern<n>`` globals)

    def timed(f):  # (a): each call timed
        def g(*args, **kwargs):
            t0 = clock()
            try:
                return f(*args, **kwargs)
            finally:
                ext[0] += clock() - t0
                ext[1] += 1
        return g

    def recorded(f, key):
        return lambda *args, **kwargs: record.setdefault(key, []).append(f(*args, **kwargs)) or record[key][-1]
    def replayed(key):  # the recorded step's outputs again: no extern work at all
        return (lambda it: lambda *args, **kwargs: next(it))(itertools.cycle(record[key]))

    wrapped = [(cg.call.__globals__, k, v) for cg in graphs for k, v in list(cg.call.__globals__.items())
               if k.startswith("extern")]
    print(f"{len(launchers)} launchers, {launches} launches/step, {len(graphs)} graphs, {len(wrapped)} externs")

    def timed_run(n, how=None):
        for glb, k, v in wrapped:
            glb[k] = how(v, (id(glb), k)) if how else v
        t0 = clock()
        for _ in range(n):
            step()
        return (clock() - t0) / n * 1e6

    timed_run(1, recorded)
    best_total = best_ext = best_replay = float("inf")
    for _ in range(a.rounds):  # alternating: plain steps, steps with the externs timed, steps with them replayed
        best_total = min(best_total, timed_run(a.steps))
        ext[:] = [0.0, 0]
        timed_run(a.steps, lambda v, key: timed(v))
        best_ext = min(best_ext, ext[0] / a.steps * 1e6)
        best_replay = min(best_replay, timed_run(a.steps, lambda v, key: replayed(key)))
    other = best_total - best_ext
    print(f"step {best_total:.0f} µs (least of {a.rounds} means of {a.steps} steps); (a) externs: {ext[1] // a.steps} "
          f"calls {best_ext:.0f} µs; (b) everything else {other:.0f} µs/step = {other / launches:.2f} µs/launch; "
          f"with externs replayed: {best_replay:.0f} µs/step = {best_replay / launches:.2f} µs/launch")

if __name__ == "__main__":
    main()
