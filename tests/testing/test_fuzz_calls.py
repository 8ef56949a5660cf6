"""The call-sequence fuzzer (tools/fuzz_calls.py, docs/fuzzing.md): a few sequences through coil, and a planted
compiler whose cache ignores sizes is caught."""
import importlib.util
import os

import torch

from coil.testing.fuzz import Stmt

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "tools", "fuzz_calls.py")
_spec = importlib.util.spec_from_file_location("fuzz_calls", _PATH)
fc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fc)


def test_sequences_are_deterministic_and_varied():
    kinds = set()
    for i in range(30):
        prog, calls = fc.sequence(5, i, backend="mark")
        again, calls2 = fc.sequence(5, i, backend="mark")
        assert prog.fn_source() == again.fn_source() and [c.kind for c in calls] == [c.kind for c in calls2]
        assert 3 <= len(calls) <= 6 and calls[0].kind == "first"
        kinds |= {c.kind for c in calls}
        for c in calls:
            c.args()
    assert kinds >= {"values", "resize", "back", "layout", "dtype"}


def test_a_few_sequences_through_coil():
    for i, backend in ((0, "auto"), (1, "dynamic"), (2, "mark")):
        prog, calls = fc.sequence(16, i, backend=backend)
        results = fc.run_calls(prog.function(), calls, backend)
        assert fc._signature(results) == "ok", [(r.outcome, r.kind, r.detail) for r in results]


def test_a_stale_cache_is_caught_and_written_as_a_repro(tmp_path):
    def stale(fn):  # a "compiler" that keys its cache on the number of arguments only
        cache = {}
        return lambda *args: cache.setdefault(len(args), fn(*args))

    def fn(a):
        return a * 2

    calls = [fc.Call("first", [fc.Input("a", torch.ones(3))], {}),
             fc.Call("resize", [fc.Input("a", torch.ones(4))], {})]
    results = fc.run_calls(fn, calls, stale)
    assert [r.outcome for r in results] == ["ok", "mismatch"] and results[1].kind == "out-shape"
    prog = fc.CallProgram([fc.Input("a", torch.ones(3))], [Stmt("v0 = a * 2", "pointwise")], ["v0"], "planted")
    src = fc.repro_source(prog, calls, "auto", results)
    assert "def call_1():  # resize" in src and "a = torch.tensor([1.0, 1.0, 1.0, 1.0]" in src
    compile(src, "repro", "exec")
