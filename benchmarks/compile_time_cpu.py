"""Cold compile time of a GPT-2 training step on the CPU: the Python-side stages.

    OMP_NUM_THREADS=1 python benchmarks/compile_time_cpu.py                    # cpp backend
    OMP_NUM_THREADS=1 python benchmarks/compile_time_cpu.py --backend triton   # Triton source
    OMP_NUM_THREADS=1 python benchmarks/compile_time_cpu.py --model qwen2      # Qwen2, 4 layers
    python benchmarks/compile_time_cpu.py --cprofile --top 60                  # + profile
    python benchmarks/compile_time_cpu.py --artifacts /tmp/a.json              # kernels, wrappers

transformers GPT-2 with the graph of the 124M model (12 layers) and tiny tensors
(n_embd 64, 4 heads, vocab 512, 64 positions), batch 2 x 32 tokens, fp32; the step
``model(ids, labels=ids).loss.backward()`` under ``coil.compile``. ``--model qwen2``: a
transformers Qwen2 of 4 layers (hidden 64, 4 heads, 2 KV heads, SDPA) built from its config,
the loss of ``coil bench``'s training step (the sum of the float outputs' means: loss and logits;
``--labels-loss``: HF's ``.loss`` alone, the logits get no gradient); ``--model smallgpt``:
coil.bench's SmallGPT (4 layers, d=64), cross-entropy loss. The first call is timed; the
compile log (written to a temporary directory unless ``--log``) gives the stages'
self seconds (wall) summed over every compile; the process's CPU time is printed too
(steadier than wall time on a shared machine). ``--backend triton`` sets ``cpu_backend="triton"``
(Triton source generation as on the GPU; ``TRITON_INTERPRET=1`` runs the kernels).
``--artifacts FILE`` writes the kernel, wrapper and guards artifacts of the log (name -> text, in
order) as JSON, to diff two trees' code generation; the summary prints their sha256 (log on). ``--no-log`` times
the call with the log off (stages from a stage listener only: self CPU seconds of the compiling thread, which the
log's runs print too).

``--broad NAME``: the first training step of a broad-suite model's small config
(``coil.bench.broad``; the step ``coil bench`` times, on CPU in fp32 without autocast:
``suite.make_step``). Without timm, ``b_mobilenetv2``, ``b_efficientnet_b0``, ``b_swin_tiny``
and ``b_densenet121`` are stand-ins of the same structure (:data:`STAND_INS`): transformers'
MobileNetV2 (17 inverted residual blocks, ReLU6, no TF padding), EfficientNet-B0 and Swin
(depths 2-2-6-2, window 7, narrow: embed 32) and a DenseNet-121 written here (dense blocks of
6-12-24-16 layers, growth 32, concatenations). The summary then counts the kernels per graph
and their distinct sources (the kernel's name taken out): on a GPU each distinct Triton
kernel is compiled and autotuned. ``--backend triton --no-run`` generates and loads the Triton
kernels without running them in the interpreter (compile time only; the values are garbage) and
counts the compilations a GPU would make:

    OMP_NUM_THREADS=1 python benchmarks/compile_time_cpu.py --broad b_densenet121 --backend triton --no-run

``--autocast`` runs the step under bf16 autocast, as the GPU suite's AMP training rows do; the summary's
elements per graph (the buffers each wrapper allocates) then compare what the generated kernels write:

    OMP_NUM_THREADS=1 python benchmarks/compile_time_cpu.py --broad b_gpt_neox --backend triton --no-run --autocast
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import hashlib
import io
import json
import math
import os
import pstats
import re
import sys
import tempfile
import time

import torch


class _DenseLayer(torch.nn.Module):
    def __init__(self, cin: int, growth: int = 32, bn_size: int = 4):
        super().__init__()
        nn = torch.nn
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, feats: list) -> torch.Tensor:   # timm's DenseLayer: concatenation, then BN-ReLU-conv twice
        x = self.conv1(torch.relu(self.norm1(torch.cat(feats, 1))))
        return self.conv2(torch.relu(self.norm2(x)))


class DenseNet121(torch.nn.Module):
    """timm's ``densenet121`` (stem, dense blocks of 6-12-24-16 layers with transitions,
    classifier), written without timm."""

    def __init__(self, growth: int = 32, blocks=(6, 12, 24, 16), classes: int = 1000):
        super().__init__()
        nn = torch.nn
        c = 2 * growth
        self.stem = nn.Sequential(nn.Conv2d(3, c, 7, 2, 3, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.blocks, self.transitions = nn.ModuleList(), nn.ModuleList()
        for i, n in enumerate(blocks):
            self.blocks.append(nn.ModuleList(_DenseLayer(c + j * growth, growth) for j in range(n)))
            c += n * growth
            if i < len(blocks) - 1:
                self.transitions.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                                                      nn.AvgPool2d(2, 2)))
                c //= 2
        self.norm, self.fc = nn.BatchNorm2d(c), nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i, block in enumerate(self.blocks):
            feats = [x]
            for layer in block:
                feats.append(layer(feats))
            x = torch.cat(feats, 1)
            if i < len(self.transitions):
                x = self.transitions[i](x)
        return self.fc(torch.relu(self.norm(x)).mean((2, 3)))


def _hf_vision(cls: str, config: str, res: int, **cfg):
    def build():
        import transformers
        torch.manual_seed(0)
        return getattr(transformers, cls)(getattr(transformers, config)(**cfg)), res
    return build


#: broad-suite timm models without timm: name -> () -> (module, image resolution); see the docstring
STAND_INS = {
    "b_mobilenetv2": _hf_vision("MobileNetV2ForImageClassification", "MobileNetV2Config", 64,
                                tf_padding=False, classifier_dropout_prob=0.0),
    "b_efficientnet_b0": _hf_vision("EfficientNetForImageClassification", "EfficientNetConfig", 64,
                                    width_coefficient=1.0, depth_coefficient=1.0, image_size=64,
                                    hidden_dim=1280, dropout_rate=0.0, drop_connect_rate=0.0),
    "b_swin_tiny": _hf_vision("SwinForImageClassification", "SwinConfig", 224, image_size=224, embed_dim=32,
                              depths=[2, 2, 6, 2], num_heads=[1, 2, 4, 8], window_size=7,
                              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0),
    "b_densenet121": lambda: (torch.manual_seed(0), DenseNet121())[1:] + (64,),
}


def _broad_step(name: str, compile_fn, autocast: bool = False):
    """(description, the first training step of broad model ``name``'s small config on CPU)."""
    import importlib.util
    from coil.bench import suite
    from coil.bench.broad import BROAD_MODELS
    from coil.bench.models import _image
    spec, cpu = BROAD_MODELS[name], torch.device("cpu")
    if spec.source == "timm" and importlib.util.find_spec("timm") is None:
        module, res = STAND_INS[name]()
        args, kwargs, desc = (_image(2, res, cpu),), {}, f"stand-in {type(module).__name__} batch=2 res={res}"
    else:
        built = spec.build(cpu, "small")
        module, args, kwargs, desc = built.module, built.args, built.kwargs, built.config
    module.train()
    fn = compile_fn(module)
    return desc, suite.make_step(fn, suite._trainable(module), args, kwargs, "train", cpu, autocast=autocast)


class _StageCPU:
    """A stage listener (``trace.add_stage_listener``): each stage's self CPU seconds of its thread
    (``time.thread_time``, nested stages taken out), steadier than the log's wall times on a shared machine."""

    def __init__(self):
        import threading
        self.selfs: collections.Counter = collections.Counter()
        self._local = threading.local()

    def __call__(self, name: str, what: str, ms) -> None:
        stack = self._local.__dict__.setdefault("stack", [])
        if what == "start":
            stack.append([name, time.thread_time(), 0.0])
            return
        name, t0, children = stack.pop()
        total = time.thread_time() - t0
        self.selfs[name] += total - children
        if stack:
            stack[-1][2] += total


def _gpu_configs(launchers: list) -> str:
    """Triton compilations the same kernels would take on a GPU with autotuning: per distinct body, the candidate
    launch configs at these sizes (one below ``autotune_min_elements``), and at sizes large enough to autotune all."""
    from coil.config import config
    from coil.runtime.triton_runtime import launch_configs
    here, big, seen = 0, 0, set()
    for k, persistent, outer in launchers:
        if k.key in seen:
            continue
        seen.add(k.key)
        n = len(launch_configs(k.numel, k.rnumel, persistent, True, outer, k.elem_bytes, k.tiled))
        big += n
        here += n if k.numel * k.rnumel >= config.autotune_min_elements else 1
    return f"Triton kernels {len(launchers)}, distinct bodies {len(seen)}; GPU compilations with autotuning: " \
           f"{here} at these sizes, {big} if every kernel is large enough to autotune"


def _kernel_counts(log) -> str:
    """Per compiled graph: kernels generated and distinct kernel sources (name taken out), and the elements of the
    buffers its wrapper allocates (static shapes; what the generated kernels write)."""
    rows, every, elems = [], set(), []
    for c in log.compiles:
        graphs, cur = [], None
        for a in c.artifacts:
            name = str(a.get("name"))
            if name.startswith("kernel "):
                if cur is None:
                    cur = []
                    graphs.append(cur)
                # as the Triton runtime keys a body (canonical_name): whole-line comments and the name left out
                body = re.sub(r"(?m)^[ \t]*(#|//).*\n", "", a.get("text") or "")
                cur.append(re.sub(rf"\b{re.escape(name[len('kernel '):])}\b", "KERNEL", body))
            elif name == "wrapper":
                cur = None
                # the elements of the buffers the wrapper allocates (what generated kernels write)
                sizes = re.findall(r"empty_strided\(\(([^)]*)\)", a.get("text") or "")
                elems.append(sum(math.prod(int(d) for d in s.split(",") if d.strip()) for s in sizes))
        for g in graphs:
            rows.append(f"{len(g)}/{len(set(g))}")
            every.update(g)
    return (f"kernels per graph (generated/distinct): {' '.join(rows)}; distinct over all: {len(every)}\n"
            f"elements of the buffers allocated per graph: {' '.join(str(e) for e in elems)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("cpp", "triton"), default="cpp")
    ap.add_argument("--model", choices=("gpt2", "qwen2", "smallgpt"), default="gpt2")
    ap.add_argument("--broad", default=None, help="a broad-suite model's training step instead (see above)")
    ap.add_argument("--autocast", action="store_true", help="run the step under bf16 autocast (the GPU suite's AMP)")
    ap.add_argument("--labels-loss", action="store_true", help="qwen2: the loss is model(...).loss alone")
    ap.add_argument("--cprofile", action="store_true", help="profile the compiling (calling) thread")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--dump", default=None, help="with --cprofile: write the pstats file here")
    ap.add_argument("--log", default=None, help="compile log directory (default: a temporary one)")
    ap.add_argument("--no-log", action="store_true", help="log off: total seconds only")
    ap.add_argument("--no-run", action="store_true",
                    help="--backend triton: generated kernels are loaded but not run (compile time only, values garbage)")
    ap.add_argument("--artifacts", default=None, help="write kernel/wrapper/guards artifacts as JSON here")
    args = ap.parse_args()
    if args.backend == "triton":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import coil
    from coil import trace
    from coil.config import config
    from coil.trace.report import read_log

    config.cpu_backend = args.backend
    launchers = []
    if args.backend == "triton":
        from coil.runtime import triton_runtime
        made = triton_runtime.TritonLauncher.__init__

        def init(self, *a, **k):
            made(self, *a, **k)
            launchers.append((self, a[4] if len(a) > 4 else k.get("persistent"), k.get("outer", False)))
        triton_runtime.TritonLauncher.__init__ = init
        if args.no_run:
            triton_runtime.TritonLauncher.__call__ = lambda self, *a: None
    log_dir = None if args.no_log else (args.log or tempfile.mkdtemp(prefix="coil_ct_"))
    trace.set_dir(log_dir)
    stage_cpu = _StageCPU()
    trace.add_stage_listener(stage_cpu)
    torch.manual_seed(0)
    if args.broad:
        desc, step = _broad_step(args.broad, coil.compile, args.autocast)
        print(f"{args.broad}: {desc}")
    elif args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=12, n_embd=64, n_head=4, vocab_size=512, n_positions=64)
        model = GPT2LMHeadModel(cfg).train()
    elif args.model == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM
        from coil.bench.models import reduce_to_scalar_loss
        cfg = Qwen2Config(num_hidden_layers=4, hidden_size=64, intermediate_size=176,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                          max_position_embeddings=64, use_cache=False, attn_implementation="sdpa")
        model = Qwen2ForCausalLM(cfg).train()
    else:
        from coil.bench.models import SmallGPT
        model = SmallGPT(512, 64, 4, 4, 64).train()
    if not args.broad:
        ids = torch.randint(0, 512, (2, 32))
        compiled = coil.compile(model)

    def lm_step():
        if args.model == "smallgpt":
            loss = torch.nn.functional.cross_entropy(compiled(ids).flatten(0, 1), ids.flatten())
        elif args.model == "qwen2" and not args.labels_loss:  # coil bench's loss: every float output's mean
            loss = reduce_to_scalar_loss(compiled(ids, labels=ids))
        else:
            loss = compiled(ids, labels=ids).loss
        loss.backward()
        return loss
    step = step if args.broad else lm_step
    if args.autocast and not args.broad:
        step = torch.autocast("cpu", dtype=torch.bfloat16)(step)

    prof = cProfile.Profile() if args.cprofile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    step()
    if prof:
        prof.disable()
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    trace.set_dir(None)

    print(f"backend {args.backend}: first call {total:.2f} s ({cpu:.2f} s CPU time of the process)")
    if not log_dir:
        print("stage self CPU seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in stage_cpu.selfs.most_common()))
    if log_dir:
        log = read_log(log_dir)
        selfs: collections.Counter = collections.Counter()
        for c in log.compiles:
            for k, v in c.stage_self_totals().items():
                selfs[k] += v / 1e3
        print(f"compiles {len(log.compiles)}; stage self seconds: "
              + ", ".join(f"{k} {v:.2f}" for k, v in selfs.most_common()))
        print("stage self CPU seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in stage_cpu.selfs.most_common()))
        print(_kernel_counts(log))
        if launchers:
            print(_gpu_configs(launchers))
        print("STAGES " + json.dumps({"total": total, "cpu": cpu, **{k: round(v, 3) for k, v in selfs.items()},
                                      **{f"cpu_{k}": round(v, 3) for k, v in stage_cpu.selfs.items()}}))
        arts = [(a.get("name"), a.get("text")) for c in log.compiles for a in c.artifacts
                if a.get("name") in ("wrapper", "guards", "guards_fast") or str(a.get("name")).startswith("kernel ")]
        # one hash of the generated code, to compare two trees' code generation at a glance (an identity guard's
        # address, different in every process, left out)
        same = json.dumps([(n, re.sub(r"(___id\([^)]*\) == )\d+", r"\1ID", t or "")) for n, t in arts])
        digest = hashlib.sha256(same.encode()).hexdigest()[:16]
        print(f"artifacts {len(arts)} (kernels, wrappers, guards), sha256 {digest}")
        if args.artifacts:
            with open(args.artifacts, "w") as f:
                json.dump(arts, f, indent=0)
            print(f"{len(arts)} kernel/wrapper/guards artifacts -> {args.artifacts}")
    else:
        print("STAGES " + json.dumps({"total": total, "cpu": cpu,
                                      **{f"cpu_{k}": round(v, 3) for k, v in stage_cpu.selfs.items()}}))
    if prof and args.dump:
        prof.dump_stats(args.dump)
    if prof:
        for key in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(args.top)
            print("\n".join(l[:200] for l in out.getvalue().splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
