"""coil.compile / OptimizedModule / reset / disable / backends (issue 2, items 3-4).

Most tests use the ``fake_capture`` fixture (conftest.py): they test the API wrapper,
not capture; the ``test_real_*`` tests run the real capture.
"""
import importlib.metadata

import pytest
import torch

import coil
from coil import config
from coil.api import MODES, OptimizedModule
from coil.exc import BackendCompilerFailed, CoilError, UserError
from coil.testing import CompileCounter


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)
        self.bn = torch.nn.BatchNorm1d(5)
        self.drop = torch.nn.Dropout(0.5)
        self.scale = 3.0

    def forward(self, x):
        return self.drop(self.bn(self.lin(x))) * self.scale

    def helper(self):
        return "helped"


# ----------------------------------------------------------------- OptimizedModule

def test_optimized_module_shares_parameters_buffers_and_state_dict(fake_capture):
    model = Net()
    opt = coil.compile(model, backend="eager")
    assert isinstance(opt, OptimizedModule) and isinstance(opt, torch.nn.Module)
    assert opt._orig_mod is model
    sd, osd = model.state_dict(), opt.state_dict()
    assert list(osd) == list(sd)  # same keys, same order, no "_orig_mod." prefix
    assert all(osd[k] is sd[k] or osd[k].data_ptr() == sd[k].data_ptr() for k in sd)
    assert [n for n, _ in opt.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert all(a is b for a, b in zip(opt.parameters(), model.parameters()))
    assert len(list(opt.parameters())) == len(list(model.parameters())) == 4
    assert [n for n, _ in opt.named_buffers()] == [n for n, _ in model.named_buffers()]
    assert all(a is b for a, b in zip(opt.buffers(), model.buffers()))


def test_optimized_module_load_state_dict_and_optimizer_reach_original(fake_capture):
    model = Net()
    opt = coil.compile(model, backend="eager")
    new = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in
           Net().state_dict().items()}
    opt.load_state_dict(new)
    torch.testing.assert_close(model.lin.weight.detach(), new["lin.weight"])
    before = model.lin.weight.detach().clone()
    opt.eval()
    opt(torch.randn(4, 6)).sum().backward()
    assert model.lin.weight.grad is not None
    with torch.no_grad():  # an SGD step on the wrapper's parameters
        for p in opt.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad
    assert not torch.equal(before, model.lin.weight.detach())


def test_optimized_module_forwards_attribute_access(fake_capture):
    model = Net()
    model.custom = {"a": 1}
    opt = coil.compile(model, backend="eager")
    assert opt.scale == 3.0
    assert opt.custom == {"a": 1}
    assert opt.lin is model.lin
    assert opt.helper() == "helped"
    with pytest.raises(AttributeError):
        opt.no_such_attribute


def test_optimized_module_follows_train_and_eval(fake_capture):
    model = Net()
    opt = coil.compile(model, backend="eager")
    assert opt.training and model.training
    assert opt.eval() is opt
    assert not opt.training and not model.training and not model.drop.training
    x = torch.randn(4, 6)
    torch.testing.assert_close(opt(x), model(x))  # eval: dropout off, running stats
    opt.train()
    assert opt.training and model.training and model.drop.training
    model.eval()  # changing the original is seen through the wrapper
    assert not opt.training
    opt.training = True
    assert model.training


def test_optimized_module_in_parent_module(fake_capture):
    parent = torch.nn.Sequential(coil.compile(Net(), backend="eager"))
    parent.eval()
    assert not parent[0].training and not parent[0]._orig_mod.training


def test_optimized_module_repr_and_deepcopy(fake_capture):
    import copy

    opt = coil.compile(Net(), backend="eager")
    assert "Net" in repr(opt)
    cp = copy.deepcopy(opt)
    assert isinstance(cp, OptimizedModule) and cp._orig_mod is not opt._orig_mod
    assert list(cp.state_dict()) == list(opt.state_dict())
    x = torch.randn(4, 6)
    opt.eval(), cp.eval()
    torch.testing.assert_close(cp(x), opt(x))
    with torch.no_grad():
        cp.lin.weight.add_(1.0)  # the copy runs its own weights, the original is untouched
    torch.testing.assert_close(cp(x), cp._orig_mod(x))
    torch.testing.assert_close(opt(x), opt._orig_mod(x))
    assert not torch.allclose(cp(x), opt(x))


# ------------------------------------------------------------------ decorator forms

@pytest.fixture
def default_backend_counter(monkeypatch):
    """Stand in a CompileCounter for the default backend "coil"."""
    from coil.backends import registry

    cnt = CompileCounter()
    monkeypatch.setitem(registry._BACKENDS, "coil", cnt)
    return cnt


def test_decorator_without_arguments(fake_capture, default_backend_counter):
    @coil.compile
    def f(x):
        return torch.sin(x) + 1

    x = torch.randn(5)
    torch.testing.assert_close(f(x), torch.sin(x) + 1)
    assert len(fake_capture.calls) == 1
    assert default_backend_counter.frame_count == 1  # default backend is "coil"


