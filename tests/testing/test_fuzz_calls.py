"""The call-sequence fuzzer (tools/fuzz_calls.py, docs/fuzzing.md): a few sequences through coil, and a planted
compiler whose cache ignores sizes is caught."""
import importlib.util
import os

import torch

from coil.bench.fuzz import Stmt

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


def test_one_tensor_for_the_target_and_source_of_an_in_place_op_is_not_drawn():
    """s401 #364, #517: the ``alias`` variant passed ``b`` for ``c`` in ``c.view(1, -1).index_add_(1, i,
    b.expand(1, 2))``: the op reads an element it has written (eager -12, the functional -9), which the generator
    never draws for one input. Such a call is not drawn; an elementwise op of a tensor with itself still is."""
    def index_add(b, c):
        c.view(1, -1).index_add_(1, torch.tensor([0, 0]), b.expand(1, 2))

    def mul(b, c):
        c.mul_(b)

    for f, found in ((index_add, True), (mul, False)):
        t, mode = torch.tensor(-3.0), fc._SelfReads()
        mode.wrap(f)(t, t)
        assert mode.found == found
    for i in (364, 517):
        prog, calls = fc.sequence(401, i, backend="dynamic")
        assert "alias" not in [c.kind for c in calls] and fc._signature(fc.run_calls(prog.function(), calls,
                                                                                      "dynamic")) == "ok"


def test_lifted_numbers_become_arguments():
    """Call-sequence seed 408 drew no ``scalars`` call in 673 sequences: ``lift_scalars`` passed its numbers as the
    program's ``grad_key`` (a field added before ``params``), so the lifted ``fn`` had no ``p0`` argument, failed its
    check against the original and was dropped. s408 #5 (``v4 = v0 // 2.5``) lifts the 2.5; #4 (``v0 = 1 / d``)
    draws ``scalars`` calls."""
    prog = fc.lift_scalars(fc.generate(408, 5), __import__("random").Random(0))
    assert prog.params == {"p0": 2.5} and "def fn(a, p0):" in prog.fn_source()
    lifted, calls = fc.sequence(408, 4, backend="auto")
    assert lifted.params == {"p0": 1} and "scalars" in [c.kind for c in calls]
