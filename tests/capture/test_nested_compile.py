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


def test_a_model_of_coils_bench_is_captured_not_skipped():
    """The models of coil's bench and tests are user code: skipping coil's own modules at a break (the fix above)
    also skipped them, and the bench's reduce-overhead decoder ran eagerly, silently (0 graphs). Its forward is
    traced in the module's call frame, as a user's model is: captured at a break on a frame of its own, each
    decoding step ran three frames (the call, forward, the call's resume function), three sets of guards."""
    from coil.bench.reduce_overhead import CachedDecoder

    torch.manual_seed(0)
    m = CachedDecoder(64, 16, 2, 1, 16, 1).eval()
    coil.reset()
    reset_stats()
    with torch.no_grad():
        out = coil.compile(m, backend="aot_eager")(torch.randint(0, 64, (1, 8)), torch.arange(8))
    assert stats["graphs"] >= 1 and stats["fallbacks"] == 0, dict(stats)
    assert stats["frames"] == 1, dict(stats)
    assert out[1].shape == (1, 64)
