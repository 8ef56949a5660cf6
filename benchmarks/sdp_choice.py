"""Which fused attention kernel torch's SDPA dispatch picks with cuDNN on and off.

coil traces with cuDNN off (coil/aot/functional.py ``without_cudnn_choices``, for
BatchNorm's running statistics); this checks that the attention op recorded in the
graph does not change with it. Prints ``_fused_sdp_choice`` (a ``SDPBackend`` value)
for a few bf16 shapes, cuDNN on and off.  Usage: python benchmarks/sdp_choice.py (GPU).
"""
import torch

names = {int(v): k for k, v in torch.nn.attention.SDPBackend.__members__.items()}
was = torch.backends.cudnn.enabled
for shape, causal, mask in [((8, 12, 512, 64), True, False), ((8, 12, 128, 64), False, True),
                            ((2, 32, 1024, 128), True, False)]:
    q = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    m = torch.zeros(shape[0], 1, shape[2], shape[2], device="cuda", dtype=torch.bfloat16) if mask else None
    row = []
    for en in (True, False):
        torch._C._set_cudnn_enabled(en)
        c = torch._fused_sdp_choice(q, q, q, attn_mask=m, is_causal=causal and not mask)
        row.append(f"cudnn {'on' if en else 'off'}: {names.get(int(c), c)}")
    print(shape, "causal" if causal else "", "mask" if mask else "", "|", ", ".join(row))
torch._C._set_cudnn_enabled(was)
