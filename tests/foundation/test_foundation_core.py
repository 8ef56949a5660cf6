"""Foundation: config registry, backend registry, compile log."""
import json
import os

import pytest

import coil
from coil import config, trace


def test_unknown_option_lists_valid_ones():
    with pytest.raises(ValueError, match="cpu_backend"):
        config.check_option_names({"nonsense": 1})


def test_patch_restores():
    before = config.config.fusion
    with config.patch(fusion=not before):
        assert config.config.fusion is (not before)
    assert config.config.fusion is before


def test_unknown_backend_lists_valid_ones():
    with pytest.raises(ValueError, match="eager"):
        coil.backends.lookup_backend("nope")


def test_list_backends_has_the_four():
    assert {"eager", "aot_eager", "coil", "inductor"} <= set(coil.list_backends())


def test_unknown_mode_and_option_raise():
    with pytest.raises(ValueError, match="reduce-overhead"):
        coil.compile(lambda x: x, mode="fast please")
    with pytest.raises(ValueError, match="valid options"):
        coil.compile(lambda x: x, options={"bogus": True})


def test_trace_writes_jsonl(tmp_path):
    trace.set_dir(str(tmp_path))
    try:
        with trace.compile_context(3, 1):
            with trace.stage("capture"):
                trace.log("hello", answer=42)
                trace.artifact("graph", lambda: "def f(): pass", kind="python")
    finally:
        trace.set_dir(None)
    (path,) = list(tmp_path.iterdir())
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["event"] for r in records] == ["hello", "artifact", "stage"]
    assert all(r["compile_id"] == "3/1" for r in records)
    assert records[0]["stage"] == "capture" and records[0]["answer"] == 42
    assert records[1]["text"] == "def f(): pass"
    assert records[2]["duration_ms"] >= 0


def test_trace_off_is_silent(tmp_path):
    assert not trace.enabled() or os.environ.get("COIL_TRACE")
    calls = []
    trace.artifact("x", lambda: calls.append(1) or "text")
    if not trace.enabled():
        assert calls == []
