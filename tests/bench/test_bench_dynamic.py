"""``coil bench --mode dynamic`` on CPU (coil/bench/dynamic.py): the small GPT-2 over a
few sequence lengths, graphs per compiler, per-length times, dynamic/static ratios, the
budget cut-off, failures confined to their row."""
import json

from coil import cli
from coil.bench import dynamic as dyn


def test_cli_counts_graphs_and_times_each_length(tmp_path, capsys):
    out, md = tmp_path / "dyn.json", tmp_path / "dyn.md"
    rc = cli.main(["bench", "--mode", "dynamic", "--model", "gpt2", "--lengths", "8", "11", "16",
                   "--compiler", "coil", "coil-static", "--warmup", "0", "--repeat", "1",
                   "--json", str(out), "--markdown", str(md), "--no-progress"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["meta"]["mode"] == "dynamic" and res["meta"]["lengths"] == [8, 11, 16]
    rows = {r["compiler"]: r for r in res["rows"]}
    assert set(rows) == {"coil", "coil-static"}
    for r in rows.values():
        assert r["status"] == "pass", r
        assert sorted(int(L) for L in r["ms"]) == [8, 11, 16] and r["compile_s"] > 0
    # automatic dynamic: static 8, then one symbolic graph for 11 and 16; static: one each
    assert rows["coil"]["graphs"] == 2 and rows["coil-static"]["graphs"] == 3
    per = res["ratios"]["gpt2"]["per_length"]
    assert sorted(int(L) for L in per) == [8, 11, 16]
    assert per["11"] == rows["coil"]["ms"]["11"] / rows["coil-static"]["ms"]["11"]
    assert res["ratios"]["gpt2"]["geomean"] > 0
    text = capsys.readouterr().out
    assert "coil / coil static" in text and "L=16 ms" in text
    assert "| gpt2 | coil static | pass | 3 |" in md.read_text()


def test_budget_skips_the_remaining_lengths_and_errors_stay_in_their_row(monkeypatch):
    def broken(model):
        raise RuntimeError("boom")

    slow_calls = []

    def slow(model):
        def call(**kw):
            slow_calls.append(kw["input_ids"].shape[1])
            return model(**kw)
        return call

    monkeypatch.setattr(dyn, "COMPILERS", {"broken": broken, "slow": slow})
    res = dyn.run(["gpt2"], device="cpu", compilers=["broken", "slow"], lengths=[8, 11, 16],
                  warmup=0, repeat=1, budget_s=0.0, progress=False)
    rows = {r["compiler"]: r for r in res["rows"]}
    assert rows["broken"]["status"] == "error" and "boom" in rows["broken"]["error"]
    assert rows["slow"]["status"] == "pass" and rows["slow"]["ms"] == {}
    assert rows["slow"]["note"] == "budget: skipped L=8,11,16" and slow_calls == []
    assert res["ratios"] == {}


def test_a_wrong_result_is_a_mismatch(monkeypatch):
    monkeypatch.setattr(dyn, "COMPILERS", {"wrong": lambda m: lambda **kw: type(
        "Out", (), {"logits": m(**kw).logits * 3.0})()})
    res = dyn.run(["gpt2"], device="cpu", compilers=["wrong"], lengths=[8], warmup=0,
                  repeat=1, progress=False)
    row = res["rows"][0]
    assert row["status"] == "mismatch" and "L=8: output 0: rmse" in row["note"]
    assert row["ms"][8] > 0


def test_unknown_names_and_mixed_modes_are_refused(capsys):
    assert cli.main(["bench", "--mode", "dynamic", "--model", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err
    assert cli.main(["bench", "--mode", "dynamic", "fp32"]) == 2
