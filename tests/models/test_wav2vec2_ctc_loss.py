"""FINDINGS_75 #5: HF wav2vec2's CTC loss (``ForCTCLoss``: ``with torch.backends.cudnn.flags(enabled=False): return
ctc_loss(...)``) ran eagerly ("a generator started in traced code escapes the frame"). It is captured around its
graph breaks now; a training step matches eager in loss and every gradient."""
import warnings

import pytest
import torch

import coil

transformers = pytest.importorskip("transformers")


def test_wav2vec2_ctc_training_step_matches_eager():
    torch.manual_seed(0)
    cfg = transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, conv_dim=(8, 8),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        mask_time_prob=0.0, vocab_size=12, layerdrop=0.0, hidden_dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0)
    model = transformers.Wav2Vec2ForCTC(cfg).train()
    x, labels = torch.randn(2, 800), torch.randint(1, 12, (2, 5))
    labels[1, 3:] = -100
    cudnn = torch.backends.cudnn.enabled
    grads = []
    coil.reset()
    for fn in (model, coil.compile(model)):
        model.zero_grad()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = fn(x, labels=labels)
        assert not [m for m in w if "runs eagerly" in str(m.message)], [str(m.message) for m in w]
        out.loss.backward()
        grads.append((out.loss.detach(), out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_e, logits_e, g_e), (loss_c, logits_c, g_c) = grads
    torch.testing.assert_close(loss_c, loss_e)
    torch.testing.assert_close(logits_c, logits_e)
    for n in g_e:
        torch.testing.assert_close(g_c[n], g_e[n], rtol=1e-4, atol=1e-4, msg=lambda m, n=n: f"{n}: {m}")  # (fused sums)
    assert coil.capture.stats["fallbacks"] == 0 and torch.backends.cudnn.enabled == cudnn
