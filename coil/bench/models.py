"""The benchmark model suite: what ``coil bench`` and ``coil demo`` run.

Each entry is a :class:`ModelSpec`: a name, where the model comes from (``coil``'s own
example models, ``transformers``, ``timm``) and a ``build(device, size)`` that returns a
:class:`BuiltModel` (module in train mode with dropout off, example args/kwargs). Weights
are random (``torch.manual_seed(0)``); nothing is downloaded.

Sizes are chosen per device: ``size="small"`` (CPU, and tests) keeps every model under a
few million parameters so a CPU run takes seconds; ``size="full"`` (GPU) uses realistic
configs, e.g. GPT-2 small's 124M-parameter config at batch 8 x sequence 512.
``default_size(device)`` picks one.

Invariants: dropout probabilities are 0 so a training step is deterministic; models with
``transformers`` configs use ``use_cache=False`` and return plain tensors or ModelOutput
dicts of tensors (no cache objects), so outputs flatten to a list of tensors.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class BuiltModel:
    """A model ready to run: ``module(*args, **kwargs)``."""

    module: nn.Module
    args: tuple
    kwargs: dict
    #: a short human description of the config (layers, width, batch x seq)
    config: str


@dataclasses.dataclass
class ModelSpec:
    """One benchmark model. ``build(device, size)`` -> :class:`BuiltModel`."""

    name: str
    source: str  # "coil" | "transformers" | "timm"
    build: Callable[[torch.device, str], BuiltModel]
    description: str

    def available(self) -> bool:
        """False when the package the model comes from is not importable."""
        if self.source == "coil":
            return True
        return importlib.util.find_spec(self.source) is not None


def default_size(device: torch.device | str) -> str:
    """``"full"`` on CUDA, ``"small"`` elsewhere."""
    return "full" if torch.device(device).type == "cuda" else "small"


# ---------------------------------------------------------------- coil's own models

class MLP(nn.Module):
    """Linear → ReLU stack. Input ``(batch, dims[0])`` float, output ``(batch, dims[-1])``."""

    def __init__(self, dims: list[int]):
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims, dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(dims) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        hd = d // self.heads
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class SmallGPT(nn.Module):
    """A minimal GPT: token + position embeddings, pre-LN blocks with causal attention
    written out (matmul, mask, softmax), tied LM head. Input ``(batch, seq)`` int64 token
    ids, output logits ``(batch, seq, vocab)``."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, max_seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.t()


