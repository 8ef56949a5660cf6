"""coil bench on tiny models with deliberately wrong / slow / failing compilers."""
import json

import pytest
import torch

from coil.bench import suite
from coil.bench.compilers import StatsProbe
from coil.bench.models import MODELS, flatten_outputs, reduce_to_scalar_loss
from coil.cli import main


def _bench(compilers, modes=("fp32",), model="mlp", **kw):
    opts = suite.BenchOptions(models=[model], modes=list(modes), compilers=list(compilers),
                              device="cpu", repeat=3, warmup=1, progress=False,
                              fresh_caches=False, **kw)
    return {r["compiler"] + "/" + r["mode"]: r for r in suite.run_bench(opts)["rows"]}


def test_wrong_compiler_is_a_mismatch_and_eager_passes():
    rows = _bench(["eager", "fake_compilers:WRONG"], modes=("fp32", "train"))
    assert rows["eager/fp32"]["status"] == "pass"
    assert rows["eager/train"]["status"] == "pass"
    assert rows["wrong/fp32"]["status"] == "mismatch"
    assert rows["wrong/train"]["status"] == "mismatch"
    assert rows["eager/fp32"]["speedup"] > 0


def test_failing_compiler_is_an_error_row_with_no_numbers():
    rows = _bench(["fake_compilers:RAISES", "eager"])
    r = rows["raises/fp32"]
    assert r["status"] == "error" and "not built yet" in r["error"]
    for k in ("speedup", "eager_ms", "compiled_ms", "cold_compile_s", "graphs"):
        assert r[k] is None
    assert rows["eager/fp32"]["status"] == "pass"  # the run went on
    text = suite.format_text({"meta": {}, "rows": list(rows.values())})
    assert "not built yet" in text and "—" in text


def test_slow_compiler_speedup_below_one():
    r = _bench(["fake_compilers:SLOW"])["slow/fp32"]
    assert r["status"] == "pass"
    assert r["compiled_ms"] >= 20.0
    assert r["speedup"] == pytest.approx(r["eager_ms"] / r["compiled_ms"])
    # below one: the compiled call adds 20 ms of sleep to eager's; a loaded machine can
    # make the tiny eager call itself take that long (seen once in CI at load 12)
    assert r["speedup"] < 1.0 or r["eager_ms"] >= 20.0, r
    assert r["cold_compile_s"] >= 0.02 and r["warm_compile_s"] >= 0.02


def test_bf16_mode_and_budget_skip():
    rows = _bench(["eager"], modes=("bf16",))
    assert rows["eager/bf16"]["status"] == "pass"
    rows = _bench(["eager"], budget_s=1e-9)
    assert rows["eager/fp32"]["status"] == "skipped"
    assert rows["eager/fp32"]["speedup"] is None


def test_graph_and_break_counts_from_torch_capture():
    def f(x):
        y = x.sin()
        print("", end="")  # a graph break under torch.compile
        return y.cos()

    import fake_compilers

    torch._dynamo.reset()
    compiled, probe = fake_compilers.TORCH_EAGER.compile(f)
    compiled(torch.randn(4))
    counts = probe.read()
    assert counts.graphs == 2 and counts.graph_breaks == 1


def test_probe_reports_none_not_zero_when_unknown():
    p = StatsProbe("coil")
    p.start()
    assert p.read().graphs == 0  # backend calls are always counted
    # coil's capture counter may or may not exist; never invent one
    assert p.read().graph_breaks in (None, 0)


def test_models_build_and_flatten():
    for name in ("mlp", "small_gpt", "convnet"):
        b = MODELS[name].build(torch.device("cpu"), "small")
        out = b.module(*b.args, **b.kwargs)
        assert flatten_outputs(out) and reduce_to_scalar_loss(out).dim() == 0


def test_cli_json_and_markdown(tmp_path, capsys):
    j, m = tmp_path / "r.json", tmp_path / "r.md"
    rc = main(["bench", "--model", "mlp", "--mode", "fp32", "--compiler", "eager",
               "fake_compilers:WRONG", "--repeat", "2", "--warmup", "1", "--no-progress",
               "--keep-caches", "--json", str(j), "--markdown", str(m)])
    assert rc == 0
    data = json.loads(j.read_text())
    assert {r["status"] for r in data["rows"]} == {"pass", "mismatch"}
    assert data["meta"]["torch"] == torch.__version__
    md = m.read_text()
    assert "| mlp | fp32 | wrong | mismatch |" in md and "command:" in md
    assert main(["bench", "--model", "mlp", "--mode", "fp32", "--compiler", "fake_compilers:WRONG",
                 "--repeat", "1", "--no-progress", "--keep-caches", "--quiet", "--strict"]) == 1


def test_isolated_run_keeps_rows_finished_before_a_crash(tmp_path):
    j = tmp_path / "r.json"
    rc = main(["bench", "--isolate", "--model", "mlp", "--mode", "fp32", "--compiler", "eager",
               "fake_compilers:CRASH", "--repeat", "1", "--warmup", "0", "--no-progress",
               "--keep-caches", "--quiet", "--json", str(j)])
    assert rc == 0
    rows = {r["compiler"]: r for r in json.loads(j.read_text())["rows"]}
    assert rows["eager"]["status"] == "pass" and rows["eager"]["eager_ms"] > 0
    crash = rows["fake_compilers:CRASH"]
    assert crash["status"] == "error" and "exited 5" in crash["error"]
    assert crash["speedup"] is None


def test_cpu_eager_baseline_of_a_training_row_runs_without_autocast():
    """The eager series and eager outputs of a CPU training row ran under bf16 autocast while the compiled steps did
    not (make_step enables it on CUDA only): eager took 137 ms against 12 ms for the same step, every speedup was ~10x
    and the accuracy ratios compared against bf16 values."""
    from coil.bench import suite

    seen = []

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            seen.append(torch.is_autocast_enabled("cpu"))
            return self.lin(x)

    suite._step_on_copy(M(), (torch.randn(2, 4),), {}, "train", torch.device("cpu"))()
    assert seen == [False]
