"""Bytes saved for backward: coil's min-cut vs default partition vs eager autograd.

    python benchmarks/saved_bytes.py [--device cpu|cuda]

For each model (a small GPT-2 from ``transformers`` with random weights, and a conv
net with BatchNorm), one training forward is run

- eagerly, counting the tensors autograd saves with
  ``torch.autograd.graph.saved_tensors_hooks`` (unique storages, so a weight saved
  by several ops counts once);
- through ``torch.compile(backend=...)`` with coil's AOT autograd and each
  partitioner, summing the bytes of the values the forward graph saves.

Two numbers per row: all saved bytes, and activations only (excluding the graph
inputs: parameters, buffers and the model input). Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from coil.aot import aot_compile, default_partition, min_cut_partition  # noqa: E402
from coil.aot.backend import run_graph  # noqa: E402


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.conv3 = nn.Conv2d(64, 64, 3, padding=1)
        self.bn3 = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.bn3(self.conv3(x)))
        return self.fc(x.mean((2, 3)))


def gpt2(device):
    import transformers as tf

    cfg = tf.GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=512, n_positions=128,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = tf.GPT2LMHeadModel(cfg).to(device)
    ids = torch.randint(0, 512, (4, 128), device=device)
    return model, (ids,), lambda out: out.logits.float().pow(2).mean()


def convnet(device):
    model = ConvNet().to(device)
    x = torch.randn(8, 3, 32, 32, device=device)
    return model, (x,), lambda out: out.pow(2).mean()


def eager_saved(model, inputs):
    """(all bytes, activation bytes) of the unique storages autograd saves."""
    seen = {}
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    excluded |= {x.untyped_storage().data_ptr() for x in inputs}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    total = sum(seen.values())
    acts = sum(v for k, v in seen.items() if k not in excluded)
    return total, acts


def compiled_saved(model, inputs, partition_fn):
    """(all bytes, activation bytes) saved by the forward graphs coil builds."""
    import torch._dynamo  # benchmark: torch's capture feeds coil's backend

    records = []

    def recording(joint, info):
        part = partition_fn(joint, info)
        records.append(part)
        return part

    def backend(gm, example_inputs):
        return aot_compile(gm, example_inputs, run_graph, run_graph, partition_fn=recording)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    compiled(*inputs)
    total = sum(p.saved_bytes for p in records)
    acts = 0
    for p in records:
        inputs_names = {n.name for n in p.fw.graph.nodes if n.op == "placeholder"}
        acts += sum(s["bytes"] for s in p.saved
                    if s["name"] not in inputs_names and "aliases_input" not in s)
    return total, acts, records


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--verbose", action="store_true", help="print each saved tensor")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    for name, make in (("gpt2 (2 layers, d=128, 4x128 tokens)", gpt2),
                       ("convnet (3 conv+BN, 8x3x32x32)", convnet)):
        model, inputs, _ = make(args.device)
        model.train()
        e = eager_saved(copy.deepcopy(model), inputs)
        d = compiled_saved(copy.deepcopy(model), inputs, default_partition)
        m = compiled_saved(copy.deepcopy(model), inputs, min_cut_partition)
        rows.append((name, e, d, m))
        if args.verbose:
            for part in m[2]:
                for s in part.saved:
                    print(f"  {name}: saved {s['name']:<28} {s['bytes']:>10} B  {s['reason']}")
                print(f"  {name}: recomputed {part.recomputed}")
    mib = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    print("| model | eager all / act (MiB) | default all / act | min-cut all / act | min-cut act vs eager act |")
    print("|---|---|---|---|---|")
    for name, e, d, m in rows:
        ratio = m[1] / e[1] if e[1] else float("nan")
        print(f"| {name} | {mib(e[0])} / {mib(e[1])} | {mib(d[0])} / {mib(d[1])} | "
              f"{mib(m[0])} / {mib(m[1])} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
