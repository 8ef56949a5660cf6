"""transformers models (random weights from small configs) captured in one graph."""
import pytest
import torch

import coil
from coil.capture import stats

transformers = pytest.importorskip("transformers")


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                  use_cache=False)
    return transformers.GPT2LMHeadModel(cfg), {"input_ids": torch.randint(0, 128, (2, 16))}


def _bert():
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=128, max_position_embeddings=64)
    ids = torch.randint(0, 128, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    return transformers.BertModel(cfg), {"input_ids": ids, "attention_mask": mask}


def _llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, vocab_size=128,
                                   max_position_embeddings=64, use_cache=False)
    return transformers.LlamaForCausalLM(cfg), {"input_ids": torch.randint(0, 128, (2, 16))}


def _t5():
    cfg = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, num_heads=4,
                                d_ff=128, vocab_size=128, use_cache=False)
    ids = torch.randint(0, 128, (2, 12))
    dec = torch.randint(0, 128, (2, 8))
    return transformers.T5ForConditionalGeneration(cfg), {"input_ids": ids, "decoder_input_ids": dec}


MODELS = {"gpt2": _gpt2, "bert": _bert, "llama": _llama, "t5": _t5}


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    return next(v for v in out if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("name", list(MODELS))
def test_eval_one_graph(name):
    model, inputs = MODELS[name]()
    model.eval()
    compiled = coil.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        ref = model(**inputs)
        out = compiled(**inputs)
    assert type(out) is type(ref)
    torch.testing.assert_close(_first_tensor(out), _first_tensor(ref))
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0 and stats["fallbacks"] == 0


@pytest.mark.parametrize("backend", ["eager", pytest.param("aot_eager", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", ["gpt2", "llama", pytest.param("bert", marks=pytest.mark.slow),
                                  pytest.param("t5", marks=pytest.mark.slow)])
def test_train_step_gradients(name, backend):
    if backend == "aot_eager":
        try:
            coil.backends.lookup_backend("aot_eager")
        except Exception as e:  # noqa: BLE001
            pytest.skip(f"aot_eager not available: {e}")
    model, inputs = MODELS[name]()
    model.train()
    compiled = coil.compile(model, backend=backend, fullgraph=True)
    # dropout: same RNG stream for both runs
    torch.manual_seed(1)
    ref = _first_tensor(model(**inputs))
    ref.float().pow(2).mean().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    torch.manual_seed(1)
    out = _first_tensor(compiled(**inputs))
    out.float().pow(2).mean().backward()
    torch.testing.assert_close(out, ref)
    for n, p in model.named_parameters():
        if n in ref_grads:
            torch.testing.assert_close(p.grad, ref_grads[n], msg=n)
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0


def _cache_tensors(cache):
    """The key/value tensors of a transformers cache (DynamicCache layers or legacy tuples)."""
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    if hasattr(cache, "key_cache"):
        return list(cache.key_cache) + list(cache.value_cache)
    return [t for layer in cache for t in layer]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_eval_default_config_use_cache_one_graph(name):
    # user report: with the DEFAULT config (use_cache=True) DynamicCache.__init__ iterates a
    # config Sequence whose __iter__ stops on IndexError from __getitem__; the caught
    # IndexError was a graph break that ran the whole model eagerly.
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                      n_positions=64)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=128,
                                       vocab_size=128, max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(cfg)
    assert cfg.use_cache
    model.eval()
    ids = torch.randint(0, 128, (2, 16))
    compiled = coil.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        ref = model(input_ids=ids)
        out = compiled(input_ids=ids)
    torch.testing.assert_close(out.logits, ref.logits)
    ref_kv, out_kv = _cache_tensors(ref.past_key_values), _cache_tensors(out.past_key_values)
    assert len(out_kv) == len(ref_kv) == 4
    for a, b in zip(out_kv, ref_kv):
        torch.testing.assert_close(a, b)
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0 and stats["fallbacks"] == 0
