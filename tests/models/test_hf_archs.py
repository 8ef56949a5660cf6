"""transformers architectures through coil vs eager and vs torch.compile's graph count
(coil/bench/hf_archs.py; the table in docs/testing.md). Every architecture runs under
``-m slow``; a few tiny ones run in CI."""
import pytest
import torch

pytest.importorskip("transformers")

from coil.bench import hf_archs  # noqa: E402
from coil.bench.compilers import Counts  # noqa: E402


def _check(name, torch_counts=True):
    row = hf_archs.check_arch(name, torch_counts=torch_counts)
    assert row.infer == "pass", row.infer
    assert row.train == "pass", row.train
    assert not row.extra_graphs, (row.coil_graphs, row.torch_graphs)
    assert row.fallbacks == 0, "graphs ran without coil's kernels"
    return row


@pytest.mark.parametrize("name", hf_archs.FAST)
def test_tiny_arch_matches_eager_in_one_graph(name):
    """CI: no torch.compile run (it makes one graph for both calls of these, as the slow
    test checks)."""
    row = _check(name, torch_counts=False)
    assert row.coil_graphs == (1, 1) and row.coil_breaks == (0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in hf_archs.ARCHS if n not in hf_archs.FAST])
def test_arch_matches_eager_with_no_more_graphs_than_torch_compile(name):
    _check(name)


def test_at_least_32_architectures_of_every_kind():
    names = set(hf_archs.ARCHS)
    assert len(names) >= 32
    for n in ("gpt2", "gptj", "gpt_neox", "opt", "bloom_alibi", "llama_gqa", "mistral_swa",
              "mixtral_moe", "qwen2", "gemma", "phi", "falcon", "stablelm", "bert", "roberta",
              "albert", "distilbert", "electra", "deberta_v2", "xlm_roberta", "t5", "bart",
              "marian", "pegasus", "whisper", "wav2vec2", "hubert", "hf_vit", "hf_deit",
              "hf_swin", "hf_beit", "hf_convnext", "hf_resnet", "hf_mobilevit"):
        assert n in names, n


def test_harness_reports_wrong_values_and_extra_graphs(monkeypatch):
    """A compiler that is 1% off and makes two graphs where torch.compile makes one
    fails the row (the harness can fail)."""
    def fake_run(compiler, module, train, args, kwargs):
        got = (hf_archs._train(module, module, args, kwargs) if train
               else hf_archs._infer(module, args, kwargs))
        if compiler == "coil":
            return [t * 1.01 for t in got], Counts(graphs=2, graph_breaks=1)
        return got, Counts(graphs=1, graph_breaks=0)

    monkeypatch.setattr(hf_archs, "_compiled_run", fake_run)
    row = hf_archs.check_arch("hf_resnet")
    assert row.infer.startswith("mismatch") and row.train.startswith("mismatch")
    assert row.coil_graphs == (2, 2) and row.torch_graphs == (1, 1) and row.extra_graphs
    assert not row.ok
    table = hf_archs.markdown([row])
    assert "| hf_resnet | mismatch | mismatch | 2/2 | 1/1 |" in table
    assert "0/1 architectures" in table


def test_training_call_gets_labels_where_the_model_takes_them():
    torch.manual_seed(0)
    built = hf_archs.ARCHS["gpt_neo"](torch.device("cpu"), "small")
    kw = hf_archs._with_labels(built.module, built.args, built.kwargs)
    assert torch.equal(kw["labels"], built.args[0])
    built = hf_archs.ARCHS["hf_resnet"](torch.device("cpu"), "small")
    kw = hf_archs._with_labels(built.module, built.args, built.kwargs)
    assert kw["labels"].shape == (2,) and kw["labels"].max() < 10
