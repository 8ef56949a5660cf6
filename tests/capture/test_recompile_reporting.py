"""What a user is told about shapes and recompiles: ``dynamic=True`` compiles once for
every size (no warning); hitting the recompile limit warns with function, file:line, limit and
the last failed guard; ``recompile`` trace events carry a structured list of failed
guards; a graph break's user stack starts in user code (not coil's module wrapper)."""
import json
import os
import warnings

import pytest
import torch

import coil
from coil import trace


def _double(x):
    return x * 2


def _records(log_dir) -> list:
    """Every event of the compile logs in ``log_dir``."""
    records = []
    for name in os.listdir(log_dir):
        with open(log_dir / name) as fh:
            records += [json.loads(line) for line in fh]
    return records


def test_dynamic_true_compiles_once_without_warning():
    from coil.testing import CompileCounter

    cnt = CompileCounter()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f = coil.compile(_double, backend=cnt, dynamic=True)
        for n in (2, 3, 7):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), x * 2)
    assert not [i for i in w if "dynamic" in str(i.message)]
    assert cnt.frame_count == 1


def test_recompile_limit_warns_with_guard():
    f = coil.compile(_double, backend="eager", dynamic=False)
    limit = coil.config.config.recompile_limit
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(1, limit + 3):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), x * 2)
    msgs = [str(i.message) for i in w if "recompile limit" in str(i.message)]
    assert len(msgs) == 1
    m = msgs[0]
    assert "_double" in m and __file__ in m and str(limit) in m and "x.shape" in m


def test_recompile_event_has_structured_guards(tmp_path):
    trace.set_dir(str(tmp_path))
    try:
        f = coil.compile(_double, backend="eager")
        f(torch.randn(2))
        f(torch.randn(3))
    finally:
        trace.set_dir(None)
    records = _records(tmp_path)
    rec = [r for r in records if r.get("event") == "recompile"]
    assert rec, [r.get("event") for r in records]
    fails = rec[-1]["failed_guards"]
    assert fails[0]["guard"] == "x.shape == (2,)"
    assert fails[0]["expected"] == "(2,)" and fails[0]["got"] == "(3,)"


class _Printer(torch.nn.Module):
    def forward(self, x):
        print("coil-stack", end="\r")
        return x * 2


def test_break_stack_starts_in_user_code():
    e = coil.explain(_Printer(), torch.randn(3))
    stack = e.break_reasons[0]["user_stack"]
    assert "coil/capture" not in stack[0] and __file__ in stack[0], stack


class _SinPlusOne(torch.nn.Module):
    def forward(self, x):
        return x.sin() + 1


def test_module_frame_source_artifact_is_its_forward(tmp_path):
    """A compiled module's frame is coil's generated ``self(*args)`` call; the compile
    log's ``capture_source`` artifact shows the module's own forward instead."""
    trace.set_dir(str(tmp_path))
    try:
        m = coil.compile(_SinPlusOne(), backend="eager")
        m(torch.randn(3))
    finally:
        trace.set_dir(None)
    records = _records(tmp_path)
    src = [r["text"] for r in records if r.get("name") == "capture_source"]
    assert src and "return x.sin() + 1" in src[0] and "_SinPlusOne.forward" in src[0], src


def test_recompile_limit_from_compile_options():
    """``options={"recompile_limit": n}`` applies to that compile's frames: capture read
    only the global coil.config, so the option was silently ignored (eager after 8)."""
    f = coil.compile(lambda x: x * 2, dynamic=False, options={"recompile_limit": 12})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the limit's warning would raise here
        for n in range(2, 13):
            torch.testing.assert_close(f(torch.ones(n)), torch.ones(n) * 2)
    g = coil.compile(lambda x: x * 3, dynamic=False, options={"recompile_limit": 2})
    g(torch.ones(2)), g(torch.ones(3))
    with pytest.warns(UserWarning, match=r"recompile limit \(2\)"):
        g(torch.ones(4))


@pytest.mark.parametrize("first_same", [False, True])
def test_recompile_for_aliased_inputs_says_which_inputs(tmp_path, first_same):
    """``f(a, b)`` then ``f(a, a)``: the C++ batch check of the tensor arguments refuses one tensor passed twice, which no
    per-tensor guard says, so the recompile's reason was None (in the log, the report and the recompile-limit
    warning). The other order failed the identity guard ``y is x``, named without what it meant."""
    def f(x, y):
        return x + y * 2

    a, b = torch.randn(3), torch.randn(3)
    calls = [(a, a), (a, b)] if first_same else [(a, b), (a, a)]
    trace.set_dir(str(tmp_path))
    try:
        c = coil.compile(f)
        for args in calls + calls:
            torch.testing.assert_close(c(*args), f(*args))
    finally:
        trace.set_dir(None)
    rec = [r for r in _records(tmp_path) if r.get("event") == "recompile"]
    assert len(rec) == 1, rec   # the third and fourth calls reuse the two entries
    want = ("x and y were one object when compiled; they are distinct on this call" if first_same else
            "x and y are the same tensor on this call (they were distinct when compiled)")
    assert want in rec[0]["reason"], rec[0]
    assert rec[0]["failed_guards"] and rec[0]["failed_guards"][0]["text"] == rec[0]["reason"]


def _shared_wrapper(f):
    """A decorator whose wrapper's code object every decorated forward shares (transformers' deprecate_kwarg)."""
    def wrapped_func(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapped_func


def test_recompile_limit_counts_entries_per_module_class():
    """Ten module classes whose forwards share one decorator's wrapper and break the graph: coil compiled one entry
    per class for the wrapper's code (guard ``type(args[0])``) and for the caller's loop resume frame (``type(b)``),
    reached the limit (8) on both, and ran the rest eagerly. The limit counts entries per class of the call's modules;
    a recompile for one class (a new input shape) still counts against that class's limit."""
    def forward(self, x):
        x = x * self.k
        print("", end="")  # a graph break
        return x + 1
    classes = [type(f"Block{i}", (torch.nn.Module,), {"forward": _shared_wrapper(forward), "k": i + 1})
               for i in range(10)]

    class Top(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(c() for c in classes)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    m, x = Top(), torch.randn(4)
    f = coil.compile(m, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a recompile-limit warning raises
        for _ in range(2):
            torch.testing.assert_close(f(x), m(x))
    g = coil.compile(classes[0](), dynamic=False, options={"recompile_limit": 2})
    g(torch.ones(2)), g(torch.ones(3))
    with pytest.warns(UserWarning, match=r"recompile limit \(2\)"):
        g(torch.ones(4))
