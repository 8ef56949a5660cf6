"""The broad model suite (``coil bench --suite broad``): transformers and timm families.

Every model is built from a config with random weights (``torch.manual_seed(0)``; nothing
is downloaded). ``size="full"`` (the GPU) uses the family's real widths, heads, vocabulary
and batch x sequence of the PyTorch dashboards' runs, with fewer layers for the
multi-billion-parameter decoders (so that a row compiles and times within one device
call); ``size="small"`` (CPU, tests) shrinks everything to a few million parameters.

Families, and what each one exercises in a compiler:

- decoder-only: GPT-2 (learned positions, fused QKV), LLaMA (GQA, RoPE, RMSNorm, SwiGLU),
  Mistral (sliding-window attention), Mixtral (top-2 MoE routing), BLOOM (ALiBi), GPT-NeoX
  (parallel residual, partial rotary), Phi (partial rotary, parallel attention/MLP),
  Qwen2 (GQA with QKV bias), Gemma (GeGLU, scaled embeddings), OPT, Falcon (multi-query,
  parallel attention), GPT-J, GPT-BigCode (multi-query), StableLM, Gemma-2 (logit
  soft-capping);
- encoders: BERT, RoBERTa, DistilBERT, ALBERT (shared layers), DeBERTa-v2 (disentangled
  relative attention), ELECTRA, XLM-RoBERTa;
- encoder-decoders: T5 (relative position buckets), BART, mBART, Marian;
- audio: Whisper (conv front end + encoder-decoder), wav2vec2 and HuBERT (conv feature
  extractor, positional conv);
- timm CNNs: ResNet-50, EfficientNet-B0 and MobileNet-V3 (depthwise-separable with
  squeeze-excitation), ConvNeXt-T, RegNetY-1.6GF, DenseNet-121, ResNeXt-50, MobileNet-V2,
  and ResNet-50 / ConvNeXt-T / EfficientNet-B0 with channels-last inputs and weights;
- vision transformers: timm ViT-B/16, DeiT-S, Swin-T (shifted windows), BEiT-B (relative
  position bias), and transformers' ViT, DeiT, Swin and BEiT (these run on CPU without
  timm).

Dropout, layer drop, stochastic depth, SpecAugment masking and router jitter are 0, so a
training step is deterministic. :data:`BROAD` lists the names in suite order.
"""
from __future__ import annotations

from typing import Callable

import torch

from coil.bench.models import BuiltModel, ModelSpec, _ids, _image

#: config attributes set to 0 in every transformers config: anything random in training
_RANDOM_KEYS = ("dropout", "pdrop", "layerdrop", "drop_prob", "jitter", "mask_time_prob",
                "mask_feature_prob", "drop_path")


def _derandomize(conf) -> None:
    for key, value in conf.to_dict().items():
        if isinstance(value, float) and any(k in key for k in _RANDOM_KEYS):
            setattr(conf, key, 0.0)
    if hasattr(conf, "use_cache"):
        conf.use_cache = False


