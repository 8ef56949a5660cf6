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
order) as JSON, to diff two trees' code generation. ``--no-log`` times the call with the
log off (no stages).
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import io
import json
import os
import pstats
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("cpp", "triton"), default="cpp")
    ap.add_argument("--model", choices=("gpt2", "qwen2", "smallgpt"), default="gpt2")
    ap.add_argument("--labels-loss", action="store_true", help="qwen2: the loss is model(...).loss alone")
    ap.add_argument("--cprofile", action="store_true", help="profile the compiling (calling) thread")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--dump", default=None, help="with --cprofile: write the pstats file here")
    ap.add_argument("--log", default=None, help="compile log directory (default: a temporary one)")
    ap.add_argument("--no-log", action="store_true", help="log off: total seconds only")
    ap.add_argument("--artifacts", default=None, help="write kernel/wrapper/guards artifacts as JSON here")
    args = ap.parse_args()
    if args.backend == "triton":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    import coil
    from coil import trace
    from coil.config import config
    from coil.trace.report import read_log

    config.cpu_backend = args.backend
    log_dir = None if args.no_log else (args.log or tempfile.mkdtemp(prefix="coil_ct_"))
    trace.set_dir(log_dir)
    torch.manual_seed(0)
    if args.model == "gpt2":
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
    ids = torch.randint(0, 512, (2, 32))
    compiled = coil.compile(model)

    def step():
        if args.model == "smallgpt":
            loss = torch.nn.functional.cross_entropy(compiled(ids).flatten(0, 1), ids.flatten())
        elif args.model == "qwen2" and not args.labels_loss:  # coil bench's loss: every float output's mean
            loss = reduce_to_scalar_loss(compiled(ids, labels=ids))
        else:
            loss = compiled(ids, labels=ids).loss
        loss.backward()
        return loss

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
    if log_dir:
        log = read_log(log_dir)
        selfs: collections.Counter = collections.Counter()
        for c in log.compiles:
            for k, v in c.stage_self_totals().items():
                selfs[k] += v / 1e3
        print(f"compiles {len(log.compiles)}; stage self seconds: "
              + ", ".join(f"{k} {v:.2f}" for k, v in selfs.most_common()))
        print("STAGES " + json.dumps({"total": total, "cpu": cpu, **{k: round(v, 3) for k, v in selfs.items()}}))
        if args.artifacts:
            arts = [(a.get("name"), a.get("text")) for c in log.compiles for a in c.artifacts
                    if a.get("name") in ("wrapper", "guards") or str(a.get("name")).startswith("kernel ")]
            with open(args.artifacts, "w") as f:
                json.dump(arts, f, indent=0)
            print(f"{len(arts)} kernel/wrapper/guards artifacts -> {args.artifacts}")
    else:
        print("STAGES " + json.dumps({"total": total, "cpu": cpu}))
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
