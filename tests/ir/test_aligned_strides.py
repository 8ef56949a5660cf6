"""Values realized for an extern op, or saved for the backward, keep eager's aligned rows.

Eager's SDPA pads an attention mask's last dim to 8 elements and slices it back, so the
bias it hands CUDA's memory-efficient attention has rows that are a multiple of 8
elements apart; that kernel refuses any other bias (``attn_bias is not correctly aligned
(strideB)``). HF Swin's training step (49 x 49 windows, a patch-embedding convolution,
so its saved tensors keep the layout coil computed them in) failed this way on the H200:
the saved bias was realized densely, 7203 elements per batch entry."""
import pytest
import torch
import torch.nn.functional as F

import coil
import coil.aot.compile as aot_compile
import coil.ir.graph as G


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_strides_keep_padded_rows(dtype):
    padded = F.pad(torch.randn(2, 3, 49, 49, dtype=dtype), (0, 7))[..., :49]
    assert G._dense_strides_like(padded) == [8232, 2744, 56, 1]
    assert G._dense_strides_like(padded[:1].expand(5, 3, 49, 49)) == [8232, 2744, 56, 1]
    # rows eager did not align stay dense; an order other than contiguous is kept
    assert G._dense_strides_like(torch.randn(2, 3, 49, 49, dtype=dtype)[..., :48]) == [7056, 2352, 48, 1]
    assert G._dense_strides_like(torch.randn(3, 7, 5).permute(1, 0, 2)[:, :, :4]) == [4, 28, 1]


class _Windows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 3, 1)

    def forward(self, x, m):
        s = self.embed(x)                         # a convolution: saved tensors keep coil's layout
        bias = F.pad(m * 2, (0, 7))[..., :49]     # SDPA's padded mask
        return (s.reshape(1, 3, 49, 49) * bias).sum()


def test_saved_bias_keeps_aligned_rows(monkeypatch):
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    reported = []
    real = aot_compile._saved_layouts

    def record(bw_fakes, fw_strides, start, num_saved, fake_mode):
        reported.extend(fw_strides[start:start + num_saved] if fw_strides else [])
        return real(bw_fakes, fw_strides, start, num_saved, fake_mode)

    monkeypatch.setattr(aot_compile, "_saved_layouts", record)
    torch.manual_seed(0)
    m1 = _Windows()
    m2 = _Windows()
    m2.load_state_dict(m1.state_dict())
    x, m = torch.randn(1, 3, 49, 49), torch.randn(1, 3, 49, 49)
    coil.reset()
    out = coil.compile(m2, options={"cpu_backend": "cpp"})(x, m)
    ref = m1(x, m)
    out.backward()
    ref.backward()
    torch.testing.assert_close(out, ref)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-4, atol=1e-3)
    assert (8232, 2744, 56, 1) in reported, reported    # the bias, as eager's (the conv output is dense)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's memory-efficient attention")
def test_gpu_sdpa_window_bias_training():
    """The HF Swin failure itself: a 49 x 49 float bias through SDPA in a bf16 training step."""
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Conv2d(3, 96, 4, stride=4)
            self.qkv = torch.nn.Linear(96, 288)
            self.table = torch.nn.Parameter(torch.randn(3, 49, 49) * 0.1)

        def forward(self, x):
            t = self.embed(x).flatten(2).transpose(1, 2).reshape(-1, 49, 96)
            q, k, v = self.qkv(t).reshape(-1, 49, 3, 3, 32).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.table.unsqueeze(0)).float().sum()

    torch.manual_seed(0)
    m1 = Attn().cuda()
    m2 = Attn().cuda()
    m2.load_state_dict(m1.state_dict())
    x = torch.randn(2, 3, 28, 28, device="cuda")
    coil.reset()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = coil.compile(m2)(x)
        ref = m1(x)
    out.backward()
    ref.backward()
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-1)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, rtol=5e-2, atol=5e-2)
