"""The fast guard (coil/capture/guard_versions.py: checks implied by unchanged dict version
tags are skipped) decides what the full guard decides. Each test compiles a module tree,
calls it until the fast guard passes on its own, changes one thing a user might change
between calls, and compares the compiled result with eager's (so a stale skipped check
would show as a wrong value) and the fast guard's verdict with the full guard's."""
import pytest
import torch
import torch.nn as nn

import coil
from coil.capture import guard_versions
from coil.capture.frame import _caches

pytestmark = pytest.mark.skipif(guard_versions._load_helper() is None,
                                reason=f"no dict version tags here: {guard_versions._helper[1:]}")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.act = nn.ReLU()
        self.scale = 2
        self.shape = (4, 8)

    def forward(self, x):
        return self.act(self.bn(self.fc(x))).reshape(self.shape) * self.scale + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block(), Block())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.blocks(x))


class Doubled(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def _mutations():
    def hook(m):
        m.blocks[1].act.register_forward_hook(lambda mod, i, o: o + 1)

    def new_forward(m):
        m.blocks[2].forward = lambda x: x * 3

    def swap_class(m):
        m.head.__class__ = Doubled

    def new_param(m):
        m.blocks[0].fc.weight = nn.Parameter(torch.randn(8, 8))

    def new_bias_value(m):
        with torch.no_grad():
            m.head.bias += 1

    def new_module(m):
        m.blocks[1].fc = nn.Linear(8, 8)

    return {
        "hook": hook,
        "train": lambda m: m.blocks[2].bn.train(),
        "int_attr": lambda m: setattr(m.blocks[0], "scale", 3),
        "tuple_attr": lambda m: setattr(m.blocks[1], "shape", (-1, 8)),
        "eps": lambda m: setattr(m.blocks[2].bn, "eps", 0.5),
        "new_forward": new_forward,
        "swap_class": swap_class,
        "new_param": new_param,
        "new_bias_value": new_bias_value,
        "new_module": new_module,
        "delete_child": lambda m: delattr(m.blocks, "2"),
        "frozen": lambda m: m.head.weight.requires_grad_(False),
    }


def _entries():
    return [e for c in _caches.values() for e in c.entries]


@pytest.mark.parametrize("change", sorted(_mutations()))
def test_fast_guard_follows_each_change(change):
    coil.reset()
    torch.manual_seed(0)
    m = Net().eval()
    cm = coil.compile(m)
    x = torch.randn(4, 8)
    for _ in range(3):
        torch.testing.assert_close(cm(x), m(x))
    (entry,) = _entries()
    state = entry.guard.__globals__["___vstate"]
    full = entry.guard.__globals__["___guard_full"]
    assert state.cur.ok() and state.stale == 0       # the last call passed without the full guard
    _mutations()[change](m)
    bound = (m, (x,), {})
    fn = cm._compiled_call._coil_fn
    assert bool(entry.guard(*bound, fn)) == bool(full(*bound, fn))
    for _ in range(3):
        torch.testing.assert_close(cm(x), m(x))


def test_attribute_written_on_each_call_stops_the_fast_guard():
    class Counting(Net):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return super().forward(x)

    coil.reset()
    m = Counting().eval()
    cm = coil.compile(m)        # `calls` becomes a dynamic int after one recompile
    x = torch.randn(4, 8)
    n = guard_versions._STALE_LIMIT + 4
    with torch.no_grad():
        for _ in range(n):
            torch.testing.assert_close(cm(x), Net.forward(m, x))
    assert m.calls == n
    last = _entries()[-1].guard.__globals__["___vstate"]     # the entry that served the later calls
    assert last.stale >= guard_versions._STALE_LIMIT


def test_list_attribute_is_not_watched_and_still_checked():
    class Sizes(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.mults = [1.0, 2.0]

        def forward(self, x):
            for k in self.mults:
                x = self.fc(x) * k
            return x

    coil.reset()
    m = Sizes()
    cm = coil.compile(m)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cm(x), m(x))
        m.mults.append(3.0)       # the list changes in place: no dict's tag moves
        for _ in range(2):
            torch.testing.assert_close(cm(x), m(x))
        m.mults[0] = -1.0
        torch.testing.assert_close(cm(x), m(x))


def test_library_function_patched_between_calls(monkeypatch):
    coil.reset()
    m = Net().eval()
    cm = coil.compile(m)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cm(x), m(x))
        monkeypatch.setattr(torch.nn.functional, "relu", lambda t, inplace=False: t.sigmoid())
        for _ in range(2):
            torch.testing.assert_close(cm(x), m(x))


def test_off_by_config_gives_the_full_guard():
    coil.reset()
    with coil.config.patch(guard_versions=False):
        m = Net().eval()
        cm = coil.compile(m)
        x = torch.randn(4, 8)
        with torch.no_grad():
            cm(x)
    (entry,) = _entries()
    assert "___vstate" not in entry.guard.__globals__


class _Registry(dict):        # overrides a write only (like transformers' output registry)
    def __setitem__(self, k, v):
        super().__setitem__(str(k), v)


class _Computed(dict):        # its reads are not its contents
    def __getitem__(self, k):
        return super().__getitem__(k) * 2