def test_decorator_with_empty_parentheses(fake_capture, default_backend_counter):
    @coil.compile()
    def f(x):
        return x * 2

    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 2)
    assert default_backend_counter.frame_count == 1


def test_decorator_with_arguments_passes_them_on(fake_capture):
    cnt = CompileCounter()

    @coil.compile(backend=cnt, fullgraph=True, dynamic=False)
    def f(x):
        return torch.relu(x) - x

    x = torch.randn(7)
    torch.testing.assert_close(f(x), torch.relu(x) - x)
    f(x)
    assert cnt.frame_count == 1 and cnt.op_count == 2
    (_, fullgraph, dynamic), = fake_capture.calls
    assert fullgraph is True and dynamic is False


def test_call_form_on_function(fake_capture):
    cnt = CompileCounter()
    g = coil.compile(lambda x, y: x @ y, backend=cnt)
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(g(a, b), a @ b)
    assert cnt.frame_count == 1


# -------------------------------------------------------------- ValueError messages

def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError) as e:
        coil.compile(lambda x: x, mode="fast please")
    for m in MODES:
        assert repr(m) in str(e.value)
    with pytest.raises(ValueError, match="max-autotune"):
        coil.compile(mode="turbo")  # decorator form fails at decoration time


def test_unknown_backend_lists_valid_backends():
    with pytest.raises(ValueError) as e:
        coil.compile(lambda x: x, backend="nope")
    for name in ("eager", "aot_eager", "coil", "inductor"):
        assert name in str(e.value)


def test_unknown_options_list_valid_options():
    with pytest.raises(ValueError) as e:
        coil.compile(lambda x: x, options={"bogus": 1, "fusion": False, "also_bad": 2})
    msg = str(e.value)
    assert "bogus" in msg and "also_bad" in msg
    for name in config.option_names():
        assert name in msg


def test_torch_compile_keywords_are_accepted():
    """torch.compile's keywords: ``disable`` returns the target unchanged, ``recompile_limit`` is honoured, ``name``
    and ``isolate_recompiles`` are accepted; ``shapes_spec`` and keywords torch.compile lacks raise clear errors."""
    import inspect

    coil_kw = set(inspect.signature(coil.compile).parameters)
    assert set(inspect.signature(torch.compile).parameters) - {"model"} <= coil_kw
    f, m = (lambda x: x + 1), torch.nn.Linear(2, 2)
    assert coil.compile(f, disable=True) is f and coil.compile(m, disable=True) is m
    assert coil.compile(disable=True, mode="max-autotune")(f) is f
    cnt = CompileCounter()
    g = coil.compile(lambda x, n: x * n, backend=cnt, dynamic=False, recompile_limit=1, name="g",
                     isolate_recompiles=True)
    with pytest.warns(UserWarning, match=r"recompile limit \(1\)"):
        for n in (2, 3, 4):
            assert g(torch.ones(1), n).item() == n
    assert cnt.frame_count == 1
    assert coil.compile(lambda x: x.cos(), backend=None)(torch.zeros(1)).item() == 1
    with pytest.raises(TypeError, match="unknown keyword.*autotune.*options="):
        coil.compile(f, autotune=True)
    with pytest.raises(NotImplementedError, match="shapes_spec.*mark_dynamic"):
        coil.compile(f, shapes_spec=object())


def test_valid_modes_are_accepted(fake_capture):
    for m in (None, "reduce-overhead", "max-autotune"):
        coil.compile(lambda x: x, mode=m, backend="eager")


# ---------------------------------------------------------- options, mode, errors

def test_options_apply_during_compile_and_run_then_restore(fake_capture):
    seen = {}

    def backend(gm, example_inputs):
        seen["compile"] = (config.config.fusion, config.config.cudagraphs)

        def run(*args):
            seen["run"] = config.config.fusion
            return gm(*args)

        return run

    before = config.config.fusion
    f = coil.compile(lambda x: x + 1, backend=backend, mode="reduce-overhead",
                     options={"fusion": not before})
    f(torch.randn(2))
    assert seen == {"compile": (not before, True), "run": not before}
    assert config.config.fusion is before and config.config.cudagraphs is False


def test_backend_exception_becomes_backend_compiler_failed(fake_capture):
    def broken(gm, example_inputs):
        raise RuntimeError("kaboom")

    f = coil.compile(lambda x: x + 1, backend=broken)
    with pytest.raises(BackendCompilerFailed) as e:
        f(torch.randn(2))
    assert e.value.backend_name == "broken"
    assert isinstance(e.value.inner, RuntimeError) and e.value.__cause__ is e.value.inner
    assert "kaboom" in str(e.value) and "what to do" in str(e.value)
    assert isinstance(e.value, CoilError)


def test_user_error_from_backend_passes_through(fake_capture):
    def strict(gm, example_inputs):
        raise UserError("bad input", hint="fix it")

    with pytest.raises(UserError, match="fix it"):
        coil.compile(lambda x: x, backend=strict)(torch.randn(1))


