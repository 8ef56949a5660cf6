"""``coil bench --mode reduce-overhead`` on CPU (coil/bench/reduce_overhead.py): tiny
workloads, rows per compiler, the no-CUDA note, failures confined to their row."""
import importlib.util
import json

import pytest
import torch

from coil import cli
from coil.bench import reduce_overhead as ro


def test_cli_runs_workloads_side_by_side_on_cpu(tmp_path, capsys):
    out = tmp_path / "ro.json"
    rc = cli.main(["bench", "--mode", "reduce-overhead", "--model", "gpt2_decode", "train_gpt",
                   "mobilenet", "--compiler", "coil", "--repeat", "3", "--json", str(out),
                   "--no-progress"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["meta"]["mode"] == "reduce-overhead" and "no CUDA device" in res["meta"]["note"]
    rows = {(r["workload"], r["compiler"]): r for r in res["rows"]}
    assert set(rows) == {(w, c) for w in ("gpt2_decode", "train_gpt", "mobilenet")
                         for c in ("eager", "coil")}
    for w in ("gpt2_decode", "train_gpt"):
        eager, coil_row = rows[w, "eager"], rows[w, "coil"]
        assert eager["status"] == coil_row["status"] == "pass", (eager, coil_row)
        assert coil_row["compile_s"] > 0 and eager["compile_s"] is None
        assert coil_row["speedup"] == pytest.approx(eager["ms"] / coil_row["ms"])
        assert coil_row["peak_gb"] is None and coil_row["vs_torch"] is None  # CPU; no torch row
    assert "tokens equal to eager's" in rows["gpt2_decode", "coil"]["note"]
    if importlib.util.find_spec("timm") is None and importlib.util.find_spec("torchvision") is None:
        assert rows["mobilenet", "coil"]["status"] == "skipped"
        assert "timm or torchvision" in rows["mobilenet", "coil"]["note"]
    text = capsys.readouterr().out
    assert "coil/torch" in text and "note: no CUDA device" in text


def test_a_raising_compiler_is_its_own_error_row(monkeypatch):
    def broken(module, dynamic):
        raise RuntimeError("boom")

    def wrong(module, dynamic):
        return lambda ids: module(ids) + 1.0

    monkeypatch.setattr(ro, "COMPILERS", {"broken": broken, "wrong": wrong, "same": lambda m, d: m})
    res = ro.run(["train_gpt"], device="cpu", compilers=["broken", "wrong", "same"], repeat=3,
                 progress=False)
    rows = {r["compiler"]: r for r in res["rows"]}
    assert rows["broken"]["status"] == "error" and "boom" in rows["broken"]["error"]
    assert rows["broken"]["ms"] is None and rows["broken"]["speedup"] is None
    assert rows["wrong"]["status"] == "mismatch" and "rmse" in rows["wrong"]["note"]
    assert rows["same"]["status"] == "pass" and rows["same"]["ms"] > 0


def test_check_counts_tokens_and_rejects_far_values():
    e = [torch.ones(4, dtype=torch.bfloat16), torch.tensor([1, 2, 3])]
    ok, note = ro._check(e, [e[0] * 1.01, torch.tensor([1, 2, 4])], torch.bfloat16)
    assert ok and note == "2/3 tokens equal to eager's"
    ok, note = ro._check(e, [e[0] * 1.5, e[1]], torch.bfloat16)
    assert not ok and note.startswith("output 0: rmse")


def test_unknown_names_are_refused(capsys):
    assert cli.main(["bench", "--mode", "reduce-overhead", "--model", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err
    assert cli.main(["bench", "--mode", "reduce-overhead", "fp32"]) == 2


def test_token_diagnosis_tells_a_near_tie_from_wrong_values():
    eager = torch.tensor([[0.0, 5.0, 1.0], [2.0, 2.01, 0.0], [0.0, 0.0, 9.0]])
    assert ro._token_diagnosis(eager, eager.clone()) == ""
    tie = eager + torch.tensor([[0.0, 0.01, 0.0], [0.0, -0.02, 0.0], [0.0, 0.0, 0.0]])
    note = ro._token_diagnosis(eager, tie)
    assert note.startswith("token 1 differs") and note.endswith("a near-tie"), note
    wrong = eager.clone()
    wrong[2] = torch.tensor([9.0, 0.0, 0.0])
    note = ro._token_diagnosis(eager, wrong)
    assert note.startswith("token 2 differs") and note.endswith("values differ"), note


def test_decode_marks_a_step_per_token_and_checks_replayed_calls(monkeypatch):
    """Every generated token starts a step of its compiler; a compiler right on the
    first call and wrong on later ones (as a bad replay would be) is a mismatch."""
    marks = []

    def late_wrong(module, dynamic):
        calls = [0]

        def fn(ids, pos):
            calls[0] += 1
            nxt, logits = module(ids, pos)
            if calls[0] > 8:  # past the first step (1 prefill + 3 decode calls)
                logits = -logits
                nxt = logits.argmax(-1, keepdim=True)
            return nxt, logits
        return fn

    monkeypatch.setattr(ro, "COMPILERS", {"late": late_wrong})
    monkeypatch.setattr(ro, "MARK_STEP", {"late": lambda: marks.append(1)})
    res = ro.run(["gpt2_decode"], device="cpu", compilers=["late"], repeat=3, progress=False)
    rows = {r["compiler"]: r for r in res["rows"]}
    assert rows["late"]["status"] == "mismatch", rows["late"]
    assert "after warm-up" in rows["late"]["note"] and "first call: 4/4 tokens" in rows["late"]["note"]
    # 4 tokens per step (the prefill and 3 one-token calls), each marked
    steps = 1 + 3 + ro.STEADY_STEPS + 3
    assert len(marks) == 4 * steps, len(marks)


def test_isolated_peaks_keep_the_shared_process_value_and_say_why_a_child_failed(monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        ok = cmd[-3] == "coil"
        return type("P", (), {"returncode": 0 if ok else 1, "stderr": "" if ok else "boom",
                              "stdout": 'log\n{"peak_gb": 0.5, "first_peak_gb": 0.75}\n' if ok else ""})()

    monkeypatch.setattr(ro.subprocess, "run", fake_run)
    rows = [{"workload": "gpt2_b1", "compiler": c, "peak_gb": 1.0, "first_peak_gb": 2.0}
            for c in ("inductor", "coil")] + [{"workload": "gpt2_b1", "compiler": "eager", "peak_gb": None}]
    ro.isolated_peaks(rows, "full", 3, jobs=2)
    assert len(calls) == 2 and all(c[1:4] == ["-m", "coil.bench.reduce_overhead", "--peak"] for c in calls)
    tc, co, eager = rows
    assert (co["peak_gb"], co["first_peak_gb"], co["inproc_peak_gb"]) == (0.5, 0.75, 1.0)
    assert tc["peak_gb"] is None and tc["inproc_peak_gb"] == 1.0 and "boom" in tc["peak_error"]
    assert "inproc_peak_gb" not in eager
