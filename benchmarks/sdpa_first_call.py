"""The one-time cost of ``F.scaled_dot_product_attention`` at a new sequence length.

    python benchmarks/sdpa_first_call.py      # the H200, a few seconds

bf16 (4, 16, L, 64) query/key/value with an additive float mask (what coil's
``coil::sdpa`` runs for a transformers LLaMA with symbolic sizes) and without one
(``is_causal``), at each length in turn: the first call's milliseconds (synchronized),
the second's, and the backend torch picks (``torch._fused_sdp_choice``). A first call far
above the second is a per-shape cost inside torch (a kernel variant loaded, a plan
built), paid by whichever compiled copy reaches that length first.
"""
import time

import torch
import torch.nn.functional as F


def main() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
    for masked in (True, False):
        for L in (64, 96, 128, 160, 200, 333, 400, 512):
            q, k, v = (torch.randn(4, 16, L, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
            mask = torch.zeros(4, 1, L, L, device=dev, dtype=torch.bfloat16) if masked else None
            kw = dict(attn_mask=mask) if masked else dict(is_causal=True)
            times = []
            for _ in range(2):
                torch.cuda.synchronize() if dev == "cuda" else None
                t = time.perf_counter()
                F.scaled_dot_product_attention(q, k, v, **kw)
                torch.cuda.synchronize() if dev == "cuda" else None
                times.append((time.perf_counter() - t) * 1e3)
            choice = torch._fused_sdp_choice(q, k, v, **kw) if dev == "cuda" else 0
            print(f"mask={masked!s:5} L={L:4}: first {times[0]:8.2f} ms, second {times[1]:6.2f} ms, "
                  f"backend {names.get(choice, choice)}")


if __name__ == "__main__":
    main()
