"""Dynamic shapes on real models (issue 17): transformers GPT-2 and a LLaMA-style model
(small configs, random weights, bf16 inference, batch 4) over several sequence lengths.
For coil (default: static first, then automatic dynamic), coil dynamic=False (one graph
per length) and torch.compile (dynamic=None): graphs compiled, total first-call seconds
(compile included) and steady-state median ms per length; values checked against eager.

    python benchmarks/gpu_dynamic_models.py [--lengths 32 64 ...] [--models gpt2 llama]
"""
import argparse
import statistics
import time

import torch

import coil


def build(name, dev):
    import transformers as tf
    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=4, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        m = tf.GPT2LMHeadModel(cfg)
    else:
        cfg = tf.LlamaConfig(num_hidden_layers=4, hidden_size=1024, intermediate_size=2816,
                             num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                             max_position_embeddings=1024)
        m = tf.LlamaForCausalLM(cfg)
    m.config.use_cache = False
    return m.to(dev, torch.bfloat16).eval()


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(fn, x, n=20):
    for _ in range(3):
        fn(x)
    sync()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(x)
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def run(name, variant, lengths, dev):
    import torch._dynamo
    torch._dynamo.reset()
    coil.reset()
    torch.manual_seed(0)
    m = build(name, dev)
    if variant == "coil":
        f = coil.compile(m)
    elif variant == "coil static":
        f = coil.compile(m, dynamic=False)
    else:
        f = torch.compile(m)
    graphs = {"n": 0}
    if variant.startswith("coil"):
        import coil.codegen as cg
        orig = cg.compile_aten_graph

        def spy(gm, ex, d):
            graphs["n"] += 1
            return orig(gm, ex, d)
        cg.compile_aten_graph = spy
    first_s, per_len = 0.0, {}
    try:
        with torch.no_grad():
            for L in lengths:
                ids = torch.randint(0, 1000, (4, L), device=dev)
                t0 = time.perf_counter()
                out = f(input_ids=ids).logits
                sync()
                first_s += time.perf_counter() - t0
                ref = m(input_ids=ids).logits
                err = (out.float() - ref.float()).abs().max().item()
                per_len[L] = (median_ms(lambda i: f(input_ids=i), ids), err)
    finally:
        if variant.startswith("coil"):
            cg.compile_aten_graph = orig
    if variant == "torch.compile":
        from torch._dynamo.utils import counters
        graphs["n"] = counters["stats"]["unique_graphs"]
    return graphs["n"], first_s, per_len


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[48, 96, 128, 200, 333, 512])
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    ap.add_argument("--variants", nargs="+", default=["coil", "coil static", "torch.compile"])
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = a.device
    print(torch.__version__, torch.cuda.get_device_name() if dev == "cuda" else dev)
    for name in a.models:
        res = {}
        for v in a.variants:
            try:
                res[v] = run(name, v, a.lengths, dev)
            except Exception as e:  # report and go on
                print(f"{name} {v}: FAILED {type(e).__name__}: {str(e)[:300]}")
        print(f"\n### {name}, bf16, batch 4, lengths {a.lengths}")
        print("| variant | graphs | first calls s | " + " | ".join(f"L={L} ms" for L in a.lengths) + " | max abs err |")
        print("|---|---|---|" + "---|" * len(a.lengths) + "---|")
        for v, (n, s, per) in res.items():
            errs = max(e for _, e in per.values())
            print(f"| {v} | {n} | {s:.1f} | " + " | ".join(f"{per[L][0]:.2f}" for L in a.lengths)
                  + f" | {errs:.3g} |")


if __name__ == "__main__":
    main()
