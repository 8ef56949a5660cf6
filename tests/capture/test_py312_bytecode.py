"""Programs whose bytecode differs between CPython 3.11 and 3.12 (run on both).

Each test names the 3.12 instruction(s) it exercises; on 3.11 the same source compiles to
the older instructions, so the test checks both interpreters give eager's answer with the
same graph and graph-break counts.
"""
import dis
import sys

import pytest
import torch
import torch.nn as nn

import coil
from coil.capture import stats

PY312 = sys.version_info[:2] >= (3, 12)


def _check(fn, *args, graphs=1, breaks=0):
    ref = fn(*args)
    out = coil.compile(fn, backend="eager")(*args)
    torch.testing.assert_close(out, ref)
    assert stats["graphs"] == graphs, stats
    assert stats["graph_breaks"] == breaks, stats
    return out


def _opnames(fn):
    return {i.opname for i in dis.get_instructions(fn)}


def _inner(*args, **kwargs):
    return sum(args) * kwargs.get("scale", 1.0)


def test_star_args_call_list_to_tuple():
    # 3.12: CALL_INTRINSIC_1 INTRINSIC_LIST_TO_TUPLE (regression: was a graph break
    # "intrinsic 6" in transformers' ``func(self, *args, **kwargs)`` wrappers).
    def f(x, *args, **kwargs):
        return _inner(x, *args, 2.0, **kwargs)

    if PY312:
        assert "CALL_INTRINSIC_1" in _opnames(f)
    _check(f, torch.randn(4), torch.randn(4), torch.randn(4))
    coil.reset()
    g = coil.compile(f, backend="eager", fullgraph=True)
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(g(x, y, scale=3.0), f(x, y, scale=3.0))


def test_unary_positive():
    # 3.12: CALL_INTRINSIC_1 INTRINSIC_UNARY_POSITIVE
    def f(x):
        return +x * 2 + (+3)

    _check(f, torch.randn(5))


class _Base(nn.Module):
    offset = 0.5

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.k = 2.0

    def forward(self, x):
        return self.lin(x) * self.k


class _ZeroArg(_Base):
    def forward(self, x):
        # 3.12: LOAD_SUPER_ATTR (method form, zero-argument super)
        return super().forward(x).relu() + x


class _TwoArg(_Base):
    def forward(self, x):
        # 3.12: LOAD_SUPER_ATTR (method form, two-argument super) and attribute form
        return super(_TwoArg, self).forward(x) - x


@pytest.mark.parametrize("cls", [_ZeroArg, _TwoArg])
def test_super_forms(cls):
    m = cls()
    x = torch.randn(3, 4)
    if PY312:
        assert "LOAD_SUPER_ATTR" in _opnames(cls.forward)
    out = coil.compile(m, backend="eager")(x)
    torch.testing.assert_close(out, m(x))
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0, stats


class _BreakThenSuper(_Base):
    def forward(self, x):
        # ``super().offset`` (a class attribute) is a graph break today, so the
        # LOAD_SUPER_ATTR runs in plain Python inside a resume function, whose first local
        # is not ``self`` (3.12 regression: zero-argument super() raised TypeError there).
        return super().forward(x) + super().offset


def test_zero_arg_super_runs_in_resume_function():
    m = _BreakThenSuper()
    x = torch.randn(3, 4)
    out = coil.compile(m, backend="eager")(x)
    torch.testing.assert_close(out, m(x))
    if PY312:
        assert stats["fallbacks"] == 0, stats


class _BreakBeforeSuper(_Base):
    def forward(self, x):
        x = x + 1
        print("break")
        return super().forward(x) + 1


def test_zero_arg_super_after_graph_break():
    # The resume function is captured; zero-argument super() must find ``self``, not the
    # resume function's first argument ``___stack0`` (3.11 regression: AttributeError).
    m = _BreakBeforeSuper()
    x = torch.randn(3, 4)
    out = coil.compile(m, backend="eager")(x)
    torch.testing.assert_close(out, m(x))
    assert stats["graph_breaks"] >= 1 and stats["fallbacks"] == 0, stats


def test_inlined_comprehension_shadows_local():
    # 3.12 (PEP 709): LOAD_FAST_AND_CLEAR / STORE_FAST around an inlined list comprehension;
    # the outer ``i`` must survive the comprehension's own ``i``.
    def f(x):
        i = 3
        ys = [x * i for i in range(4)]
        d = {i: x + i for i in range(2)}
        return sum(ys) + d[1] + i

    _check(f, torch.randn(4))


def test_comprehension_variable_unbound_before():
    # 3.12: LOAD_FAST_AND_CLEAR of a name that is not bound yet pushes NULL; restoring
    # it must leave the local unbound (reading it later raises like eager).
    def f(x):
        ys = [x + j for j in range(3)]
        return torch.stack(ys).sum(0)

    _check(f, torch.randn(4))


