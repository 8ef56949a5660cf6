"""A coil-compiled function, method or module called from inside another compiled function is traced as its
original code (torch.compile nests the same way). Before, capture broke the graph at coil's own wrapper and then
captured coil's frame machinery as user code (graph breaks in ``_miss``/``_find_entry``, and whole-frame eager
fallbacks on a generated entry with a duplicate argument)."""
import torch
import torch.nn as nn

import coil
from coil.capture.frame import reset_stats, stats


def _run(f, *args):
    coil.reset()
    reset_stats()
    ref = f(*args)
    reset_stats()
    torch.testing.assert_close(coil.compile(f, backend="aot_eager")(*args), ref)
    return dict(stats)


def test_compiled_function_called_inside_a_compiled_function_is_inlined():
    inner = coil.compile(lambda x: x.sin() * 2, backend="aot_eager")

    def outer(x):
        return inner(x) + inner(x * 2).cos()
    s = _run(outer, torch.randn(4))
    assert s["graphs"] == 1 and s["graph_breaks"] == 0 and s["fallbacks"] == 0


def test_compiled_method_and_module_called_inside_a_compiled_function_are_inlined():
    class C:
        @coil.compile(backend="aot_eager")
        def meth(self, x):
            return x * 3
    c, lin = C(), coil.compile(nn.Linear(4, 4), backend="aot_eager")
    s = _run(lambda x: c.meth(x) + lin(x).relu(), torch.randn(2, 4))
    assert s["graphs"] == 1 and s["graph_breaks"] == 0 and s["fallbacks"] == 0