class ConvNet(nn.Module):
    """Conv → BatchNorm → ReLU (x3, stride 2 after the first) → global average pool →
    Linear. Input ``(batch, 3, H, W)`` float, output ``(batch, classes)``."""

    def __init__(self, width: int, classes: int):
        super().__init__()
        chans = [3, width, 2 * width, 4 * width]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(chans, chans[1:])):
            layers += [nn.Conv2d(a, b, 3, stride=1 if i == 0 else 2, padding=1, bias=False),
                       nn.BatchNorm2d(b), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(chans[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def _ids(batch: int, seq: int, vocab: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def _image(batch: int, size: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, 3, size, size, generator=g).to(device)


def _build_mlp(device, size):
    dims, batch = ([256, 512, 512, 10], 64) if size == "small" else ([1024, 4096, 4096, 1000], 1024)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, dims[0], generator=g).to(device)
    return BuiltModel(MLP(dims).to(device), (x,), {}, f"dims={dims} batch={batch}")


def _build_small_gpt(device, size):
    vocab, d, heads, layers, batch, seq = ((512, 128, 4, 2, 4, 64) if size == "small"
                                           else (8192, 512, 8, 6, 16, 256))
    torch.manual_seed(0)
    m = SmallGPT(vocab, d, heads, layers, seq).to(device)
    return BuiltModel(m, (_ids(batch, seq, vocab, device),), {},
                      f"d={d} layers={layers} heads={heads} vocab={vocab} batch={batch}x{seq}")


def _build_convnet(device, size):
    width, classes, batch, res = (16, 10, 8, 32) if size == "small" else (64, 1000, 64, 128)
    torch.manual_seed(0)
    return BuiltModel(ConvNet(width, classes).to(device), (_image(batch, res, device),), {},
                      f"width={width} batch={batch} res={res}")


# ---------------------------------------------------------------- transformers models

def _hf_build(cls_name: str, config_cls: str, cfg: dict, args_fn, describe: str):
    def build(device, size):
        import transformers

        conf = getattr(transformers, config_cls)(**cfg[size])
        torch.manual_seed(0)
        model = getattr(transformers, cls_name)(conf).to(device)
        args, kwargs, shape = args_fn(conf, size, device)
        return BuiltModel(model, args, kwargs, describe.format(**cfg[size]) + f" {shape}")

    return build


def _lm_args(batch_seq):
    def fn(conf, size, device):
        b, s = batch_seq[size]
        return (_ids(b, s, conf.vocab_size, device),), {}, f"batch={b}x{s}"
    return fn


_GPT2 = {
    "small": dict(n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=256,
                  bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False),
    "full": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False),
}
_BERT = {
    "small": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                  intermediate_size=512, vocab_size=2048, max_position_embeddings=256,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "full": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                 intermediate_size=3072, vocab_size=30522, max_position_embeddings=512,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
}
_LLAMA = {
    "small": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=352, vocab_size=2048,
                  max_position_embeddings=256, use_cache=False),
    "full": dict(num_hidden_layers=8, hidden_size=1024, num_attention_heads=16,
                 num_key_value_heads=8, intermediate_size=2816, vocab_size=32000,
                 max_position_embeddings=2048, use_cache=False),
}
_T5 = {
    "small": dict(num_layers=2, num_decoder_layers=2, d_model=128, d_kv=32, num_heads=4,
                  d_ff=256, vocab_size=2048, dropout_rate=0.0, use_cache=False),
    "full": dict(num_layers=6, num_decoder_layers=6, d_model=512, d_kv=64, num_heads=8,
                 d_ff=2048, vocab_size=32128, dropout_rate=0.0, use_cache=False),
}
_VIT = {
    "small": dict(image_size=32, patch_size=8, num_hidden_layers=2, hidden_size=128,
                  num_attention_heads=4, intermediate_size=512, num_labels=10,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "full": dict(image_size=224, patch_size=16, num_hidden_layers=12, hidden_size=768,
                 num_attention_heads=12, intermediate_size=3072, num_labels=1000,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
}


def _t5_args(conf, size, device):
    b, s, ds = (2, 32, 16) if size == "small" else (8, 512, 128)
    return ((_ids(b, s, conf.vocab_size, device),),
            {"decoder_input_ids": _ids(b, ds, conf.vocab_size, device)}, f"batch={b}x{s}/{ds}")


def _vit_args(conf, size, device):
    b = 4 if size == "small" else 32
    return (_image(b, conf.image_size, device),), {}, f"batch={b}"


# ---------------------------------------------------------------- timm models

def _timm_build(arch: str, small_res: int):
    def build(device, size):
        import timm

        torch.manual_seed(0)
        m = timm.create_model(arch, pretrained=False).to(device)
        b, res = (2, small_res) if size == "small" else (32, 224)
        return BuiltModel(m, (_image(b, res, device),), {}, f"{arch} batch={b} res={res}")

    return build


MODELS: dict[str, ModelSpec] = {}


def _add(spec: ModelSpec) -> None:
    MODELS[spec.name] = spec


_add(ModelSpec("mlp", "coil", _build_mlp, "Linear/ReLU stack"))
_add(ModelSpec("small_gpt", "coil", _build_small_gpt, "coil's minimal GPT (written-out attention)"))
_add(ModelSpec("convnet", "coil", _build_convnet, "Conv/BatchNorm/ReLU net"))
_add(ModelSpec("hf_gpt2", "transformers",
               _hf_build("GPT2LMHeadModel", "GPT2Config", _GPT2,
                         _lm_args({"small": (2, 64), "full": (8, 512)}),
                         "GPT-2 layers={n_layer} d={n_embd}"),
               "transformers GPT2LMHeadModel"))
_add(ModelSpec("hf_bert", "transformers",
               _hf_build("BertForMaskedLM", "BertConfig", _BERT,
                         _lm_args({"small": (2, 64), "full": (8, 512)}),
                         "BERT layers={num_hidden_layers} d={hidden_size}"),
               "transformers BertForMaskedLM"))
_add(ModelSpec("hf_llama", "transformers",
               _hf_build("LlamaForCausalLM", "LlamaConfig", _LLAMA,
                         _lm_args({"small": (2, 64), "full": (4, 512)}),
                         "LLaMA layers={num_hidden_layers} d={hidden_size}"),
               "transformers LlamaForCausalLM"))
_add(ModelSpec("hf_t5", "transformers",
               _hf_build("T5ForConditionalGeneration", "T5Config", _T5, _t5_args,
                         "T5 layers={num_layers} d={d_model}"),
               "transformers T5ForConditionalGeneration"))
_add(ModelSpec("hf_vit", "transformers",
               _hf_build("ViTForImageClassification", "ViTConfig", _VIT, _vit_args,
                         "ViT layers={num_hidden_layers} d={hidden_size}"),
               "transformers ViTForImageClassification"))
_add(ModelSpec("timm_resnet50", "timm", _timm_build("resnet50", 64), "timm ResNet-50"))
_add(ModelSpec("timm_vit_b16", "timm", _timm_build("vit_base_patch16_224", 224),
               "timm ViT-B/16"))


#: Suite names ``coil bench --suite`` accepts: "default" (:data:`MODELS`) and "broad"
#: (coil/bench/broad.py).
SUITES = ("default", "broad")


def all_models() -> dict[str, ModelSpec]:
    """Every model of every suite by name (the default suite's first)."""
    from coil.bench.broad import BROAD_MODELS

    return {**MODELS, **BROAD_MODELS}


def select_models(names: Optional[list[str]] = None, suite: str = "default") -> list[ModelSpec]:
    """The specs named (from any suite), in the order given; all of ``suite``, in suite
    order, if None. Raises ValueError on unknown names or suites."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
    known = all_models()
    if not names:
        if suite == "broad":
            from coil.bench.broad import BROAD
            return [known[n] for n in BROAD]
        return list(MODELS.values())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; valid: {', '.join(known)}")
    return [known[n] for n in dict.fromkeys(names)]


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    """All tensors in ``out`` (tensor, tuple/list, dict or transformers ModelOutput), in
    order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):  # ModelOutput is an OrderedDict
        return [t for v in out.values() for t in flatten_outputs(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in flatten_outputs(v)]
    return []


def reduce_to_scalar_loss(out: Any) -> torch.Tensor:
    """A scalar loss from any output: the sum of the means of its floating tensors
    (computed in float32 or wider), like PyTorch's benchmark harness."""
    tensors = [t for t in flatten_outputs(out) if t.is_floating_point()]
    if not tensors:
        raise ValueError("model output has no floating tensors to build a loss from")
    return sum(t.float().mean() if t.dtype in (torch.float16, torch.bfloat16) else t.mean()
               for t in tensors)
