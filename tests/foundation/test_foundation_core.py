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


def test_one_patch_entered_again_inside_itself_restores():
    """A compiled function with options enters one patch object per call; a recursive call enters it inside itself."""
    before = config.config.fusion
    p = config.patch(fusion=not before)
    with p:
        config.config.fusion = before  # changed inside: the inner entry saves and restores this value
        with p:
            assert config.config.fusion is (not before)
        assert config.config.fusion is before
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


# ----------------------------------------------------------------------- errors

def test_error_hierarchy():
    from coil import exc

    for cls in (exc.Unsupported, exc.UserError, exc.BackendCompilerFailed, exc.InternalError,
                exc.GraphBreakInFullgraph):
        assert issubclass(cls, exc.CoilError)
    assert issubclass(exc.GraphBreakInFullgraph, exc.UserError)


def test_user_error_carries_source_location_and_advice():
    from coil.exc import SourceLocation, UserError

    loc = SourceLocation.of(__file__, test_user_error_carries_source_location_and_advice
                            .__code__.co_firstlineno)
    assert loc.text.startswith("def test_user_error_carries_source_location")
    err = UserError("data-dependent branch on a tensor", location=loc,
                    hint="use torch.where")
    msg = str(err)
    assert f"{__file__}:{loc.lineno}" in msg and loc.text in msg
    assert "what to do: use torch.where" in msg and err.location is loc


def test_unsupported_message_has_reason_location_and_hint():
    from coil.exc import SourceLocation, Unsupported

    e = Unsupported("call to print", hint="remove it", location=SourceLocation("m.py", 3, "print(x)"))
    assert e.reason == "call to print"
    assert str(e) == "call to print\n  at m.py:3\n    print(x)\n  hint: remove it"


def test_backend_compiler_failed_names_backend_and_keeps_original():
    from coil.exc import BackendCompilerFailed

    inner = KeyError("aten.foo")
    e = BackendCompilerFailed("coil", inner)
    assert e.backend_name == "coil" and e.inner is inner
    assert "'coil'" in str(e) and "KeyError" in str(e) and "aot_eager" in str(e)


# ---------------------------------------------------------- config from environment

def test_config_reads_coil_environment_variables(monkeypatch):
    monkeypatch.setenv("COIL_FUSION", "0")
    monkeypatch.setenv("COIL_RECOMPILE_LIMIT", "3")
    monkeypatch.setenv("COIL_CPU_BACKEND", "triton")
    cfg = config._from_env()
    assert (cfg.fusion, cfg.recompile_limit, cfg.cpu_backend) == (False, 3, "triton")


def test_option_assigned_on_the_config_module_takes_effect():
    # coil.config.fallback_random = True set a module attribute nothing read (the options live on
    # coil.config.config): silently ignored
    import coil
    old = config.config.fallback_random
    try:
        coil.config.fallback_random = not old
        assert config.config.fallback_random is (not old) and coil.config.fallback_random is (not old)
    finally:
        config.config.fallback_random = old
    with pytest.raises(AttributeError, match="no option 'fallback_randm'.*valid options"):
        coil.config.fallback_randm = True


# ------------------------------------------------------------ package, README, CI

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme_commands():
    import re

    text = open(os.path.join(ROOT, "README.md")).read()
    return re.findall(r"```bash\n(pip install [^\n]*)\n```", text)


def test_readme_has_the_two_setup_commands_and_ci_runs_the_test_one():
    demo, tests = _readme_commands()[:2]
    assert demo.endswith("coil demo") and "pytest" in tests and '-m "not slow"' in tests
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert tests in ci
    assert "5" in ci and os.access(os.path.join(ROOT, ".ci", "run"), os.X_OK)


def test_package_metadata():
    import importlib.metadata as md

    meta = md.metadata("torch-coil")
    assert meta["Name"] == "torch-coil"
    reqs = " ".join(md.requires("torch-coil") or [])
    for dep in ("torch>=2.11", "sympy", "numpy"):
        assert dep in reqs
    assert "extra == \"test\"" in reqs and "extra == \"triton\"" in reqs
    for sub in ("capture", "aot", "ir", "schedule", "codegen", "runtime", "trace", "bench",
                "backends"):
        assert os.path.isdir(os.path.join(ROOT, "coil", sub)), sub


def test_pytest_markers_are_registered(pytestconfig):
    markers = " ".join(pytestconfig.getini("markers"))
    assert "slow:" in markers and "gpu:" in markers


@pytest.mark.parametrize("pytest_rc,ci_rc", [(0, 0), (5, 0), (1, 1), (2, 2)])
def test_ci_script_maps_pytest_exit_codes(tmp_path, pytest_rc, ci_rc):
    """.ci/run with stand-in `pip` and `python`: no tests collected (5) is success."""
    import subprocess

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "pip").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "python").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\nexit {pytest_rc}\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    r = subprocess.run(["bash", os.path.join(ROOT, ".ci", "run")], env=env, timeout=60)
    assert r.returncode == ci_rc
    assert (tmp_path / "args").read_text().startswith("-m pytest -m not slow -n 2")
