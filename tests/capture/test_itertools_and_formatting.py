"""``itertools.product``/``combinations``/``permutations``/``combinations_with_replacement``/``pairwise`` over known
items, and f-strings of lists and dicts of constants, inside a compiled frame.

``for a, b in itertools.product(range(2), repeat=2)`` was a graph break ("constructing product (custom __new__)") and
the loop over it a second one, after which the rest of the frame ran eagerly (0 graphs for the whole function);
``f"{cfg.tags}"`` of a list broke the graph ("a list is not a compile-time constant")."""
import dataclasses
import itertools

import pytest
import torch

import coil
from coil.capture.frame import stats


def test_itertools_combinatorics_are_traced():
    def f(x, ws):
        total = x * 0
        for i, (a, b) in enumerate(itertools.product(range(2), [1, 3])):
            total = total + a * b + i
        for a, b in itertools.product([x, x * 2], repeat=2):
            total = total + a * b
        for a, b in itertools.combinations(ws, 2):
            total = total + a @ b
        for p in itertools.permutations(range(3)):
            total = total + p[0] - p[2]
        for a, b in itertools.pairwise(ws):
            total = total - (a - b).sum()
        return total, list(itertools.combinations_with_replacement("ab", 2))
    coil.reset()
    x = torch.randn(3)
    ws = [torch.randn(3) for _ in range(3)]
    got = coil.compile(f, fullgraph=True)(x, ws)
    want = f(x, ws)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0


def test_itertools_error_is_the_users():
    coil.reset()
    with pytest.raises(ValueError, match="non-negative"):
        coil.compile(lambda x: (x, list(itertools.combinations(range(3), -1))))(torch.randn(2))


@dataclasses.dataclass(frozen=True)
class Spec:
    k: int
    tags: list = dataclasses.field(default_factory=list)


def test_fstring_of_lists_and_dicts_follows_their_values():
    def f(x, lst, d):
        s = Spec(2, ["a", "b"])
        return x + 1, f"{s.tags}|{lst}|{d!r}"
    coil.reset()
    c = coil.compile(f)
    x = torch.zeros(1)
    lst, d = [1, 2], {"a": 1}
    assert c(x, lst, d)[1] == "['a', 'b']|[1, 2]|{'a': 1}"
    lst[0], d["a"] = 5, 7
    assert c(x, lst, d)[1] == "['a', 'b']|[5, 2]|{'a': 7}"
    lst.append(3)
    assert c(x, lst, d)[1] == "['a', 'b']|[5, 2, 3]|{'a': 7}"
    assert stats["graph_breaks"] == 0


def test_a_handled_library_function_called_at_a_break_is_itself():
    """A call the tracer hands back to Python (the user's TypeError) is made by the entry, which rebuilt
    ``itertools.chain`` as ``___builtins.chain``: AttributeError instead of the user's TypeError."""
    coil.reset()
    with pytest.raises(TypeError, match="not iterable"):
        coil.compile(lambda x: (x, list(itertools.chain([1], 5))))(torch.randn(2))


def test_tuples_holding_tensors_compare_and_sort_as_python_does():
    """``sorted(d.items())`` over tensor values and ``(1, t) < (2, t)`` broke the graph: sorting asked each key for a
    compile-time constant, and ordering two tuples was unsupported. The first pair that differs decides; tensors
    that would be compared (``bool()`` of a tensor) are a break, as they raise in eager."""
    def f(x):
        d = {"b": x, "a": x * 2, "c": x + 1}
        ordered = [v for _, v in sorted(d.items())]
        top = max([(2, x), (1, x * 2)])[1]
        low = min([(2, x), (1, x * 2)], key=lambda p: (p[0], "k"))[1]
        desc = [t[1] for t in sorted([(1, x), (3, x * 2), (2, x * 3)], reverse=True)]
        return ordered, top, low, desc, (1, x) < (2, x), [1, 2] >= [1, 2, 0], sorted([(x.shape[0], x), (2, x)])[0][1]
    coil.reset()
    x = torch.randn(3)
    got = coil.compile(f, fullgraph=True)(x)
    want = f(x)
    torch.testing.assert_close(got, want)
    assert stats["graph_breaks"] == 0


def test_explicit_dunder_next_is_next():
    """``it.__next__()`` was a graph break ("iterator method __next__"); it is ``next(it)``."""
    def gen(x):
        yield x * 2
        yield x * 3

    def f(x):
        it = iter([x, x + 1])
        a = it.__next__()
        b = zip([x], [x * 2]).__next__()[1]
        g = gen(x)
        return a + it.__next__() + b + g.__next__() + g.__next__()
    coil.reset()
    x = torch.randn(3)
    torch.testing.assert_close(coil.compile(f, fullgraph=True)(x), f(x))
    with pytest.raises(StopIteration):
        coil.compile(lambda x: (x, iter([]).__next__()))(x)


def test_accumulate_islice_zip_longest_are_traced():
    """``itertools.accumulate`` was a graph break ("constructing accumulate (custom __new__)") and the loop over it a
    second one; ``islice`` and ``zip_longest`` likewise."""
    def f(x):
        acc = list(itertools.accumulate([x, x * 2, x * 3]))
        m = list(itertools.accumulate([x, x + 1, x - 2], torch.maximum, initial=x * 0))
        s = list(itertools.islice([x, x + 1, x + 2, x + 3], 1, None, 2))
        z = [a * (1 if b is None else b) for a, b in itertools.zip_longest([x, x], [2.0], fillvalue=None)]
        return torch.stack(acc + m + s + z)
    coil.reset()
    x = torch.randn(3)
    torch.testing.assert_close(coil.compile(f, fullgraph=True)(x), f(x))


def test_lazy_itertools_over_iterators_keep_eagers_order():
    """``islice``/``accumulate``/``zip_longest`` of an iterator read it lazily: reading all of it at once left nothing
    for a later ``next``; a Python ``func`` of ``accumulate`` ran before the loop body; a negative bound raises."""
    log = []

    def add(a, b):
        log.append("f")
        return a + b

    def f(x):
        it = iter([x, x + 1, x + 2, x + 3])
        head = list(itertools.islice(it, 2))
        out = x * 0
        for v in itertools.accumulate([x, x, x], add):
            log.append("body")
            out = out + v
        return len(head), len(list(it)), out

    x = torch.randn(3)
    want = f(x)
    want_log, log[:] = list(log), []
    coil.reset()
    got = coil.compile(f)(x)
    assert got[:2] == want[:2] and log == want_log
    torch.testing.assert_close(got[2], want[2])

    def g(x):
        return list(itertools.islice([x], -1))
    with pytest.raises(ValueError):
        coil.compile(g)(x)