class Fp64EagerExperts(torch.nn.Module):
    """Runs a transformers mixture-of-experts model as configured (grouped-mm experts by
    default), except when its parameters are float64 (the bench's reference copy):
    ``torch._grouped_mm`` has no float64 kernel, so there the experts run as
    transformers' per-expert loop ("eager"), which computes the same function."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.configured = getattr(model.config, "_experts_implementation", None)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self.configured is not None:
            fp64 = next(self.model.parameters()).dtype == torch.float64
            self.model.config._experts_implementation = "eager" if fp64 else self.configured
        return out

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def _hf(model_cls: str, config_cls: str, small: dict, full: dict,
        inputs: Callable[[object, str, torch.device], tuple[tuple, dict, str]],
        wrap: Callable = None) -> Callable:
    """``build(device, size)`` for ``transformers.<model_cls>(<config_cls>(**cfg))``
    (``wrap``: applied to the model)."""
    def build(device, size):
        import transformers

        cfg = small if size == "small" else full
        conf = getattr(transformers, config_cls)(**cfg)
        _derandomize(conf)
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(conf).to(device)
        if wrap is not None:
            model = wrap(model)
        args, kwargs, shape = inputs(conf, size, device)
        desc = " ".join(f"{k}={v}" for k, v in cfg.items() if k in _SHOWN)
        return BuiltModel(model, args, kwargs, f"{config_cls[:-6]} {desc} {shape}".strip())

    return build


_SHOWN = ("num_hidden_layers", "n_layer", "num_layers", "hidden_size", "n_embd", "d_model",
          "dim", "n_layers", "encoder_layers", "num_local_experts", "sliding_window")


def _lm(small=(2, 64), full=(8, 512)):
    def fn(conf, size, device):
        b, s = small if size == "small" else full
        return (_ids(b, s, conf.vocab_size, device),), {}, f"batch={b}x{s}"
    return fn


def _seq2seq(small=(2, 32, 16), full=(8, 512, 128)):
    def fn(conf, size, device):
        b, s, d = small if size == "small" else full
        return ((_ids(b, s, conf.vocab_size, device),),
                {"decoder_input_ids": _ids(b, d, conf.vocab_size, device)}, f"batch={b}x{s}/{d}")
    return fn


def _whisper_inputs(conf, size, device):
    b, d = (2, 16) if size == "small" else (8, 128)
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(b, conf.num_mel_bins, 2 * conf.max_source_positions, generator=g)
    return ((feats.to(device),), {"decoder_input_ids": _ids(b, d, conf.vocab_size, device)},
            f"batch={b} frames={feats.shape[-1]}/{d}")


def _audio_inputs(conf, size, device):
    b, n = (2, 4000) if size == "small" else (8, 16000 * 5)
    g = torch.Generator().manual_seed(1)
    return (torch.randn(b, n, generator=g).to(device),), {}, f"batch={b} samples={n}"


def _pixels(small=(2, 32), full=(32, 224)):
    def fn(conf, size, device):
        b, res = small if size == "small" else full
        return (_image(b, res, device),), {}, f"batch={b} res={res}"
    return fn


def _timm(arch: str, small_res: int = 64, batch: int = 64, channels_last: bool = False,
          full_res: int = 224) -> Callable:
    """``build(device, size)`` for ``timm.create_model(arch)`` with random weights."""
    def build(device, size):
        import timm

        torch.manual_seed(0)
        try:
            m = timm.create_model(arch, pretrained=False, drop_rate=0.0, drop_path_rate=0.0)
        except TypeError:   # a model without stochastic depth (timm's DenseNet)
            m = timm.create_model(arch, pretrained=False, drop_rate=0.0)
        m = m.to(device)
        b, res = (2, small_res) if size == "small" else (batch, full_res)
        x = _image(b, res, device)
        if channels_last:
            m = m.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        cl = " channels_last" if channels_last else ""
        return BuiltModel(m, (x,), {}, f"{arch} batch={b} res={res}{cl}")

    return build


def _dec(layers, hidden, heads, vocab, inter=None, **extra):
    """A LLaMA-style decoder config dict (names shared by most transformers decoders)."""
    d = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
             vocab_size=vocab, max_position_embeddings=2048)
    if inter is not None:
        d["intermediate_size"] = inter
    d.update(extra)
    return d


def _enc(layers, hidden, heads, vocab, inter, **extra):
    d = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
             vocab_size=vocab, intermediate_size=inter, max_position_embeddings=512)
    d.update(extra)
    return d


_SPECS: list[tuple[str, str, Callable, str]] = [
    # ------------------------------------------------------------ decoder-only
    ("b_gpt2", "transformers", _hf(
        "GPT2LMHeadModel", "GPT2Config",
        dict(n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=256, bos_token_id=0,
             eos_token_id=0),
        dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024), _lm()),
     "GPT-2 small"),
    ("b_llama_gqa", "transformers", _hf(
        "LlamaForCausalLM", "LlamaConfig",
        _dec(2, 128, 4, 2048, 352, num_key_value_heads=2),
        _dec(4, 2048, 16, 32000, 5632, num_key_value_heads=4), _lm(full=(4, 512))),
     "LLaMA-style GQA decoder (RoPE, RMSNorm, SwiGLU)"),
    ("b_mistral_swa", "transformers", _hf(
        "MistralForCausalLM", "MistralConfig",
        _dec(2, 128, 4, 2048, 352, num_key_value_heads=2, sliding_window=32),
        _dec(4, 2048, 16, 32000, 7168, num_key_value_heads=4, sliding_window=256),
        _lm(full=(4, 512))),
     "Mistral: GQA with sliding-window attention"),
    ("b_mixtral_moe", "transformers", _hf(
        "MixtralForCausalLM", "MixtralConfig",
        _dec(2, 128, 4, 2048, 256, num_key_value_heads=2, num_local_experts=4,
             num_experts_per_tok=2),
        _dec(2, 1024, 16, 32000, 3584, num_key_value_heads=4, num_local_experts=8,
             num_experts_per_tok=2), _lm(full=(4, 512)), wrap=Fp64EagerExperts),
     "Mixtral: top-2 mixture-of-experts routing"),
    ("b_bloom_alibi", "transformers", _hf(
        "BloomForCausalLM", "BloomConfig",
        dict(n_layer=2, hidden_size=128, n_head=4, vocab_size=2048),
        dict(n_layer=8, hidden_size=1536, n_head=16, vocab_size=50304), _lm(full=(4, 512))),
     "BLOOM: ALiBi attention bias"),
    ("b_gpt_neox", "transformers", _hf(
        "GPTNeoXForCausalLM", "GPTNeoXConfig",
        _dec(2, 128, 4, 2048, 512, rotary_pct=0.25, use_parallel_residual=True),
        _dec(6, 2048, 16, 50304, 8192, rotary_pct=0.25, use_parallel_residual=True),
        _lm(full=(4, 512))),
     "GPT-NeoX: parallel residual, partial rotary"),
    ("b_phi", "transformers", _hf(
        "PhiForCausalLM", "PhiConfig",
        _dec(2, 128, 4, 2048, 512, partial_rotary_factor=0.5),
        _dec(6, 2048, 32, 51200, 8192, partial_rotary_factor=0.5), _lm(full=(4, 512))),
     "Phi: parallel attention/MLP, partial rotary"),
    ("b_qwen2", "transformers", _hf(
        "Qwen2ForCausalLM", "Qwen2Config",
        _dec(2, 128, 4, 2048, 352, num_key_value_heads=2),
        _dec(6, 1536, 12, 32000, 8960, num_key_value_heads=2), _lm(full=(4, 512))),
     "Qwen2: GQA with QKV bias"),
    ("b_gemma", "transformers", _hf(
        "GemmaForCausalLM", "GemmaConfig",
        _dec(2, 128, 4, 2048, 512, num_key_value_heads=1, head_dim=32),
        _dec(4, 2048, 8, 32000, 16384, num_key_value_heads=1, head_dim=256),
        _lm(full=(4, 512))),
     "Gemma: GeGLU, multi-query, scaled embeddings"),
    ("b_opt", "transformers", _hf(
        "OPTForCausalLM", "OPTConfig",
        dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, ffn_dim=512,
             vocab_size=2048, word_embed_proj_dim=128),
        dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, ffn_dim=3072,
             vocab_size=50272, word_embed_proj_dim=768), _lm()),
     "OPT-125M shape"),
    ("b_falcon", "transformers", _hf(
        "FalconForCausalLM", "FalconConfig",
        dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, vocab_size=2048,
             multi_query=True, parallel_attn=True, new_decoder_architecture=False),
        dict(num_hidden_layers=6, hidden_size=2048, num_attention_heads=32, vocab_size=65024,
             multi_query=True, parallel_attn=True, new_decoder_architecture=False),
        _lm(full=(4, 512))),
     "Falcon: multi-query, parallel attention"),
    ("b_gptj", "transformers", _hf(
        "GPTJForCausalLM", "GPTJConfig",
        dict(n_layer=2, n_embd=128, n_head=4, rotary_dim=16, vocab_size=2048, n_positions=256),
        dict(n_layer=4, n_embd=2048, n_head=16, rotary_dim=64, vocab_size=50400,
             n_positions=2048), _lm(full=(4, 512))),
     "GPT-J: parallel residual, interleaved rotary"),
    ("b_gpt_bigcode", "transformers", _hf(
        "GPTBigCodeForCausalLM", "GPTBigCodeConfig",
        dict(n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=256, multi_query=True),
        dict(n_layer=12, n_embd=768, n_head=12, vocab_size=49152, n_positions=1024,
             multi_query=True, bos_token_id=0, eos_token_id=0), _lm()),
     "GPT-BigCode (SantaCoder shape): multi-query"),
    ("b_stablelm", "transformers", _hf(
        "StableLmForCausalLM", "StableLmConfig",
        _dec(2, 128, 4, 2048, 352, partial_rotary_factor=0.25, num_key_value_heads=4),
        _dec(4, 2048, 32, 50304, 5632, partial_rotary_factor=0.25, num_key_value_heads=32),
        _lm(full=(4, 512))),
     "StableLM: LayerNorm, partial rotary"),
    ("b_gemma2", "transformers", _hf(
        "Gemma2ForCausalLM", "Gemma2Config",
        _dec(2, 128, 4, 2048, 512, num_key_value_heads=2, head_dim=32, sliding_window=32),
        _dec(4, 2304, 8, 32000, 9216, num_key_value_heads=4, head_dim=256, sliding_window=256),
        _lm(full=(4, 512))),
     "Gemma-2: logit soft-capping, alternating sliding windows"),
    # ------------------------------------------------------------ encoders
    ("b_bert", "transformers", _hf(
        "BertForMaskedLM", "BertConfig", _enc(2, 128, 4, 2048, 512),
        _enc(12, 768, 12, 30522, 3072), _lm()), "BERT-base"),
    ("b_roberta", "transformers", _hf(
        "RobertaForMaskedLM", "RobertaConfig", _enc(2, 128, 4, 2048, 512, pad_token_id=1),
        _enc(12, 768, 12, 50265, 3072, max_position_embeddings=514), _lm()), "RoBERTa-base"),
    ("b_distilbert", "transformers", _hf(
        "DistilBertForMaskedLM", "DistilBertConfig",
        dict(n_layers=2, dim=128, n_heads=4, hidden_dim=512, vocab_size=2048),
        dict(n_layers=6, dim=768, n_heads=12, hidden_dim=3072, vocab_size=30522), _lm()),
     "DistilBERT"),
    ("b_albert", "transformers", _hf(
        "AlbertForMaskedLM", "AlbertConfig", _enc(2, 128, 4, 2048, 512, embedding_size=64),
        _enc(12, 768, 12, 30000, 3072, embedding_size=128), _lm()),
     "ALBERT-base: one layer's weights shared by all"),
    ("b_deberta_v2", "transformers", _hf(
        "DebertaV2ForMaskedLM", "DebertaV2Config", _enc(2, 128, 4, 2048, 512),
        _enc(12, 768, 12, 128100, 3072), _lm(full=(8, 512))),
     "DeBERTa-v2/v3-base: disentangled relative attention"),
    ("b_electra", "transformers", _hf(
        "ElectraForMaskedLM", "ElectraConfig", _enc(2, 128, 4, 2048, 512, embedding_size=128),
        _enc(12, 768, 12, 30522, 3072, embedding_size=768), _lm()),
     "ELECTRA-base (generator head)"),
    ("b_xlm_roberta", "transformers", _hf(
        "XLMRobertaForMaskedLM", "XLMRobertaConfig", _enc(2, 128, 4, 2048, 512, pad_token_id=1),
        _enc(12, 768, 12, 250002, 3072, max_position_embeddings=514), _lm(full=(8, 512))),
     "XLM-RoBERTa-base (250k vocabulary)"),
    # ------------------------------------------------------------ encoder-decoders
    ("b_t5", "transformers", _hf(
        "T5ForConditionalGeneration", "T5Config",
        dict(num_layers=2, num_decoder_layers=2, d_model=128, d_kv=32, num_heads=4, d_ff=256,
             vocab_size=2048),
        dict(num_layers=6, num_decoder_layers=6, d_model=512, d_kv=64, num_heads=8, d_ff=2048,
             vocab_size=32128), _seq2seq()), "T5-small"),
    ("b_bart", "transformers", _hf(
        "BartForConditionalGeneration", "BartConfig",
        dict(encoder_layers=2, decoder_layers=2, d_model=128, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512, vocab_size=2048),
        dict(encoder_layers=6, decoder_layers=6, d_model=768, encoder_attention_heads=12,
             decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
             vocab_size=50265), _seq2seq()), "BART-base"),
    ("b_mbart", "transformers", _hf(
        "MBartForConditionalGeneration", "MBartConfig",
        dict(encoder_layers=2, decoder_layers=2, d_model=128, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512, vocab_size=2048),
        dict(encoder_layers=6, decoder_layers=6, d_model=1024, encoder_attention_heads=16,
             decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096,
             vocab_size=50265), _seq2seq(full=(4, 512, 128))), "mBART: pre-LN encoder-decoder"),
    ("b_marian", "transformers", _hf(
        "MarianMTModel", "MarianConfig",
        dict(encoder_layers=2, decoder_layers=2, d_model=128, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512, vocab_size=2048,
             decoder_vocab_size=2048, pad_token_id=2047, decoder_start_token_id=2047),
        dict(encoder_layers=6, decoder_layers=6, d_model=512, encoder_attention_heads=8,
             decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
             vocab_size=58101, decoder_vocab_size=58101, pad_token_id=58100,
             decoder_start_token_id=58100), _seq2seq()), "Marian MT: sinusoidal positions"),
    # ------------------------------------------------------------ audio
    ("b_whisper", "transformers", _hf(
        "WhisperForConditionalGeneration", "WhisperConfig",
        dict(encoder_layers=2, decoder_layers=2, d_model=128, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512,
             vocab_size=2048, num_mel_bins=80, max_source_positions=64, max_target_positions=64,
             pad_token_id=2, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
        dict(encoder_layers=6, decoder_layers=6, d_model=512, encoder_attention_heads=8,
             decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
             vocab_size=51865, num_mel_bins=80, max_source_positions=1500,
             max_target_positions=448), _whisper_inputs),
     "Whisper-base: conv front end + encoder-decoder"),
    ("b_wav2vec2", "transformers", _hf(
        "Wav2Vec2ForCTC", "Wav2Vec2Config",
        _enc(2, 128, 4, 32, 512, conv_dim=(64, 64, 64), conv_stride=(5, 2, 2),
             conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        _enc(12, 768, 12, 32, 3072), _audio_inputs),
     "wav2vec2-base: conv feature extractor, positional conv"),
    ("b_hubert", "transformers", _hf(
        "HubertForCTC", "HubertConfig",
        _enc(2, 128, 4, 32, 512, conv_dim=(64, 64, 64), conv_stride=(5, 2, 2),
             conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        _enc(12, 768, 12, 32, 3072), _audio_inputs), "HuBERT-base"),
    # ------------------------------------------------------------ timm CNNs
    ("b_resnet50", "timm", _timm("resnet50"), "timm ResNet-50"),
    ("b_resnet50_cl", "timm", _timm("resnet50", channels_last=True),
     "timm ResNet-50, channels-last inputs and weights"),
    ("b_efficientnet_b0", "timm", _timm("efficientnet_b0", batch=128),
     "timm EfficientNet-B0: depthwise-separable + squeeze-excitation"),
    ("b_efficientnet_b0_cl", "timm", _timm("efficientnet_b0", batch=128, channels_last=True),
     "timm EfficientNet-B0, channels-last"),
    ("b_mobilenetv3", "timm", _timm("mobilenetv3_large_100", batch=128),
     "timm MobileNet-V3 large: hard-swish, squeeze-excitation"),
    ("b_mobilenetv2", "timm", _timm("mobilenetv2_100", batch=128), "timm MobileNet-V2"),
    ("b_convnext_tiny", "timm", _timm("convnext_tiny"), "timm ConvNeXt-T: 7x7 depthwise, LayerNorm"),
    ("b_convnext_tiny_cl", "timm", _timm("convnext_tiny", channels_last=True),
     "timm ConvNeXt-T, channels-last"),
    ("b_regnety_016", "timm", _timm("regnety_016"), "timm RegNetY-1.6GF: group conv + SE"),
    ("b_densenet121", "timm", _timm("densenet121"), "timm DenseNet-121: concatenations"),
    ("b_resnext50", "timm", _timm("resnext50_32x4d"), "timm ResNeXt-50 32x4d: grouped conv"),
    # ------------------------------------------------------------ vision transformers
    ("b_vit_b16", "timm", _timm("vit_base_patch16_224", small_res=224), "timm ViT-B/16"),
    ("b_deit_small", "timm", _timm("deit_small_patch16_224", small_res=224, batch=64),
     "timm DeiT-S"),
    ("b_swin_tiny", "timm", _timm("swin_tiny_patch4_window7_224", small_res=224),
     "timm Swin-T: shifted windows, relative position bias"),
    ("b_beit_base", "timm", _timm("beit_base_patch16_224", small_res=224),
     "timm BEiT-B: relative position bias"),
    ("b_hf_vit", "transformers", _hf(
        "ViTForImageClassification", "ViTConfig",
        dict(image_size=32, patch_size=8, num_hidden_layers=2, hidden_size=128,
             num_attention_heads=4, intermediate_size=512, num_labels=10),
        dict(image_size=224, patch_size=16, num_hidden_layers=12, hidden_size=768,
             num_attention_heads=12, intermediate_size=3072, num_labels=1000), _pixels()),
     "transformers ViT-B/16"),
    ("b_hf_deit", "transformers", _hf(
        "DeiTForImageClassificationWithTeacher", "DeiTConfig",
        dict(image_size=32, patch_size=8, num_hidden_layers=2, hidden_size=128,
             num_attention_heads=4, intermediate_size=512, num_labels=10),
        dict(image_size=224, patch_size=16, num_hidden_layers=12, hidden_size=384,
             num_attention_heads=6, intermediate_size=1536, num_labels=1000),
        _pixels(full=(64, 224))), "transformers DeiT-S (distillation token)"),
    ("b_hf_swin", "transformers", _hf(
        "SwinForImageClassification", "SwinConfig",
        dict(image_size=56, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4],
             window_size=7, num_labels=10),
        dict(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 6, 2],
             num_heads=[3, 6, 12, 24], window_size=7, num_labels=1000),
        _pixels(small=(2, 56))), "transformers Swin-T: shifted windows"),
    ("b_hf_beit", "transformers", _hf(
        "BeitForImageClassification", "BeitConfig",
        dict(image_size=32, patch_size=8, num_hidden_layers=2, hidden_size=128,
             num_attention_heads=4, intermediate_size=512, num_labels=10,
             use_relative_position_bias=True),
        dict(image_size=224, patch_size=16, num_hidden_layers=12, hidden_size=768,
             num_attention_heads=12, intermediate_size=3072, num_labels=1000,
             use_relative_position_bias=True), _pixels()),
     "transformers BEiT-B: relative position bias"),
]

#: The broad suite's specs by name, in suite order.
BROAD_MODELS: dict[str, ModelSpec] = {name: ModelSpec(name, source, build, desc)
                                      for name, source, build, desc in _SPECS}
#: The broad suite's model names, in order.
BROAD: list[str] = list(BROAD_MODELS)
#: The modes the broad suite runs by default: bf16 inference and AMP training.
BROAD_MODES = ("bf16", "train")
