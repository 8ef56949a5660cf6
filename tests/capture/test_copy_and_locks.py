"""``copy.copy`` / ``copy.deepcopy`` and ``with threading.Lock():`` in traced code (transformers' T5 and M2M100
deep-copy their config in ``DynamicCache(config=...)``; Segformer installs its output hooks under a global lock):
one graph, values and Python state as in eager."""
import copy
import threading

import pytest
import torch

import coil


class Cfg:
    def __init__(self):
        self.scale, self.names, self.table = 2.0, ["a", "b"], {"k": 1}


class Strict(Cfg):     # transformers' configs: attribute names mapped on read and write, ``delattr`` of the copy
    attribute_map = {"width": "scale"}

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key, value):
        super().__setattr__(self.attribute_map.get(key, key), value)


CFG, STRICT = Cfg(), Strict()


def deepcopy_config(x):
    y = x.sin()
    c = copy.deepcopy(CFG)
    c.names.append("z")
    c.table["k"] = 7
    c.scale = 5.0
    return y * c.scale + len(c.names) + c.table["k"], c


def deepcopy_mapped(x):
    c = copy.deepcopy(STRICT)
    c.width = c.width + 1
    del c.table
    return x * c.scale, hasattr(c, "table"), c


def copies_of_containers(x):
    nested = [x, [x, 1], {"a": x}, (1, [2])]
    deep, shallow = copy.deepcopy(nested), copy.copy(nested)
    deep[1].append(2)
    deep[0].add_(1)
    shallow.append(3)
    shallow[1].append(4)
    return nested, deep, shallow, deep[0] is deep[2]["a"], copy.copy(CFG).names is CFG.names


def deepcopy_view_pair(x):
    y = x * 2
    return copy.deepcopy([y, y[0]])     # the copies share a storage in eager: a graph break


def _same(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, Cfg):
        assert type(a) is type(b)
        _same(a.__dict__, b.__dict__)
    else:
        assert a == b


@pytest.mark.parametrize("fn", [deepcopy_config, deepcopy_mapped, copies_of_containers])
def test_copies_one_graph_as_eager(fn):
    before = copy.deepcopy((CFG.__dict__, STRICT.__dict__))
    x = torch.randn(3, 2)
    e = coil.explain(fn, x.clone())
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    want, got = fn(x.clone()), coil.compile(fn, backend="eager")(x.clone())
    _same(want, got)
    _same(before, (CFG.__dict__, STRICT.__dict__))      # the copies' mutations stayed on the copies


def test_deepcopy_of_config_follows_the_original():
    f = coil.compile(deepcopy_config, backend="eager")
    x = torch.ones(1)
    f(x)
    try:
        CFG.table = {"k": 1, "j": 2}
        CFG.extra = 3
        _same(f(x), deepcopy_config(x))
        assert f(x)[1].extra == 3
    finally:
        CFG.table = {"k": 1}
        del CFG.extra


def test_deepcopy_of_tensors_sharing_storage_is_a_break():
    x = torch.randn(3)
    e = coil.explain(deepcopy_view_pair, x)
    assert e.graph_break_count == 1 and "copy.deepcopy" in e.break_reasons[0]["reason"]
    _same(coil.compile(deepcopy_view_pair, backend="eager")(x), deepcopy_view_pair(x))
    with pytest.raises(RuntimeError, match="graph leaves"):    # eager's error for a non-leaf requiring grad
        coil.compile(deepcopy_view_pair, backend="eager")(torch.randn(3, requires_grad=True))


LOCK, RLOCK = threading.Lock(), threading.RLock()


def under_locks(x):
    y = x.sin()
    with LOCK:
        y = y * 2
    with RLOCK:
        with RLOCK:
            y = y + 1
    with threading.Lock() as taken:
        y = y * taken
    return y.cos()


def break_under_lock(x):
    with LOCK:
        y = x * 2
        print("held", LOCK.locked())      # a graph break: eager holds the lock here
        y = y + 1
    return y


def test_lock_blocks_are_one_graph():
    x = torch.randn(4)
    e = coil.explain(under_locks, x)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    torch.testing.assert_close(coil.compile(under_locks, backend="eager")(x), under_locks(x))
    assert not LOCK.locked()


def test_break_inside_lock_block_holds_it(capsys):
    x = torch.randn(4)
    torch.testing.assert_close(coil.compile(break_under_lock, backend="eager")(x), break_under_lock(x))
    assert capsys.readouterr().out == "held True\n" * 2 and not LOCK.locked()


def test_held_lock_fails_the_guard_and_waits():
    f = coil.compile(under_locks, backend="eager")
    x = torch.randn(4)
    f(x)
    LOCK.acquire()
    timer = threading.Timer(0.2, LOCK.release)
    timer.start()
    torch.testing.assert_close(f(x), under_locks(x))    # eager took it: waited for the release
    timer.join()
    assert coil.capture.stats["recompiles"] == 1 and not LOCK.locked()
