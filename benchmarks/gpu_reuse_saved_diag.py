"""Why ``config.cudagraph_reuse_saved`` fails on CUDA ("Trying to resize storage that is not
resizable"): runs the SmallGPT training step of ``coil bench --mode reduce-overhead`` with it
on, checks every tensor ``Tree._lend_saved`` builds against the storage it is built over, and
prints each failure's full traceback (the tree's skip reason keeps only its message).

    python benchmarks/gpu_reuse_saved_diag.py        # the H200, < 1 minute
"""
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import coil  # noqa: E402
from coil.config import config  # noqa: E402
from coil.runtime import cudagraph_trees as ct  # noqa: E402
from coil.bench import reduce_overhead as ro  # noqa: E402

config.cudagraph_reuse_saved = True
orig_over, orig_lend, orig_capture = ct._tensor_over, ct.Tree._lend_saved, None


def checked_over(storage, dtype, size, stride, offset, meta=None):
    need = (offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1) * dtype.itemsize \
        if all(s > 0 for s in size) else 0
    if need > storage.nbytes():
        print(f"LENT TOO SMALL: storage {storage.nbytes()} B < {need} B for size {tuple(size)} "
              f"stride {tuple(stride)} offset {offset} {dtype}", flush=True)
    return orig_over(storage, dtype, size, stride, offset, meta)


def lend(self, static_args):
    before = [(tuple(a.shape), a.stride(), a.storage_offset(), a.untyped_storage().nbytes(),
               a.untyped_storage().data_ptr()) if isinstance(a, torch.Tensor) else None for a in static_args]
    lent = orig_lend(self, static_args)
    for f, slots in lent.items():
        print(f"lent {len(slots)} slots of {f.fn.name}: "
              + ", ".join(f"slot {k} ptr {f.plan.slots[k][0]:#x} {f.plan.slots[k][1]} B" for k in sorted(slots)),
              flush=True)
    for i, (a, b) in enumerate(zip(static_args, before)):
        if isinstance(a, torch.Tensor) and b is not None and b[4] != 0 and a.untyped_storage().nbytes() != b[3]:
            print(f"  arg {i}: replay storage {b[3]} B, lent storage {a.untyped_storage().nbytes()} B, "
                  f"size {b[0]} stride {b[1]} offset {b[2]}", flush=True)
    return lent


ct._tensor_over, ct.Tree._lend_saved = checked_over, lend
orig_skip = ct.GraphFunction.skip_with


def skip_with(self, reason):
    print(f"SKIP {self.name}: {reason}", flush=True)
    traceback.print_exc()
    orig_skip(self, reason)


ct.GraphFunction.skip_with = skip_with
built = ro.WORKLOADS["train_gpt"].build(torch.device("cuda"), "full")
model = built.module
fn = coil.compile(model, mode="reduce-overhead")
step = built.step_for(fn, model, coil.cudagraph_mark_step_begin)
for i in range(6):
    try:
        loss = step()
        print(f"step {i}: loss {loss[0].item():.5f}", flush=True)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        break
for t in list(ct._ALL_TREES):
    for n in t.all_nodes:
        print(n.fn.name, n.fn.kind, "consumes", {f.fn.name: sorted(s) for f, s in n.consumes.items()})
