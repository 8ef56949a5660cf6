"""Minimal repros from user testing (a fresh ML engineer trying coil); see FINDINGS.md.

Each test is the smallest program that showed a defect. Fixed ones are plain
regression tests; open ones are ``xfail(strict=True)`` with the diagnosis.
"""
import warnings

import pytest
import torch

import coil
from coil.testing import assert_same_as_eager


def _no_fallback(fn, *args):
    """Compile with the default backend, failing if codegen fell back to the interpreter."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        return assert_same_as_eager(fn, args)


def test_setitem_scalar_into_slice():
    # aten.copy(select, 0-d constant): the lowering loaded src without broadcasting
    # (AssertionError ([i0], []) in ir/nodes.py, codegen fell back). Fixed.
    def f(x):
        y = x.clone()
        y[:, 0] = 0
        return y

    _no_fallback(f, torch.randn(4, 4))


def test_setitem_scalar_into_input_slice():
    def f(x):
        x[:, 1] = 2.5
        return x.sum()

    _no_fallback(f, torch.randn(3, 5))


_CONFIG = {"a": 1}


def test_caught_exception_is_not_a_graph_break():
    def f(x):
        try:
            v = _CONFIG["b"]
        except KeyError:
            v = 2
        return x * v

    e = coil.explain(f, torch.randn(3))
    assert e.graph_break_count == 0 and e.graph_count == 1


def test_wrong_shape_error_is_eagers_without_log_spam(caplog):
    # a wrong input shape raised eager's error, but only after FakeTensorMode logged a
    # 40-line ERROR traceback per failing op ("failed while attempting to run meta").
    m = torch.nn.Linear(4, 3)
    f = coil.compile(m, backend="eager")
    f(torch.randn(2, 4))
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        f(torch.randn(2, 5))
    spam = [r for r in caplog.records if r.name.startswith("torch._subclasses.fake_tensor")]
    assert not spam, spam[0].getMessage()


# fixed: the runtime applies the input's new sizes/strides with as_strided_
# (tests/aot/test_issue16_mutation.py)
def test_metadata_mutation_of_input():
    def f(x):
        x.t_()
        return x + 1

    assert_same_as_eager(f, (torch.randn(2, 3),), backend="aot_eager")


def test_dynamic_true_compiles_once_for_several_batch_sizes():
    """Fixed by dynamic shapes in capture (docs/dynamic_shapes.md)."""
    from coil import capture

    coil.reset()
    capture.reset_stats()
    f = coil.compile(torch.nn.Linear(8, 8), backend="eager", dynamic=True)
    for bs in (2, 3, 5):
        f(torch.randn(bs, 8))
    assert capture.stats["graphs"] == 1
