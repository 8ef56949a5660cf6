"""Regressions from new-user trial 59 (FINDINGS_59.md): training loops with optimizers other than AdamW, torch.func
inside compiled functions, nn.MultiheadAttention / Transformer / RNN modules, in-place ops on views of inputs,
scatter / index_put with duplicates, integer and bool dtype corners, dynamic shapes, reduce-overhead on CPU, graph
breaks in training, and numpy code in traced frames.

The xfail(strict=True) tests are open bugs: each fails today and starts passing (so must lose its mark) once fixed.
"""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed): numpy's Python-level functions in _NUMPY_PURE (np.eye, np.linspace, np.ones, np.tril, ...) were
# inlined, not folded, and ``ndarray.flat`` of a folded (read-only) array was a constant flatiter over it: np.eye's
# ``m[:M - k].flat[i::M + 1] = 1`` broke the graph with that flatiter on the stack, and the resumed frame wrote into
# the read-only snapshot (ValueError where eager runs; had it been writable the write would have missed the copy
# the resume got). Now those functions fold on constants, and ``.flat`` is a graph break.
# ---------------------------------------------------------------------------------------------------------------

def test_np_eye_in_a_compiled_function(coil_reset):
    def f(x):
        a = np.zeros((2, 2)) + np.eye(2) * 3
        return x @ torch.from_numpy(a).float()

    x = torch.randn(2, 2)
    torch.testing.assert_close(coil.compile(f)(x), f(x))
    assert coil.capture.stats["fallbacks"] == 0


def test_write_through_flat_of_a_numpy_array_made_in_the_frame(coil_reset):
    def f(x):
        a = np.zeros(4)
        fl = a.flat
        fl[1] = 5
        return x * float(a.sum())

    x = torch.randn(3)
    torch.testing.assert_close(coil.compile(f)(x), f(x))


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; silent wrong value): a value read from an object outside the frame (``old = s.q``) was rebuilt
# after the graph by re-reading its source, after the frame's side effects were replayed, so it came back as what
# the frame stored there later. ``s.a, s.b = s.b, s.a`` left both attributes equal, ``old = s.q; s.q = [7]; return
# old`` returned [7], ``a = lst[0]; lst[0] = "new"`` returned "new", and contextlib.ExitStack.pop_all() handed the
# new stack an empty callback deque (its callbacks never ran). Now the entry reads such sources at its start.
# ---------------------------------------------------------------------------------------------------------------

class _Box:
    pass


def _run_on_boxes(fn, make):
    ref_args, out_args = make(), make()
    coil.reset()
    return fn(torch.ones(2), *ref_args), coil.compile(fn)(torch.ones(2), *out_args), ref_args, out_args


def test_swap_of_two_attributes(coil_reset):
    def f(x, s):
        s.a, s.b = s.b, s.a
        return x + 1

    def make():
        s = _Box()
        s.a, s.b = [1], [2]
        return (s,)

    _, _, (ref,), (out,) = _run_on_boxes(f, make)
    assert (out.a, out.b) == (ref.a, ref.b) == ([2], [1])


@pytest.mark.parametrize("where", ["attr", "item"])
def test_old_value_returned_after_its_slot_is_rebound(coil_reset, where):
    def f_attr(x, s):
        old = s.q
        s.q = [7]
        return x + 1, old

    def f_item(x, lst):
        old = lst[0]
        lst[0] = [7]
        return x + 1, old

    def make():
        if where == "item":
            return ([[1, 2]],)
        s = _Box()
        s.q = [1, 2]
        return (s,)

    ref, out, _, _ = _run_on_boxes(f_attr if where == "attr" else f_item, make)
    assert out[1] == ref[1] == [1, 2]


def test_old_tensor_attribute_returned_after_rebinding(coil_reset):
    def f(x, s):
        old = s.q
        s.q = x * 5
        return old

    s = _Box()
    s.q = torch.zeros(2)
    q = s.q
    assert coil.compile(f)(torch.ones(2), s) is q


def test_exit_stack_pop_all_keeps_the_callbacks(coil_reset):
    import contextlib

    def f(x):
        log = []
        st = contextlib.ExitStack()
        st.callback(log.append, "a")
        st2 = st.pop_all()
        st2.close()
        return x + 1, log

    assert coil.compile(f)(torch.ones(2))[1] == f(torch.ones(2))[1] == ["a"]


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed; silent wrong value): an attribute store on an object whose class defines ``__setattr__`` ran
# that ``__setattr__`` twice: once traced (its body's effects and its ``object.__setattr__``), once more when the
# entry replayed the store with ``setattr``. A ``__setattr__`` that transforms the value stored it transformed twice;
# one that logs logged twice. The replay is now ``object.__setattr__`` for such classes.
# ---------------------------------------------------------------------------------------------------------------

