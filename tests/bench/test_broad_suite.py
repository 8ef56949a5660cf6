"""The broad model suite (coil/bench/broad.py, ``coil bench --suite broad``): its list,
the per-row codegen-fallback count, the coil-vs-inductor summary, and (slow) the small
configs through the real coil compiler on CPU."""
import pytest
import torch

from coil.bench import suite
from coil.bench.broad import BROAD, BROAD_MODELS, BROAD_MODES
from coil.bench.models import MODELS, select_models


def test_broad_suite_has_every_family():
    assert len(BROAD) >= 40 and len(set(BROAD)) == len(BROAD)
    assert not set(BROAD) & set(MODELS)  # names are unique across suites
    descriptions = " ".join(BROAD_MODELS[n].description for n in BROAD).lower()
    for feature in ("gqa", "sliding-window", "mixture-of-experts", "alibi", "partial rotary",
                    "parallel residual", "depthwise", "squeeze-excitation", "channels-last",
                    "shifted windows", "relative position bias", "encoder-decoder",
                    "conv feature extractor", "densenet", "regnet", "convnext"):
        assert feature in descriptions, feature
    for n in ("b_gpt2", "b_phi", "b_qwen2", "b_gemma", "b_opt", "b_falcon", "b_bert",
              "b_roberta", "b_distilbert", "b_albert", "b_deberta_v2", "b_electra", "b_t5",
              "b_bart", "b_whisper", "b_wav2vec2", "b_resnet50", "b_efficientnet_b0",
              "b_mobilenetv3", "b_convnext_tiny", "b_regnety_016", "b_densenet121",
              "b_vit_b16", "b_deit_small", "b_swin_tiny", "b_beit_base"):
        assert n in BROAD_MODELS, n
    assert {BROAD_MODELS[n].source for n in BROAD} == {"transformers", "timm"}
    assert [s.name for s in select_models(suite="broad")] == BROAD
    assert select_models(["b_t5", "hf_gpt2"])[0].name == "b_t5"  # any suite by name
    assert tuple(BROAD_MODES) == ("bf16", "train")
    with pytest.raises(ValueError):
        select_models(suite="nope")


def test_cli_broad_suite_defaults_to_bf16_and_train(monkeypatch):
    from coil import cli
    seen = {}

    def fake_run(opts):
        seen["opts"] = opts
        return {"meta": {}, "rows": []}

    monkeypatch.setattr(suite, "run_bench", fake_run)
    assert cli.main(["bench", "--suite", "broad", "--quiet", "--no-progress"]) == 0
    assert list(seen["opts"].modes) == ["bf16", "train"] and seen["opts"].suite == "broad"
    assert cli.main(["bench", "--model", "mlp", "--quiet", "--no-progress"]) == 0
    assert list(seen["opts"].modes) == list(suite.MODES)


def test_rows_count_codegen_fallbacks(monkeypatch):
    """A coil row whose code generation fails runs with the FX interpreter (correct
    values, a pass) and says how many graphs fell back and why; other compilers' rows say None."""
    import coil.codegen as C
    from coil.config import patch

    def boom(gm, example_inputs, device):
        raise AssertionError("test: code generation failed")

    monkeypatch.setattr(C, "compile_aten_graph", boom)
    opts = suite.BenchOptions(models=["mlp"], modes=["fp32"], compilers=["eager", "coil"],
                              device="cpu", repeat=1, warmup=0, progress=False,
                              fresh_caches=False, warm_compile=False)
    with patch(strict_codegen=False), pytest.warns(UserWarning, match="code generation failed"):
        rows = {r["compiler"]: r for r in suite.run_bench(opts)["rows"]}
    assert rows["coil"]["status"] == "pass", rows["coil"]["error"]
    assert rows["coil"]["codegen_fallbacks"] == rows["coil"]["graphs"] >= 1
    assert rows["coil"]["fallback_errors"][0] == "codegen_fallback: AssertionError: test: code generation failed"
    assert rows["eager"]["codegen_fallbacks"] is None
    assert "fallbacks" in suite.format_text({"meta": {}, "rows": list(rows.values())})


def test_versus_summary_math():
    def row(model, comp, speedup, status="pass", fb=0):
        return dict(model=model, mode="bf16", compiler=comp, status=status, speedup=speedup,
                    codegen_fallbacks=fb)

    rows = [row("a", "coil", 2.0), row("a", "inductor", 1.0),
            row("b", "coil", 0.8), row("b", "inductor", 1.0, ),
            row("c", "coil", None, "error", None), row("c", "inductor", 1.5),
            row("d", "coil", 1.0, fb=2), row("d", "inductor", 1.0)]
    (v,) = suite.versus(rows)
    assert v["compared"] == 3 and v["models"] == 4
    assert v["geomean_ratio"] == pytest.approx((2.0 * 0.8 * 1.0) ** (1 / 3))
    assert v["worst_model"] == "b" and v["worst_ratio"] == pytest.approx(0.8)
    assert v["below_0_9"] == ["b"] and v["not_passing"] == 1 and v["with_fallbacks"] == 1


_CPU_ROWS = [n for n in BROAD if BROAD_MODELS[n].source == "transformers"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _CPU_ROWS)
def test_broad_small_config_through_coil(name):
    """The small config of each broad transformers model through the whole pipeline on
    CPU (fp32 inference and a training step): the accuracy rule passes and no graph
    falls back from coil's kernels (strict_codegen turns a fallback into an error)."""
    from coil.config import patch
    if not BROAD_MODELS[name].available():
        pytest.skip("transformers is not installed")
    opts = suite.BenchOptions(models=[name], modes=["fp32", "train"], compilers=["coil"],
                              device="cpu", repeat=1, warmup=0, progress=False,
                              fresh_caches=False, warm_compile=False, max_timing_s=5.0)
    with patch(strict_codegen=True):
        rows = suite.run_bench(opts)["rows"]
    for r in rows:
        assert r["status"] == "pass", (r["mode"], r["error"], (r["traceback"] or "")[-3000:])
        assert r["codegen_fallbacks"] == 0
