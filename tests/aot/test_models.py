"""Training steps through torch.compile(backend=aot_eager) equal eager: values and gradients."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import check_module, compile_aot

CAPTURES = ["torch", "coil"]
# the HF GPT-2/BERT runs through torch's capture cost ~1 min each in CI: slow-only there
CAPTURES_HF = [pytest.param("torch", marks=pytest.mark.slow), "coil"]


@pytest.mark.parametrize("capture", CAPTURES)
def test_mlp_training(capture):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    check_module(model, torch.randn(8, 16), steps=2, capture=capture)


def test_mlp_inference_no_grad():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    compiled, _ = compile_aot(model)
    with torch.no_grad():
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
    assert not out.requires_grad


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.0)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.drop(x.mean((2, 3)))
        return self.fc(x)


@pytest.mark.parametrize("capture", CAPTURES)
def test_convnet_batchnorm_training(capture):
    torch.manual_seed(0)
    model = ConvNet()
    check_module(model, torch.randn(4, 3, 8, 8), steps=2, rtol=1e-4, atol=1e-4, capture=capture)


def test_convnet_eval():
    torch.manual_seed(0)
    model = ConvNet().eval()
    x = torch.randn(2, 3, 8, 8)
    compiled, _ = compile_aot(model)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=50, d=32, heads=4, layers=2, block=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


@pytest.mark.parametrize("capture", CAPTURES)
def test_small_gpt_training(capture):
    torch.manual_seed(0)
    model = TinyGPT()
    idx = torch.randint(0, 50, (2, 12))
    check_module(model, idx, torch.randint(0, 50, (2, 12)), loss_fn=lambda loss: loss, steps=2, capture=capture)


LAYERS = [1, pytest.param(2, marks=pytest.mark.slow)]


def _hf(name):
    transformers = pytest.importorskip("transformers")
    return transformers


@pytest.mark.parametrize("layers", LAYERS)
@pytest.mark.parametrize("capture", CAPTURES_HF)
def test_hf_gpt2_training(layers, capture):
    tf = _hf("gpt2")
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=layers, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = tf.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 64, (2, 10))
    check_module(model, ids, loss_fn=lambda out: out.logits.float().pow(2).mean(),
                 rtol=1e-4, atol=1e-5, capture=capture)


@pytest.mark.parametrize("layers", LAYERS)
@pytest.mark.parametrize("capture", CAPTURES_HF)
def test_hf_bert_training(layers, capture):
    tf = _hf("bert")
    torch.manual_seed(0)
    cfg = tf.BertConfig(num_hidden_layers=layers, num_attention_heads=2, hidden_size=32,
                        intermediate_size=64, vocab_size=64, max_position_embeddings=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = tf.BertModel(cfg)
    ids = torch.randint(0, 64, (2, 10))
    check_module(model, ids, loss_fn=lambda out: out.last_hidden_state.pow(2).mean(),
                 rtol=1e-4, atol=1e-5, capture=capture)


@pytest.mark.parametrize("layers", LAYERS)
@pytest.mark.parametrize("capture", CAPTURES)
def test_hf_llama_training(layers, capture):
    tf = _hf("llama")
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         hidden_size=32, intermediate_size=64, vocab_size=64,
                         max_position_embeddings=32)
    model = tf.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 64, (2, 10))
    check_module(model, ids, loss_fn=lambda out: out.logits.float().pow(2).mean(),
                 rtol=1e-4, atol=1e-5, capture=capture)


@pytest.mark.parametrize("capture", CAPTURES)
def test_convnet_dropout_fallback_random(capture):
    """Dropout p=0.5 in training: with fallback_random the compiled graph draws the
    same masks as eager for the same seed (forward and gradients agree)."""
    import copy

    from helpers import compile_aot

    from coil.config import patch

    torch.manual_seed(0)
    model = ConvNet()
    model.drop.p = 0.5
    ref = copy.deepcopy(model)
    x = torch.randn(4, 3, 8, 8)
    with patch(fallback_random=True):
        compiled, counter = compile_aot(model, capture)
        for step in range(2):
            torch.manual_seed(10 + step)
            out = compiled(x)
            torch.manual_seed(10 + step)
            expected = ref(x)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            out.pow(2).mean().backward()
            expected.pow(2).mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert counter.paths == ["training"]
