"""Errors raised by a compiled program name the user's source line, as eager's traceback does.

Two places run user-visible operations outside the user's frames: the entry function of a
frame that broke at a data-dependent ``if`` (the truth test of the tensor) and the
generated wrapper (extern ops, whose eager kernels check what fake kernels accepted)."""
import inspect
import traceback

import pytest
import torch

import coil


def _line_of(fn, text: str) -> int:
    src, first = inspect.getsourcelines(fn)
    return first + next(k for k, line in enumerate(src) if text in line)


def test_bool_of_many_element_tensor_at_a_break_names_the_if():
    def f(x):
        y = x + 1
        if y:
            return x + 1
        return x

    with pytest.raises(RuntimeError, match="more than one value is ambiguous") as info:
        coil.compile(f)(torch.randn(3))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno) == (__file__, _line_of(f, "if y:"))


def test_branch_break_still_takes_both_paths():
    def f(x):
        if x.sum() > 0:
            return x + 1
        return x - 1

    cf = coil.compile(f)
    for x in (torch.ones(3), -torch.ones(3)):
        torch.testing.assert_close(cf(x), f(x))


def test_extern_op_error_notes_the_user_line():
    # the fake mm accepts float @ double; eager's kernel (run by the wrapper) refuses it
    def f(x):
        y = x * 2
        return torch.mm(y, x.double())

    with pytest.raises(RuntimeError, match="same dtype") as info:
        coil.compile(f)(torch.randn(3, 3))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"{__file__}:{_line_of(f, 'torch.mm(')} in f" in notes, notes