def test_maybe_unbound_local_load_fast_check():
    # 3.12: LOAD_FAST_CHECK after a conditional ``del``
    def f(x, flag: bool):
        y = x + 1
        if flag:
            del y
            y = x * 3
        return y

    _check(f, torch.randn(4), True)


def test_slices_binary_slice_store_slice():
    # 3.12: BINARY_SLICE / STORE_SLICE (two-operand slices); three operands keep BUILD_SLICE
    def f(x):
        lst = [x, x + 1, x + 2, x + 3]
        lst[1:3] = [x * 5]
        y = x[1:3] + x[::2][:2]
        z = x.clone()
        z[0:2] = y
        return lst[:2], z, tuple(lst[-2:])

    if PY312:
        assert {"BINARY_SLICE", "STORE_SLICE"} <= _opnames(f)
    _check(f, torch.randn(6))


def test_return_const_and_none_jumps():
    # 3.12: RETURN_CONST, POP_JUMP_IF_NONE / POP_JUMP_IF_NOT_NONE
    def g(x, bias=None):
        if bias is None:
            return x * 2
        if bias is not None:
            return x + bias
        return None

    def f(x):
        return g(x), g(x, x)

    _check(f, torch.randn(3))


def test_compare_ops_and_for_loops():
    # 3.12: COMPARE_OP's argument is shifted (>> 4); END_FOR closes each for loop
    def f(x):
        n = 0
        for i in range(6):
            if i < 2 or i >= 5 or i == 3:
                n += 1
            for _ in (1, 2):
                x = x + (i != 4)
        return x * n, n > 2, n <= 1

    _check(f, torch.randn(3))


def test_keyword_call():
    # 3.12: KW_NAMES before CALL (no PRECALL)
    def f(x):
        return torch.nn.functional.layer_norm(x, normalized_shape=(4,), eps=1e-3), \
            torch.sum(x, dim=-1, keepdim=True)

    _check(f, torch.randn(2, 4))


def test_graph_break_inside_loop_resumes():
    # Resume functions are generated with the ``bytecode`` library on both versions.
    def f(x):
        for i in range(2):
            x = x * 2
            print("step", i)
            x = x + 1
        return x

    # three graphs: the frame's first part, then the resume function (the loop's iterator
    # read through its source), compiled again for its last call, where the loop ends
    _check(f, torch.randn(3), graphs=3, breaks=2)


def test_graph_break_inside_with_no_grad():
    def f(x):
        with torch.no_grad():
            y = x * 2
        print("between")
        return y + x

    x = torch.randn(3, requires_grad=True)
    ref = f(x)
    out = coil.compile(f, backend="eager")(x)
    torch.testing.assert_close(out, ref)
    assert out.requires_grad == ref.requires_grad
    assert stats["graph_breaks"] == 1


def test_try_except_around_traceable_code():
    # 3.12 exception table entries for try/finally around code that does not raise
    def f(x):
        try:
            y = x + 1
        finally:
            y = y * 2
        return y

    _check(f, torch.randn(3))


def test_yield_from_is_a_graph_break_not_a_crash():
    # 3.12: SEND / END_SEND in the root frame's inlined helper
    def gen(x):
        yield from (x, x + 1)

    def f(x):
        return list(gen(x))

    ref = f(torch.ones(2) * 0.5)
    x = torch.randn(2)
    out = coil.compile(f, backend="eager")(x)
    torch.testing.assert_close(out, f(x))
    assert len(ref) == 2


def _eager_equal(fn, *args):
    ref = fn(*args)
    out = coil.compile(fn, backend="eager")(*args)
    torch.testing.assert_close(out, ref)
    return out


def test_graph_break_inside_list_comprehension():
    # 3.12 (PEP 709): the comprehension is inlined, so the break happens in the frame itself
    # with the list under construction on the stack; the resume function's LIST_APPENDs to
    # that (input) list must be replayed (regression: silently lost an element). On 3.11 the
    # comprehension frame (argument ``.0``) runs eagerly (regression: SyntaxError in binder).
    def f(x):
        i = 10
        ys = [print("item", i) or x * i for i in range(3)]
        return ys, i

    _eager_equal(f, torch.randn(4))
    assert stats["fallbacks"] == 0, stats


def test_graph_break_inside_dict_and_set_comprehension():
    def f(x):
        d = {k: (print(k) or x + k) for k in range(3)}
        s = {len(str(print(k))) + k for k in range(3)}
        return d, sorted(s)

    _eager_equal(f, torch.randn(4))
    assert stats["fallbacks"] == 0, stats


def test_graph_break_in_comprehension_inside_try_runs_correctly():
    # The comprehension's own cleanup handler does not hide an enclosing user ``try``.
    def f(x):
        try:
            ys = [print(i) or x * i for i in range(2)]
        except ValueError:
            ys = []
        return ys

    _eager_equal(f, torch.randn(4))
