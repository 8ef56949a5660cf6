"""Why does coil recompile GPT-2 per sequence length on CUDA? (issue 17, dynamic shapes)

On CPU the automatic-dynamic entry of GPT-2 keeps ``2 <= L``; on the H200 it carried
``input_ids.size()[1] == 128`` (one compile per length). This script compiles
transformers GPT-2 (2 layers, bf16, batch 4, random weights) with ``coil.compile`` and
runs lengths 64/128/200/333 under several SDPA backend settings (default, math only,
efficient only, flash only: which kernel torch's SDPA picks is decided by C++ checks on
the symbolic sizes, a CUDA-only path the CPU build cannot run). For each setting it prints

- compiles (``compile_aten_graph`` calls) and which lengths compiled;
- every ShapeEnv specialization (a symbol replaced by a number) and every guard that
  compares a size with a constant, with the Python stack (user lines of transformers and
  the torch/coil frame that asked) and the C++ frames (``CapturedTraceback``, cpp=True);
- coil's own compile-log decisions: ``recompile`` reasons, ``specialization`` events
  with their user line, ``shape_guards``, ``codegen_guards``, ``codegen_fallback``;
- which SDPA backend eager picks per length (``torch._fused_sdp_choice``).

    python benchmarks/gpu_dynamic_diag.py            # CUDA (falls back to CPU, tiny config)
    python benchmarks/gpu_dynamic_diag.py --variants default math --lengths 64 128 200

The compile log goes to ``$OUT/dynamic_diag_trace`` (``coil report`` renders it).
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
import warnings

import torch

import coil
from coil import trace


def build(dev, tiny):
    import transformers as tf
    if tiny:
        cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=1024)
    else:
        cfg = tf.GPT2Config(n_layer=2, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    m = tf.GPT2LMHeadModel(cfg)
    m.config.use_cache = False
    return m.to(dev, torch.bfloat16).eval()


class ShapeEnvSpy:
    """Wraps ShapeEnv methods (private names, checked with hasattr) to record where a
    symbol got a constant value or a size was compared with a constant."""

    def __init__(self, max_events=40):
        import sympy
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        self.cls, self.saved, self.events, self.max = ShapeEnv, {}, [], max_events
        spy = self
        if hasattr(ShapeEnv, "_set_replacement"):
            orig = ShapeEnv._set_replacement

            def _set_replacement(env, a, tgt, msg, *args, **kw):
                if getattr(tgt, "is_number", False):
                    spy.record("SPECIALIZE", f"{a} -> {tgt} ({msg})")
                return orig(env, a, tgt, msg, *args, **kw)
            self.saved["_set_replacement"] = orig
            ShapeEnv._set_replacement = _set_replacement
        # every guard the ShapeEnv keeps passes _log_guard (torch 2.2+; _maybe_guard_rel
        # otherwise); keep those that compare a size with a constant other than 0/1/2
        hook = "_log_guard" if hasattr(ShapeEnv, "_log_guard") else "_maybe_guard_rel"
        orig_g = getattr(ShapeEnv, hook)

        def guard_hook(env, *args, **kw):
            g = next((x for x in args if hasattr(x, "free_symbols")), None)
            if g is not None and any(abs(int(x)) > 2 for x in g.atoms(sympy.Integer)):
                spy.record("GUARD", f"{g} [{args[0] if isinstance(args[0], str) else hook}]")
            return orig_g(env, *args, **kw)
        self.saved[hook] = orig_g
        setattr(ShapeEnv, hook, guard_hook)

    def record(self, kind, text):
        if len(self.events) >= self.max:
            return
        py = [f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_stack()[:-2]]
        keep = [p for p in py if "site-packages/torch/" not in p or "_meta_registrations" in p
                or "_decomp" in p or "_refs" in p]
        cpp = []
        try:
            from torch.utils._traceback import CapturedTraceback
            tb = CapturedTraceback.extract(cpp=True).format()
            cpp = [ln.strip() for ln in "".join(tb).splitlines()
                   if "::" in ln and ".py" not in ln and "PyObject" not in ln
                   and "torch::" not in ln][:15]
        except Exception as e:  # noqa: BLE001 - a diagnostic: keep going
            cpp = [f"(no C++ stack: {type(e).__name__})"]
        self.events.append((kind, text, keep[-14:], cpp))

    def restore(self):
        for k, v in self.saved.items():
            setattr(self.cls, k, v)


def sdpa_backend_names():
    try:
        from torch.nn.attention import SDPBackend
        return {int(v): k for k, v in SDPBackend.__members__.items()}
    except Exception:  # noqa: BLE001
        return {}


def eager_sdpa_choices(m, ids):
    """The backend torch picks for each SDPA call of ``m(ids)`` (eager, real tensors)."""
    names, seen = sdpa_backend_names(), []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        try:
            c = names.get(int(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal,
                                                      scale=scale, **kw)))
            # under compile transformers materializes the causal mask (bool, B x 1 x L x L)
            L = q.shape[-2]
            bm = torch.ones(q.shape[0], 1, L, k.shape[-2], dtype=torch.bool, device=q.device).tril()
            cm = names.get(int(torch._fused_sdp_choice(q, k, v, bm, dropout_p, False, scale=scale,
                                                       **kw)))
        except Exception as e:  # noqa: BLE001
            c = cm = f"? ({type(e).__name__}: {str(e)[:80]})"
        mask = None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.stride(), attn_mask.dtype)
        seen.append({"choice": c, "with a bool mask": cm, "q": tuple(q.shape),
                     "is_causal": is_causal, "mask": mask})
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, **kw)
    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        with torch.no_grad():
            m(input_ids=ids)
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
    return seen[:1]


def kernel_ctx(variant):
    if variant == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "flash": SDPBackend.FLASH_ATTENTION}[variant])


def read_log(path, since):
    out = []
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name)) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("ts", 0) >= since:
                    out.append(e)
    return out


def run_variant(variant, lengths, dev, tiny, log_dir):
    import coil.codegen as cg
    coil.reset()
    torch.manual_seed(0)
    m = build(dev, tiny)
    print(f"\n==================== variant: {variant} ====================")
    with kernel_ctx(variant):
        for L in lengths:
            ids = torch.randint(0, 1000, (4, L), device=dev)
            print(f"eager SDPA choice at L={L}: {eager_sdpa_choices(m, ids)}")
    compiled, orig = [], cg.compile_aten_graph
    current = {"L": None}

    def counting(gm, ex, d):
        compiled.append(current["L"])
        return orig(gm, ex, d)
    cg.compile_aten_graph = counting
    spy = ShapeEnvSpy()
    since = time.time()
    f = coil.compile(m)
    try:
        with kernel_ctx(variant), torch.no_grad():
            for L in lengths:
                current["L"] = L
                ids = torch.randint(0, 1000, (4, L), device=dev)
                t0 = time.perf_counter()
                out = f(input_ids=ids).logits
                if dev == "cuda":
                    torch.cuda.synchronize()
                err = (out.float() - m(input_ids=ids).logits.float()).abs().max().item()
                print(f"L={L}: first call {time.perf_counter() - t0:.2f} s, max abs err {err:.3g}")
    except Exception as e:  # noqa: BLE001 - report and go on with the next variant
        print(f"FAILED: {type(e).__name__}: {str(e)[:500]}")
    finally:
        cg.compile_aten_graph = orig
        spy.restore()
    per_len = {L: compiled.count(L) for L in lengths}
    print(f"\ncompiles: {len(compiled)} (graphs compiled at each length: {per_len})")
    print(f"\nShapeEnv specializations / guards against constants ({len(spy.events)}):")
    for kind, text, py, cpp in spy.events:
        print(f"  {kind}: {text}")
        for p in py:
            print(f"      py  {p}")
        for c in cpp:
            print(f"      cpp {c}")
    print("\ncoil compile log:")
    for e in read_log(log_dir, since):
        ev = e.get("event")
        cid = e.get("compile_id")
        if ev == "recompile":
            print(f"  [{cid}] recompile {e.get('frame')}: {e.get('reason')}")
        elif ev == "specialization":
            print(f"  [{cid}] specialization {e.get('guard')} at {e.get('user_line')} "
                  f"(op {e.get('reason')})")
        elif ev in ("shape_guards", "codegen_guards"):
            print(f"  [{cid}] {ev}: {e.get('guards')}")
        elif ev in ("codegen_fallback", "dynamic_lowering_fallback"):
            print(f"  [{cid}] {ev}: {e.get('op') or ''} {str(e.get('error'))[:300]}")
        elif ev == "opaque_op":
            print(f"  [{cid}] opaque_op {e.get('op')}: {e.get('reason')}")
        elif ev == "dynamic_dim":
            print(f"  [{cid}] dynamic_dim {e.get('source')} dim {e.get('dim')} -> {e.get('symbol')}"
                  f" ({e.get('reason')})")
    return len(compiled)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 200, 333])
    ap.add_argument("--variants", nargs="+", default=["default", "math", "efficient", "flash"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    dev = a.device
    tiny = dev != "cuda"
    log_dir = os.path.join(os.environ.get("OUT") or tempfile.mkdtemp(), "dynamic_diag_trace")
    os.makedirs(log_dir, exist_ok=True)
    trace.set_dir(log_dir)
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"python {sys.version.split()[0]}, device {torch.cuda.get_device_name() if dev == 'cuda' else dev}"
          f"{' (tiny config)' if tiny else ''}; compile log in {log_dir}")
    variants = a.variants if dev == "cuda" else [v for v in a.variants if v in ("default", "math")]
    summary = {}
    for v in variants:
        try:
            summary[v] = run_variant(v, a.lengths, dev, tiny, log_dir)
        except Exception as e:  # noqa: BLE001
            print(f"variant {v} FAILED: {type(e).__name__}: {str(e)[:300]}")
    print(f"\nSUMMARY compiles per variant over lengths {a.lengths}: {summary}")


if __name__ == "__main__":
    main()