class _Doubling:
    def __init__(self):
        self.v = 0

    def __setattr__(self, name, value):
        super().__setattr__(name, value * 2)


class _Logging:
    def __init__(self):
        object.__setattr__(self, "log", [])

    def __setattr__(self, name, value):
        self.log.append(name)
        object.__setattr__(self, name, value)


def test_custom_setattr_runs_once_per_store(coil_reset):
    def f(x, o):
        o.v = 3
        return x * o.v

    ref, out = _Doubling(), _Doubling()
    torch.testing.assert_close(coil.compile(f)(torch.ones(2), out), f(torch.ones(2), ref))
    assert out.v == ref.v == 6

    def g(x, o):
        o.a = 1
        return x + 1

    ref, out = _Logging(), _Logging()
    g(torch.ones(2), ref)
    coil.compile(g)(torch.ones(2), out)
    assert out.log == ref.log == ["a"]


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed; silent wrong value): ``l *= n`` on a list and ``s |= t`` / ``&=`` / ``-=`` / ``^=`` on a set made
# a new list / set instead of changing the object: a list or set from outside the frame was left unchanged, and
# another name for it (``m = l; l *= 2; return m``) did not see the change. (``l += [..]`` and ``d |= {..}`` were
# right.) Now they change the traced container itself, recorded as a side effect.
# ---------------------------------------------------------------------------------------------------------------

def test_list_imul_and_set_inplace_ops_change_the_object(coil_reset):
    def f(x, lst, s):
        alias = lst
        lst *= 2
        s |= {3}
        s -= {1}
        s ^= {9}
        return x * len(alias)

    ref_args, out_args = ([1, 2], {1, 2}), ([1, 2], {1, 2})
    ref = f(torch.ones(2), *ref_args)
    torch.testing.assert_close(coil.compile(f)(torch.ones(2), *out_args), ref)
    assert out_args == ref_args == ([1, 2, 1, 2], {2, 3, 9})


def test_set_inplace_or_with_a_frozenset_and_with_dict_keys(coil_reset):
    def f(x, s, fs, d):
        s |= fs             # in place
        t = s
        t |= d.keys()       # set.__ior__ declines dict_keys: dict_keys.__ror__ makes a new set, t is rebound
        return x * len(t), t

    ref_args, out_args = ({1}, frozenset({2}), {3: 0}), ({1}, frozenset({2}), {3: 0})
    ref = f(torch.ones(2), *ref_args)
    out = coil.compile(f)(torch.ones(2), *out_args)   # raised TypeError (set |= list) where eager runs
    torch.testing.assert_close(out[0], ref[0])
    assert out[1] == ref[1] == {1, 2, 3} and out_args[0] == ref_args[0] == {1, 2}


# ---------------------------------------------------------------------------------------------------------------
# Finding 5 (fixed; silent wrong value): a value looked up in a dict subclass from outside the frame
# (``collections.defaultdict``, looked up in the real dict and guarded) had no source, so writes into it were not
# replayed: ``d["k"].append(1)`` left the list empty (also through a subclass's own ``__getitem__``). Now the value's
# source is the guarded lookup itself.
# ---------------------------------------------------------------------------------------------------------------

def test_append_to_a_list_held_by_a_defaultdict(coil_reset):
    import collections

    def f(x, d):
        d["k"].append(1)
        return x + 1

    ref, out = collections.defaultdict(int, {"k": []}), collections.defaultdict(int, {"k": []})
    f(torch.ones(2), ref)
    coil.compile(f)(torch.ones(2), out)
    assert out["k"] == ref["k"] == [1]


class _GetItemDict(dict):
    def __getitem__(self, key):
        return super().__getitem__(key)


def test_write_into_a_value_of_a_dict_subclass_with_getitem(coil_reset):
    def f(x, d):
        d[(1, 2)].append(3)
        return x + 1

    ref, out = _GetItemDict({(1, 2): [1]}), _GetItemDict({(1, 2): [1]})
    f(torch.ones(2), ref)
    coil.compile(f)(torch.ones(2), out)
    assert out[(1, 2)] == ref[(1, 2)] == [1, 3]
