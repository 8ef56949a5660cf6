"""coil's host path per call of a reduce-overhead decoding step (or, with ``--train``, training step), on CPU, with the CUDA graph
replay left out: the bench's ``CachedDecoder`` (coil/bench/reduce_overhead.py; layers as
given, small widths: the host path depends on the number of inputs, not their sizes) under
``mode="reduce-overhead"``, its tree recording through a recorder whose replay does nothing.
Prints wall and main-thread CPU µs per step (the least of 50 blocks); ``--sample`` adds a sampling profile of the main
thread (inclusive and exclusive shares by function; cProfile inflates this path several-fold).
The sampler runs only when the main thread lets go of the GIL (every torch op and ctypes call that
releases it, else every 20 µs), so the callers of such calls are over-sampled: time a suspect alone.

``--train``: the bench's ``train_gpt`` step (``_WithLoss(SmallGPT)``, layers as given, default 6,
small widths): compiled forward with the loss inside, ``loss.backward()`` (the compiled backward,
replayed from its own tree node), gradients set to None each step; the optimizer is left out
(eager and the same for every compiler). ``--amp``: under ``torch.autocast("cpu", bfloat16)``,
as the bench's step runs under CUDA's.

    python benchmarks/ro_host_path_cpu.py [LAYERS] [--train [--amp]] [--sample]      # < 1 minute
"""
import collections
import os
import sys
import threading
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "runtime")]

import coil  # noqa: E402
from coil.bench.models import SmallGPT  # noqa: E402
from coil.bench.reduce_overhead import CachedDecoder, _WithLoss  # noqa: E402
from coil.runtime import cudagraph_trees as ct  # noqa: E402
from fake_recorder import FakeRecorder  # noqa: E402


class NullRecorder(FakeRecorder):
    """Captures by running once; replays nothing (the host path alone is timed)."""

    def capture(self, fn, args, boxed=None, written=()):
        self.captures += 1
        return None, (boxed(list(args)) if boxed is not None else fn(*args))

    def replay(self, graph):
        self.replays += 1


def sample(step, n: int, interval: float = 2e-4) -> None:
    """Run ``step`` n times while a thread samples the main thread's stack."""
    incl, excl, tid, done = collections.Counter(), collections.Counter(), threading.get_ident(), []

    def key(f):
        return f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_firstlineno}:{f.f_code.co_name}"

    def sampler():
        while not done:
            time.sleep(interval)
            f = sys._current_frames().get(tid)
            if f is not None:
                excl[key(f)] += 1
                seen = set()
                while f is not None:
                    seen.add(key(f))
                    f = f.f_back
                for k in seen:
                    incl[k] += 1
    old = sys.getswitchinterval()
    sys.setswitchinterval(2e-5)
    t = threading.Thread(target=sampler, daemon=True)
    t.start()
    for i in range(n):
        step(i)
    done.append(1)
    t.join()
    sys.setswitchinterval(old)
    total = max(1, sum(excl.values()))
    for title, c in (("inclusive", incl), ("exclusive", excl)):
        print(f"-- {title} ({total} samples)")
        for k, v in c.most_common(25):
            print(f"{100 * v / total:5.1f}% {k}")


def report(label, tree, step, n, blocks: int = 50) -> None:
    """Time ``n`` steps in ``blocks`` blocks; print the least wall and the least CPU time of a block (on a shared
    machine, the least disturbed: a block whose wall time is near its CPU time ran alone)."""
    walls, cpus = [], []
    for b in range(blocks):
        t0, c0 = time.perf_counter(), time.thread_time()
        for i in range(n // blocks):
            step(i)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    wall, cpu = (1e6 * min(x) / (n // blocks) for x in (walls, cpus))
    print(f"{label}: {wall:.1f} µs wall, {cpu:.1f} µs CPU per step, least of {blocks} blocks of "
          f"{n // blocks} ({tree.recorder.captures} captures, {tree.recorder.replays} replays)")
    if "--sample" in sys.argv:
        sample(step, 3 * n // 2)


def train(layers: int, tree) -> None:
    torch.manual_seed(0)
    m = _WithLoss(SmallGPT(64, 16, 2, layers, 16)).train()
    fn = coil.compile(m, mode="reduce-overhead")
    ids = torch.randint(0, 64, (2, 17))
    params = list(m.parameters())

    amp = "--amp" in sys.argv

    def step(i):
        coil.cudagraph_mark_step_begin()
        for p in params:
            p.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = fn(ids)
        loss.backward()

    for i in range(4):
        step(i)
    report(f"train{' (autocast)' if amp else ''}, {layers} layers, {len(params)} parameters", tree, step, 2000)


def main() -> None:
    is_train = "--train" in sys.argv
    layers = int(next((a for a in sys.argv[1:] if a.isdigit()), 6 if is_train else 12))
    tree = ct.Tree(NullRecorder("cpu"))
    ct.pick_tree, ct.cuda_available, ct.ungraphable_reason = (lambda args: tree), (lambda: True), (lambda gm: None)
    if is_train:
        return train(layers, tree)
    torch.manual_seed(0)
    fn = coil.compile(CachedDecoder(512, 64, 4, layers, 96, 1).eval(), mode="reduce-overhead")
    positions = [torch.tensor([64 + i]) for i in range(32)]
    state = {}

    def step(i):
        coil.cudagraph_mark_step_begin()
        state["nxt"], _ = fn(state["nxt"].clone(), positions[i % 32])

    with torch.no_grad():
        state["nxt"], _ = fn(torch.randint(0, 512, (1, 64)), torch.arange(64))
        for i in range(3):
            step(i)
        report(f"{layers} layers", tree, step, 2000)


if __name__ == "__main__":
    main()
