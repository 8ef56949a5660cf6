"""coil bench --paired: every compiler of a model and mode timed in the same rounds,
against one shared eager series; failures stay in their rows."""
import json

import pytest

import fake_compilers
from coil.bench import suite
from coil.cli import main


def _bench(compilers, modes=("fp32",), **kw):
    kw.setdefault("repeat", 3)
    kw.setdefault("warmup", 1)
    opts = suite.BenchOptions(models=["mlp"], modes=list(modes), compilers=list(compilers),
                              device="cpu", progress=False, fresh_caches=False,
                              paired=True, **kw)
    result = suite.run_bench(opts)
    return {r["compiler"] + "/" + r["mode"]: r for r in result["rows"]}, result


def test_paired_rows_share_one_eager_series():
    rows, result = _bench(["eager", "fake_compilers:IDENTITY", "fake_compilers:SLOW",
                           "fake_compilers:WRONG"], modes=("fp32", "train"))
    assert result["meta"]["paired"] is True
    for mode in ("fp32", "train"):
        sel = [r for r in rows.values() if r["mode"] == mode]
        assert len(sel) == 4 and all(r["paired"] for r in sel)
        assert len({r["eager_ms"] for r in sel}) == 1 and sel[0]["eager_ms"] > 0
        for r in sel:
            assert r["speedup"] == pytest.approx(r["eager_ms"] / r["compiled_ms"])
    slow = rows["slow/fp32"]
    # (its step sleeps 20 ms; how it compares with eager's depends on the machine's load)
    assert slow["status"] == "pass" and slow["compiled_ms"] >= 20.0
    assert slow["cold_compile_s"] >= 0.02 and slow["warm_compile_s"] >= 0.02
    wrong = rows["wrong/fp32"]
    assert wrong["status"] == "mismatch" and wrong["speedup"] is not None  # timed, as unpaired
    assert rows["eager/fp32"]["status"] == "pass" and rows["eager/fp32"]["cold_compile_s"] is None


def test_paired_steps_alternate_within_rounds_unpaired_do_not():
    names = ["fake_compilers:RECORD_A", "fake_compilers:RECORD_B"]
    fake_compilers.CALLS.clear()
    _bench(names, warmup=1, repeat=3)
    # first calls a, b; 1 warm-up round (eager, a, b); 3 timed rounds rotated by one each:
    # (eager, a, b), (a, b, eager), (b, eager, a); warm compiles a, b
    assert fake_compilers.CALLS == ["a", "b"] * 2 + ["a", "b", "a", "b", "b", "a"] + ["a", "b"]
    fake_compilers.CALLS.clear()
    opts = suite.BenchOptions(models=["mlp"], modes=["fp32"], compilers=names, device="cpu",
                              repeat=3, warmup=1, progress=False, fresh_caches=False)
    rows = suite.run_bench(opts)["rows"]
    assert fake_compilers.CALLS == ["a"] * 6 + ["b"] * 6
    assert not any(r["paired"] for r in rows)


def test_paired_failures_do_not_stop_the_others():
    rows, _ = _bench(["fake_compilers:RAISES", "eager", "fake_compilers:FAILS_LATER",
                      "fake_compilers:SLOW"])
    raises = rows["raises/fp32"]
    assert raises["status"] == "error" and "not built yet" in raises["error"]
    later = rows["fails_later/fp32"]  # passed its first call, raised in the warm-up
    assert later["status"] == "error" and "fails on call 2" in later["error"]
    assert later["cold_compile_s"] is not None and later["traceback"]
    for r in (raises, later):
        assert r["speedup"] is None and r["eager_ms"] is None and r["warm_compile_s"] is None
    eager, slow = rows["eager/fp32"], rows["slow/fp32"]
    assert eager["status"] == slow["status"] == "pass"
    assert eager["eager_ms"] == slow["eager_ms"] and slow["speedup"] < 1


def test_paired_timeouts_stay_in_their_rows_and_budget():
    rows, _ = _bench(["fake_compilers:HANGS", "eager", "fake_compilers:HANGS_LATER",
                      "fake_compilers:SLOW"], row_timeout=1.0)
    hangs = rows["hangs/fp32"]  # compile past row_timeout
    assert hangs["status"] == "timeout" and "timed out after 1 s" in hangs["error"]
    later = rows["hangs_later/fp32"]  # hung in the shared rounds (limit 3 rows x 1 s)
    assert later["status"] == "timeout" and "timed out after 3 s" in later["error"]
    assert later["speedup"] is None
    eager, slow = rows["eager/fp32"], rows["slow/fp32"]  # timed again without it
    assert eager["status"] == slow["status"] == "pass"
    assert eager["eager_ms"] == slow["eager_ms"] and slow["speedup"] < 1
    rows, _ = _bench(["eager"], budget_s=1e-9)
    assert rows["eager/fp32"]["status"] == "skipped" and rows["eager/fp32"]["paired"]


def test_paired_output_says_so(tmp_path, capsys):
    j, m = tmp_path / "r.json", tmp_path / "r.md"
    rc = main(["bench", "--paired", "--model", "mlp", "--mode", "fp32", "--compiler", "eager",
               "fake_compilers:SLOW", "--repeat", "2", "--warmup", "1", "--no-progress",
               "--keep-caches", "--no-warm-compile", "--json", str(j), "--markdown", str(m)])
    assert rc == 0
    data = json.loads(j.read_text())
    assert data["meta"]["paired"] is True and all(r["paired"] for r in data["rows"])
    assert "**timing: paired (--paired)" in m.read_text()
    assert capsys.readouterr().out.startswith("timing: paired (--paired)")
    unpaired = {"meta": {}, "rows": [dict(r, paired=False) for r in data["rows"]]}
    assert "paired" not in suite.format_text(unpaired)
    assert "paired" not in suite.format_markdown(unpaired)


def test_isolated_paired_pairs_within_each_model_subprocess(tmp_path):
    j = tmp_path / "r.json"
    rc = main(["bench", "--isolate", "--paired", "--model", "mlp", "--mode", "fp32",
               "--compiler", "eager", "fake_compilers:SLOW", "--repeat", "2", "--warmup", "0",
               "--no-progress", "--keep-caches", "--no-warm-compile", "--quiet",
               "--json", str(j)])
    assert rc == 0
    data = json.loads(j.read_text())
    rows = {r["compiler"]: r for r in data["rows"]}
    assert data["meta"]["paired"] is True
    assert rows["eager"]["status"] == rows["slow"]["status"] == "pass"
    assert rows["eager"]["paired"] and rows["slow"]["paired"]
    assert rows["eager"]["eager_ms"] == rows["slow"]["eager_ms"]