# ---------------------------------------------------------------- reset / disable

def test_reset_drops_compiled_code(fake_capture):
    cnt = CompileCounter()
    f = coil.compile(lambda x: x.cos(), backend=cnt)
    x = torch.randn(3)
    f(x), f(x)
    assert cnt.frame_count == 1
    coil.reset()
    f(x)
    assert cnt.frame_count == 2


def test_disable_delegates_to_capture(fake_capture):
    def g(x):
        return x - 1

    assert coil.disable(g) is g
    cnt = CompileCounter()
    h = coil.compile(g, backend=cnt)
    x = torch.randn(2)
    torch.testing.assert_close(h(x), x - 1)
    assert cnt.frame_count == 0


def test_explain_delegates_to_capture(fake_capture):
    assert coil.explain(lambda x: x, torch.randn(1)) == "explained"


def test_real_capture_reset_and_disable():
    cnt = CompileCounter()

    def inner(x):
        return x * 3

    coil.disable(inner)

    def f(x):
        return inner(x.sin()) + 1

    cf = coil.compile(f, backend=cnt)
    x = torch.randn(4)
    torch.testing.assert_close(cf(x), f(x))
    cf(x)
    n = cnt.frame_count
    assert n >= 1
    coil.reset()
    cf(x)
    assert cnt.frame_count > n


def test_real_capture_module_wrapper():
    model = Net().eval()
    opt = coil.compile(model, backend="eager")
    x = torch.randn(4, 6)
    torch.testing.assert_close(opt(x), model(x))


# --------------------------------------------------------------- backend registry

def test_list_backends_has_the_four():
    assert {"eager", "aot_eager", "coil", "inductor"} <= set(coil.list_backends())
    assert coil.list_backends() == sorted(coil.list_backends())


def test_register_backend_makes_it_usable_by_name(fake_capture):
    from coil.backends import registry

    cnt = CompileCounter()
    registry.register_backend("counting_for_test")(cnt)
    try:
        assert "counting_for_test" in coil.list_backends()
        f = coil.compile(lambda x: x.exp(), backend="counting_for_test")
        f(torch.randn(3))
        assert cnt.frame_count == 1
    finally:
        registry._BACKENDS.pop("counting_for_test")


def test_eager_backend_runs_the_graph():
    from coil.backends import lookup_backend

    gm = torch.fx.symbolic_trace(lambda x: x.tanh() * 2)
    x = torch.randn(5)
    torch.testing.assert_close(lookup_backend("eager")(gm, [x])(x), x.tanh() * 2)


def test_entry_point_registers_coil_with_torch_compile():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    (ep,) = [e for e in eps if e.name == "coil"]
    from coil.backends.registry import coil_backend_entry

    assert ep.load() is coil_backend_entry
    import torch._dynamo  # tests may import it; coil/ may not

    assert torch._dynamo.lookup_backend("coil") is coil_backend_entry


def test_torch_compile_backend_coil_runs():
    torch._dynamo.reset()

    def f(x):
        return torch.nn.functional.gelu(x) * 2 + 1

    x = torch.randn(16)
    torch.testing.assert_close(torch.compile(f, backend="coil")(x), f(x))


@pytest.mark.slow
def test_inductor_backend_hands_the_graph_to_torch(fake_capture):
    """Runs torch's Inductor (C++ codegen on CPU: tens of seconds), so outside CI."""
    def f(x):
        return torch.nn.functional.silu(x) * 3

    x = torch.randn(32)
    torch.testing.assert_close(coil.compile(f, backend="inductor")(x), f(x))


def test_cudagraph_modes_compile_without_warning(fake_capture):
    """mode="reduce-overhead" is implemented (coil/runtime/cudagraph_trees.py): it no
    longer warns that it is not, and it turns on the cudagraphs option."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for mode in ("reduce-overhead", "max-autotune-no-cudagraphs"):
            coil.compile(lambda x: x, mode=mode, backend="eager")
    assert callable(coil.cudagraph_mark_step_begin)


def test_a_method_of_the_original_reached_through_the_compiled_module_warns_once():
    """``coil.compile(model).generate(...)`` runs the original's code (its ``self(...)`` is the uncompiled forward):
    a silent eager run. It warns once per method, naming the fix; attributes, submodules and nn.Module's own
    methods do not warn."""
    import warnings

    from coil import api

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x)

        def run_twice(self, x):
            return self(self(x))
    api._WARNED_METHODS.clear()
    m = coil.compile(M())
    x = torch.randn(2, 3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m.lin, m.parameters(), m(x)
        assert not w
        ref = m.run_twice(x)
        m.run_twice(x)
    assert len(w) == 1 and "M.run_twice" in str(w[0].message) and "model.forward = coil.compile" in str(w[0].message)
    assert w[0].filename == __file__   # the user's line
    assert torch.allclose(ref, m._orig_mod(m._orig_mod(x)))
