"""Core capture behaviour: graphs, guards, recompiles, graph breaks, fallbacks."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import pytest

import coil
from coil.capture import stats, explain


def _check(fn, *args, graphs=None, breaks=None, **kw):
    ref = fn(*args)
    out = coil.compile(fn, backend="eager", **kw)(*args)
    torch.testing.assert_close(out, ref)
    if graphs is not None:
        assert stats["graphs"] == graphs, stats
    if breaks is not None:
        assert stats["graph_breaks"] == breaks, stats
    return out


def test_pointwise_and_containers():
    def f(x, y):
        a = x + y
        return torch.sin(a) * 2, [a, {"k": a.sum(-1)}], (a.shape[0], a.ndim)
    _check(f, torch.randn(3, 4), torch.randn(3, 4), graphs=1, breaks=0)


def test_module_with_submodules_and_buffers():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
            self.norm = nn.LayerNorm(8)
            self.seq = nn.Sequential(nn.Linear(8, 4), nn.GELU())
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = F.relu(layer(x)) + i
            return self.seq(self.norm(x) * self.scale)

    m = M()
    x = torch.randn(2, 8)
    out = coil.compile(m, backend="eager")(x)
    torch.testing.assert_close(out, m(x))
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0


def test_parameters_are_graph_inputs_requiring_grad():
    seen = []

    def backend(gm, example_inputs):
        seen.extend(example_inputs)
        return gm.forward

    lin = nn.Linear(4, 3)
    coil.compile(lin, backend=backend)(torch.randn(2, 4))
    assert any(t is lin.weight for t in seen) and any(t is lin.bias for t in seen)


def test_recompile_on_shape_and_log_reason():
    def f(x):
        return x * 2

    cf = coil.compile(f, backend="eager")
    cf(torch.randn(3))
    cf(torch.randn(3))
    assert stats["frames"] == 1
    cf(torch.randn(5))
    assert stats["frames"] == 2 and stats["recompiles"] == 1


def test_replaced_parameter_is_seen():
    lin = nn.Linear(4, 4)
    cm = coil.compile(lin, backend="eager")
    x = torch.randn(2, 4)
    cm(x)
    lin.weight = nn.Parameter(torch.randn(4, 4))
    torch.testing.assert_close(cm(x), lin(x))


def test_training_flag_guard():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    cm = coil.compile(m, backend="eager")
    x = torch.randn(8, 4)
    m.eval()
    torch.testing.assert_close(cm(x), m(x))
    m.train()
    torch.manual_seed(3)
    a = cm(x)
    torch.manual_seed(3)
    torch.testing.assert_close(a, m(x))


def test_graph_break_print_and_data_dependent_branch(capsys):
    def g(x):
        y = x * 2
        print("hello")
        z = y + 1
        if z.sum() > 0:
            return z.cos()
        return z.sin()

    cg = coil.compile(g, backend="eager")
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(cg(x), g(x))
    assert "hello" in capsys.readouterr().out
    e = explain(g, torch.randn(4))
    assert e.graph_break_count == 2
    assert "print" in e.break_reasons[0]["reason"]


def test_item_is_a_graph_break():
    def f(x):
        s = x.sum().item()
        return x + s

    _check(f, torch.randn(4), breaks=1)


def test_fullgraph_raises_user_error_with_location():
    def f(x):
        print("no")
        return x

    with pytest.raises(coil.exc.UserError, match="test_core.py"):
        coil.compile(f, backend="eager", fullgraph=True)(torch.randn(2))


def test_user_exception_propagates_same_type_and_message():
    def f(x):
        return x @ torch.randn(5, 5)

    with pytest.raises(RuntimeError) as ei:
        f(torch.randn(3, 4))
    with pytest.raises(RuntimeError) as ci:
        coil.compile(f, backend="eager")(torch.randn(3, 4))
    assert str(ci.value) == str(ei.value)


def test_side_effects_replayed():
    log = []
    state = {"n": 0}

    def f(x):
        log.append(1)
        state["n"] += 1
        return x + 1

    coil.compile(f, backend="eager")(torch.randn(2))
    assert log == [1] and state == {"n": 1}


def test_recompile_limit_runs_eagerly():
    def f(x, n):
        return x + n

    cf = coil.compile(f, backend="eager", dynamic=False)   # (else n becomes a graph input)
    with coil.config.patch(recompile_limit=2):
        for n in range(5):
            torch.testing.assert_close(cf(torch.ones(2), n), torch.ones(2) + n)
    assert stats["eager_limit"] == 1


def test_guard_function_is_printable_python():
    def f(x):
        return x + 1

    e = explain(f, torch.randn(2))
    assert e.guards and e.guards[0].startswith("def ___guard(")


def test_setitem_node_is_kept():
    # regression: in-place nodes returning None were erased as "constant results"
    def f(x):
        y = x.clone()
        y[0] = 1.5
        y[1:, 0] *= 3
        return y

    _check(f, torch.randn(3, 4), graphs=1, breaks=0)


def test_user_error_after_graph_runs_side_effects():
    log = []

    def f(x):
        log.append("before")
        y = x + 1
        return y @ torch.randn(7, 7)

    with pytest.raises(RuntimeError):
        coil.compile(f, backend="eager")(torch.randn(3, 4))
    assert log == ["before"]


def test_compiling_a_builtin_an_aten_op_or_a_callable_object_captures_it():
    """``coil.compile(torch.fmod)`` returned the builtin itself: it ran eagerly, silently.
    Builtins and ATen ops are captured through a function that calls them, callable
    objects through ``__call__``; what capture cannot take (a class) runs eagerly with a
    warning naming the user's line."""
    import warnings

    import coil
    from coil.testing import CompileCounter

    class Scale:
        def __call__(self, x):
            return x * 2 + 1

    x = torch.randn(3)
    for target, args, ref in [(torch.fmod, (x, torch.tensor(0.3)), torch.fmod(x, torch.tensor(0.3))),
                              (torch.ops.aten.add.Tensor, (x, x), x + x), (Scale(), (x,), x * 2 + 1)]:
        coil.reset()
        cnt = CompileCounter()
        assert torch.equal(coil.compile(target, backend=cnt)(*args), ref)
        assert cnt.frame_count == 1, target
    with pytest.warns(UserWarning, match="runs eagerly") as rec:
        assert coil.compile(dict)(a=1) == {"a": 1}
    assert rec[0].filename == __file__


def test_negative_literal_base_of_a_power():
    """Gradient fuzzer s1044 #819: ``(-0.5) ** a`` gave -1 at a = 0 where the captured graph's code ran (the eager
    backend, a graph that runs eagerly): FX printed ``operator.pow(-0.5, a)`` as ``-0.5 ** a``, -(0.5 ** a)."""
    a = torch.tensor([0.0, 1.0, 2.0])
    _check(lambda x: ((-0.5) ** x, (-2) ** x.long(), (-0.0) ** x, (-float("inf")) ** x), a)
