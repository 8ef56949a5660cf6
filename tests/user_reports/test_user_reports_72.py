"""Regressions from new-user trial 72 (FINDINGS_72.md): transformers architectures and the code around them
(`generate()`, `torch.distributed` checks), compared with eager.
"""

import enum
import functools
import warnings

import pytest
import torch
import torch.distributed as dist

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; a whole function silently uncompiled but for a warning): a property of a metaclass read
# through the class (`GroupMember.WORLD`, which `torch.distributed.is_initialized()` reads) raised AttributeMissing
# in capture, so any compiled function calling `dist.is_initialized()` (transformers' `generate()` does) ran
# eagerly, uncompiled. The property's getter is traced as an instance property's is.
# ---------------------------------------------------------------------------------------------------------------

_world = [None]


class _Meta(type):
    @property
    def WORLD(cls):
        return _world[0]


class _Group(metaclass=_Meta):
    pass


def _captured(fn, *args):
    """(compiled result, whether coil captured a graph without a 'could not capture' warning)."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = coil.compile(fn)(*args)
    return out, not any("could not capture" in str(x.message) for x in w)


def test_a_metaclass_property_read_through_the_class_is_captured(coil_reset):
    def f(x):
        return x + 1 if _Group.WORLD is None else x * _Group.WORLD

    x = torch.arange(4.0)
    out, ok = _captured(f, x)
    assert ok and torch.equal(out, f(x))
    assert coil.explain(f, x).graph_count == 1
    _world[0] = 3                  # the getter's result is guarded: the next call sees the new value
    try:
        out, ok = _captured(f, x)
        assert ok and torch.equal(out, x * 3)
    finally:
        _world[0] = None


def test_dist_is_initialized_inside_a_compiled_function(coil_reset):
    def step(x):
        if dist.is_available() and dist.is_initialized():
            return x * 2
        return torch.relu(x) + 1

    x = torch.randn(8)
    out, ok = _captured(step, x)
    assert ok and torch.equal(out, step(x))
    assert coil.explain(step, x).graph_count == 1


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; a silent fallback to eager, no warning): a function decorated with `@torch.no_grad()` (or
# `enable_grad`, `inference_mode`, `torch.autocast(...)`) called at a graph break ran as plain Python with
# everything it calls: torch's decorator wrapper is library code, so the decorated user function was never captured
# on its own frame. `coil.compile(f)` of an `f` that returns such a call (transformers' `generate()`) made no graph
# at all, and `coil.explain` reported 0 graphs and 0 graph breaks.
# ---------------------------------------------------------------------------------------------------------------

def _helper_body(x):
    y = torch.sin(x) * 2
    print("a graph break")
    return torch.cos(y) + 1


_no_grad_helper = torch.no_grad()(_helper_body)
_autocast_helper = torch.autocast("cpu", torch.bfloat16)(_helper_body)


def _forwards(x):
    return _no_grad_helper(x)


def _calls_then_scales(x):
    return _no_grad_helper(x + 1) * 3


def _calls_autocast(x):
    return _autocast_helper(x + 1) * 3


@pytest.mark.parametrize("fn", [_forwards, _calls_then_scales, _calls_autocast])
def test_a_context_decorated_callee_with_a_break_is_captured(coil_reset, fn):
    from coil.capture import frame
    x = torch.randn(6)
    out, ref = coil.compile(fn)(x), fn(x)
    assert out.dtype == ref.dtype and out.requires_grad == ref.requires_grad
    torch.testing.assert_close(out, ref)
    # the helper's sin and cos are in graphs of their own (before: 0 graphs for _forwards, only x + 1 and * 3 else);
    # a break inside autocast resumes inside it too (FINDINGS_75 #2; it ran the autocast wrapper's frame eagerly)
    assert frame.stats["graphs"] >= (2 if fn in (_forwards, _calls_autocast) else 4), frame.stats


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed; a function uncompiled but for a warning, or recompiled on every call): a global dict keyed by
# enum members (transformers' GENERATION_MODES_MAPPING) was guarded with the keys' repr, `[<Mode.A: 'a'>]`, which
# is no Python: "could not capture f ... SyntaxError: invalid syntax", the function ran eagerly. A dict keyed by
# float("inf") guarded `d[inf]`, a NameError in the guard, so every call recompiled until the recompile limit.
# ---------------------------------------------------------------------------------------------------------------


class _Mode(enum.Enum):
    A = "a"
    B = "b"


_TABLE = {_Mode.A: 1.0, _Mode.B: 2.0}
_INF = {float("inf"): 5.0, 1.5: 0.5}


def _scale_by_mode(x):
    return x * _TABLE[_Mode.B] + sum(v for k, v in _TABLE.items() if k is not _Mode.B)


def _scale_by_inf(x):
    return x * _INF[float("inf")]


@pytest.mark.parametrize("fn", [_scale_by_mode, _scale_by_inf])
def test_a_dict_keyed_by_enum_members_or_inf_is_captured_once(coil_reset, fn):
    from coil.capture import frame
    x = torch.randn(5)
    cf = coil.compile(fn)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        outs = [cf(x) for _ in range(3)]
    assert not [m for m in w if "coil" in str(m.message)]
    for o in outs:
        torch.testing.assert_close(o, fn(x))
    assert (frame.stats["graphs"], frame.stats["recompiles"]) == (1, 0), frame.stats
    if fn is _scale_by_mode:    # the guarded lookup sees a new value
        _TABLE[_Mode.B] = 3.0
        try:
            torch.testing.assert_close(cf(x), fn(x))
        finally:
            _TABLE[_Mode.B] = 2.0


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed; silent until the recompile limit's warning): a global, a module attribute or a default argument
# holding float("inf") / float("-inf") was guarded as `x == inf` (its repr), a NameError in the guard, so every call
# recompiled (4 calls: 4 graphs) until the recompile limit, after which the function ran eagerly.
# ---------------------------------------------------------------------------------------------------------------

_NEG = float("-inf")


class _Capped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cap = float("inf")

    def forward(self, x):
        return x.clamp(max=self.cap) + 1


def _floor_at_neg(x):
    return torch.maximum(x, torch.full_like(x, _NEG)) * 2


def _clamp_default(x, lim=float("inf")):
    return x.clamp(max=lim) * 3


@pytest.mark.parametrize("make", [lambda: _floor_at_neg, _Capped, lambda: _clamp_default])
def test_an_infinite_float_constant_does_not_recompile_every_call(coil_reset, make):
    from coil.capture import frame
    fn, x = make(), torch.randn(7)
    cf = coil.compile(fn)
    for _ in range(4):
        torch.testing.assert_close(cf(x), fn(x))
    assert (frame.stats["graphs"], frame.stats["recompiles"]) == (1, 0), frame.stats
    if isinstance(fn, _Capped):     # a new value is seen
        fn.cap = 0.0
        torch.testing.assert_close(cf(x), fn(x))


# ---------------------------------------------------------------------------------------------------------------
# Finding 6 (fixed; a silent wrong value after the call): a graph break inside `with ac:` where `ac` is a
# torch.autocast object made before the call (a global, a closure, `@torch.autocast(...)`'s own instance) left
# autocast enabled after the compiled call returned: `__enter__` was traced as plain Python, its
# `torch.set_autocast_enabled` ran for real while tracing, so the second trace read `prev = True` and the resumed
# `__exit__` restored "enabled". Every later eager op ran under bf16 autocast. Such an object is now traced as a
# `torch.autocast(...)` made in the frame (a break inside it resumes inside a re-entered block: FINDINGS_75 #2).
# ---------------------------------------------------------------------------------------------------------------

_AC = torch.autocast("cpu", torch.bfloat16)


def _with_global_autocast(x):
    with _AC:
        y = torch.sin(x) @ torch.ones(4, 4)
        print("a graph break")
        return torch.cos(y) + 1


def _no_break_global_autocast(x):
    with _AC:
        return torch.sin(x) @ torch.ones(4, 4)


@pytest.mark.parametrize("fn", [_with_global_autocast, _no_break_global_autocast, _autocast_helper, _calls_autocast])
def test_a_pre_existing_autocast_object_leaves_autocast_as_it_was(coil_reset, fn):
    x = torch.randn(3, 4)
    ref = fn(x)
    assert not torch.is_autocast_enabled("cpu")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = coil.compile(fn)(x)
            out2 = coil.compile(fn)(x)
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        for o in (out, out2):
            assert o.dtype == ref.dtype
            torch.testing.assert_close(o, ref)
    finally:
        torch.set_autocast_enabled("cpu", False)


# ---------------------------------------------------------------------------------------------------------------
# Finding 7 (fixed; a visible break, but the callee silently uncompiled): a functools.partial of a user function
# called at a graph break ran as plain Python (only functions, methods and modules were captured on their own
# frame), so everything after the break inside it was eager. Its function is now captured, the partial's arguments kept.
# ---------------------------------------------------------------------------------------------------------------


def _scaled_body(x, k, *, shift):
    y = torch.sin(x) * k
    print("a graph break")
    return torch.cos(y) + shift


_partial = functools.partial(_scaled_body, k=2.0, shift=1.0)


def test_a_partial_called_at_a_break_is_captured(coil_reset):
    from coil.capture import frame

    def f(x):
        return _partial(x + 1) * 3

    x = torch.randn(5)
    torch.testing.assert_close(coil.compile(f)(x), f(x))
    assert frame.stats["graphs"] == 4, frame.stats    # x + 1, sin * k, cos + shift, * 3 (before: 2)
