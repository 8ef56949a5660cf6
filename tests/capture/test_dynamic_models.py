"""Dynamic shapes on real models through coil's own capture (issue 17).

transformers GPT-2, LLaMA and BERT (small configs, random weights) over sequence lengths
7, 33, 128, 500: ONE graph with ``dynamic=True``, static + one automatic-dynamic graph by
default, values equal to eager. The fast tests are the capture classes that used to
specialize the sequence length (``(-1,) + input_shape[1:]`` in GPT-2: a tuple
concatenated with a slice of a ``torch.Size``) and one model on the ``eager`` backend;
the full matrix through ``backend="coil"`` is slow.
"""
import math

import pytest
import torch

import coil
from coil.backends import lookup_backend


class Counting:
    def __init__(self, name):
        self.inner = lookup_backend(name)
        self.n = 0
        self.__name__ = f"counting_{name}"

    def __call__(self, gm, example_inputs):
        self.n += 1
        return self.inner(gm, example_inputs)


# ------------------------------------------------------------------ capture classes

#: Each used to pin the size through ``as_python_constant`` (a ``specialization``).
SIZE_TUPLE_PROGRAMS = {
    "tuple_plus_size": lambda x: x.view((-1,) + x.shape[1:]),            # GPT-2 line 605
    "size_plus_tuple": lambda x: x.view(x.shape[:-1] + (2, -1)),
    "size_type_kept": lambda x: (x * 2, type((1,) + x.shape[1:]) is torch.Size,
                                 type(x.shape[:1] + (1,)) is torch.Size),
    "torch_Size_of_list": lambda x: x.view(torch.Size([x.shape[0], -1])),
    "size_numel": lambda x: x.view(x.shape.numel()),
    "max_of_sizes": lambda x: x[: max(2, x.size(0) // 2)],
    "min_of_sizes": lambda x: x.new_zeros(min(x.size(0), x.size(1) - 3)) + 1,
    "math_prod_slice": lambda x: x.view(-1, math.prod(x.shape[1:])),
}


@pytest.mark.parametrize("name", sorted(SIZE_TUPLE_PROGRAMS))
def test_size_tuples_stay_symbolic(name):
    fn = SIZE_TUPLE_PROGRAMS[name]
    cnt = Counting("eager")
    f = coil.compile(fn, backend=cnt, dynamic=True)
    for shape in ((4, 6), (5, 8), (7, 10)):
        x = torch.randn(shape)
        got, want = f(x), fn(x)
        if isinstance(got, tuple):
            assert got[1:] == want[1:]
            got, want = got[0], want[0]
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    assert cnt.n == 1


def test_tuple_plus_list_is_a_type_error():
    def fn(x):
        return x * len((1,) + [2])

    with pytest.raises(TypeError):
        fn(torch.ones(2))
    with pytest.raises(TypeError):
        coil.compile(fn, backend="eager")(torch.ones(2))


# ------------------------------------------------------------------ models


def _model(name):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=200,
                                      n_positions=512)
        return transformers.GPT2LMHeadModel(cfg).eval()
    if name == "llama":
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=128,
                                       vocab_size=200, max_position_embeddings=512)
        return transformers.LlamaForCausalLM(cfg).eval()
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=200,
                                  max_position_embeddings=512)
    return transformers.BertModel(cfg).eval()


def _out(o):
    return o.logits if hasattr(o, "logits") else o.last_hidden_state


def _run(name, backend, dynamic, lengths, batch=1, mask=False, options=None):
    from coil import exc

    m = _model(name)
    cnt = Counting(backend)
    f = coil.compile(m, backend=cnt, dynamic=dynamic, options=options)
    before = sum(exc.fallback_counts.values())
    for L in lengths:
        ids = torch.randint(0, 200, (batch, L))
        kw = {}
        if mask:
            am = torch.ones(batch, L, dtype=torch.long)
            am[0, : L // 3] = 0
            kw["attention_mask"] = am
        with torch.no_grad():
            torch.testing.assert_close(_out(f(ids, **kw)), _out(m(ids, **kw)),
                                       atol=1e-4, rtol=1e-4)
    assert sum(exc.fallback_counts.values()) == before      # generated code ran
    return cnt.n


def test_gpt2_one_graph_capture():
    """The fast sample: GPT-2's capture with dynamic=True is one graph for three lengths."""
    assert _run("gpt2", "eager", True, (7, 33, 128)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_models_batch_and_mask_one_graph_capture(name):
    assert _run(name, "eager", True, (7, 33, 128), batch=2, mask=True) == 1


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_models_lengths_cpp(name, dynamic):
    n = _run(name, "coil", dynamic, (7, 33, 128, 500), options={"cpu_backend": "cpp"})
    assert n == (1 if dynamic else 2)       # dynamic=True: one graph; default: static 7 + one


@pytest.mark.slow
def test_gpt2_lengths_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _run("gpt2", "coil", True, (7, 33, 128, 500), options={"cpu_backend": "triton"}) == 1