@pytest.mark.parametrize("kind", [_Registry, _Computed])
def test_dict_subclass_read_by_the_guard(kind):
    """Values follow a change of the dict; one that only overrides writes keeps the fast
    guard (its reads are dict's own; capture treats one overriding reads as an object)."""
    class Scaled(Net):
        def __init__(self):
            super().__init__()
            self.table = kind()
            self.table["s"] = 2.0

        def forward(self, x):
            return super().forward(x) * self.table["s"]

    coil.reset()
    m = Scaled().eval()
    cm = coil.compile(m, dynamic=False)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cm(x), m(x))
        m.table["s"] = 3.0
        for _ in range(2):
            torch.testing.assert_close(cm(x), m(x))
    if kind is _Registry:
        assert guard_versions._plain_reads(m.table) and not guard_versions._plain_reads(_Computed())
        states = [e.guard.__globals__.get("___vstate") for e in _entries()]
        assert any(s is not None and s.stale < guard_versions._STALE_LIMIT for s in states)


def test_module_tree_reached_through_modules_is_left_out_of_the_fast_guard():
    """``self._modules['blocks']`` reads are rewritten as ``self.__dict__['_modules']`` so the submodule walk is
    implied by the dict tags; a change below still fails the guard (a new submodule type, a hook)."""
    import json
    import os
    import tempfile

    import coil
    from coil import trace

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.norm = torch.nn.LayerNorm(4)

        def forward(self, x):
            return self.norm(self.lin(x)).relu()

    m = torch.nn.Sequential(*[Block() for _ in range(4)])
    cm = coil.compile(m)
    x = torch.randn(2, 4)
    d = tempfile.mkdtemp()
    trace.set_dir(d)
    try:
        for _ in range(3):
            torch.testing.assert_close(cm(x), m(x))
    finally:
        trace.set_dir(None)
    recs = [json.loads(ln) for f in os.listdir(d) if f.endswith(".jsonl") for ln in open(os.path.join(d, f))]
    (ev,) = [r for r in recs if r["event"] == "guard_versions"]
    assert ev["used"] and ev["skipped"] > 3 * ev["kept"], ev
    fast = next(r["text"] for r in recs if r["event"] == "artifact" and r["name"].startswith("guards_fast"))
    assert "._modules" not in fast.split("___s.ok()")[0], fast
    # changes below the root still count: a hook on a deep submodule, a replaced submodule
    m[2].norm.register_forward_hook(lambda mod, i, o: o * 2)
    torch.testing.assert_close(cm(x), m(x))
    m[3].lin = torch.nn.Linear(4, 4)
    torch.testing.assert_close(cm(x), m(x))


def test_entry_reads_inputs_from_the_snapshot_only_while_it_holds_for_its_roots():
    """The entry takes the parameters from the fast guard's snapshot (frame.py, _entry_inputs) only while the snapshot
    holds for this call's root dicts; else (another module object, a parameter assigned since: what another thread
    could do between a guard and its entry) it reads them through the module tree."""
    coil.reset()
    torch.manual_seed(0)
    a, b, x = Net().eval(), Net().eval(), torch.randn(4, 8)
    cm = coil.compile(a)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cm(x), a(x))
        (entry,) = _entries()
        fn = cm._compiled_call._coil_fn
        assert entry.guard.__globals__["___vstate"] is entry.entry.__globals__["___kstate"]
        torch.testing.assert_close(entry.entry(a, (x,), {}, fn), a(x))    # from the snapshot
        torch.testing.assert_close(entry.entry(b, (x,), {}, fn), b(x))    # other roots: b's own parameters
        a.head.weight = nn.Parameter(torch.randn(3, 8))                  # a watched dict written
        torch.testing.assert_close(entry.entry(a, (x,), {}, fn), a(x))


def test_key_list_of_an_ordered_dict_below_two_keys_keeps_the_fast_guard():
    """A guard on the key list of an OrderedDict (a loop over it; torch 2.11's Module call reads its hook
    OrderedDicts so) is implied by the tag while it holds fewer than 2 keys: Whisper's entry on Python 3.12 gave up
    its fast guard over 50 empty hook dicts and ran the full guard on every call. With 2 keys, ``move_to_end``
    reorders without a new tag, so the entry's full guard decides (the loop below then sums in another order)."""
    import collections

    class Extra(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.extra = collections.OrderedDict()

        def forward(self, x):
            for k in self.extra:
                x = x * self.extra[k] + 1
            return self.fc(x)

    coil.reset()
    m = Extra()
    cm = coil.compile(m, dynamic=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cm(x), m(x))
        state = _entries()[-1].guard.__globals__["___vstate"]
        assert state.cur.ok() and state.stale == 0
        m.extra["a"] = 2.0
        for _ in range(3):
            torch.testing.assert_close(cm(x), m(x))
        state = _entries()[-1].guard.__globals__["___vstate"]
        assert state.cur.ok() and state.stale == 0
        m.extra["b"] = 3.0
        for _ in range(2):
            torch.testing.assert_close(cm(x), m(x))
        m.extra.move_to_end("a")
        for _ in range(2):
            torch.testing.assert_close(cm(x), m(x))
