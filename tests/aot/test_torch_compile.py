"""aot_eager and coil under torch's capture: dynamic shapes, input mutation, aliasing,
symbolic Python floats."""
import json

import pytest
import torch
import torch._dynamo
import torch.nn as nn

from coil import trace
from coil.aot.backend import aot_eager
from coil.backends import registry


def _compile(fn, **kw):
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(fn, backend=aot_eager, **kw)


def test_dynamic_shapes_training_two_sizes():
    def f(x, w):
        return (x @ w).relu().sum(0) * x.shape[0]

    c = _compile(f, dynamic=True)
    w = torch.randn(4, 3, requires_grad=True)
    for n in (5, 7, 9):
        x = torch.randn(n, 4)
        out, ref = c(x, w), f(x, w)
        torch.testing.assert_close(out, ref)
        (g,) = torch.autograd.grad(out.sum(), w)
        (rg,) = torch.autograd.grad(ref.sum(), w)
        torch.testing.assert_close(g, rg)


def test_input_mutation_and_view_output_through_dynamo():
    def f(x, buf):
        buf.add_(x.sum())
        x[:, 0].mul_(2)
        return x.t(), buf * 2

    x, buf = torch.randn(3, 4), torch.randn(2)
    xr, br = x.clone(), buf.clone()
    c = _compile(f, dynamic=False)
    out_t, out_b = c(x, buf)
    ref_t, ref_b = f(xr, br)
    torch.testing.assert_close(x, xr)
    torch.testing.assert_close(buf, br)
    torch.testing.assert_close(out_t, ref_t)
    assert out_t._base is x


def test_batchnorm_module_buffers_through_dynamo():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU())
    ref = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU())
    ref.load_state_dict(m.state_dict())
    c = _compile(m, dynamic=False)
    for _ in range(3):
        x = torch.randn(8, 5)
        torch.testing.assert_close(c(x), ref(x))
    for (name, b), r in zip(m.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, r, msg=name)


def test_dynamic_shapes_outputs_that_are_views():
    """Symbolic sizes: a view of an input, of another output and of an input with a
    size-dependent offset are rebuilt with each call's sizes (they were as_strided with
    the trace's SymInts: "SymIntArrayRef expected to contain only concrete integers")."""
    def f(x):
        z = x.exp()
        return z, z.t(), x.t(), x[1:]

    c = _compile(f, dynamic=True)
    for shape in ((4, 5), (3, 2)):
        x = torch.randn(*shape)
        out, ref = c(x), f(x)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r)
            assert o.stride() == r.stride() and o.storage_offset() == r.storage_offset()
        assert out[2]._base is x and out[3]._base is x and out[1]._base is out[0]


def test_dynamic_shapes_training_mutation_from_grad_input():
    """Symbolic sizes: ``y.mul_(x)`` with ``x`` requiring grad. The capture's fake ``y``
    requires grad after its trace; faked from the real input it does not ("Mixing fake
    modes NYI" in trace_joint). A bool output makes the mutated ``y``'s missing gradient
    zeros of the call's shape (not the traced symbolic one)."""
    def f(x, y):
        y.mul_(x)
        return x.sin() + y, x > 0

    c = _compile(f, dynamic=True)
    for shape in ((4, 5), (3, 2)):
        x, y = torch.randn(*shape, requires_grad=True), torch.randn(*shape)
        xr, yr = x.detach().clone().requires_grad_(), y.clone()
        out, ref = c(x, y), f(xr, yr)
        torch.testing.assert_close(out[0], ref[0])
        torch.testing.assert_close(y, yr)
        out[0].sum().backward()
        ref[0].sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)


# ---------------------------------------------------------------- symbolic Python floats
# torch's capture passes a float it made symbolic (dynamic=True, or the recompile after a
# float argument changed) as a 0-d float64 tensor read with .item() in the graph


def _counting_coil(errors: list, calls: list):
    def be(gm, example_inputs):
        calls.append(1)
        try:
            return registry.coil_backend_entry(gm, example_inputs)
        except Exception as e:  # torch's capture would run the graph eagerly
            errors.append(f"{type(e).__name__}: {e}")
            raise
    return be


def test_symbolic_float_argument_reads_the_tensor_at_each_call():
    """A temperature: the recompile for the second value makes it symbolic (torch does
    the same); the graph then reads the 0-d tensor, so a third value neither recompiles
    nor reuses the old value (it failed with DataDependentOutputException, then was
    specialized to the first value)."""
    errors, calls = [], []
    torch._dynamo.reset()
    c = torch.compile(lambda x, t: (x / t).softmax(-1) * t, backend=_counting_coil(errors, calls))
    x = torch.randn(3, 4)
    for t, n_compiles in ((0.7, 1), (1.3, 2), (2.0, 2), (0.25, 2)):
        torch.testing.assert_close(c(x, t), (x / t).softmax(-1) * t)
        assert len(calls) == n_compiles
    assert errors == []


def test_symbolic_float_dynamic_true_two_shapes_two_values():
    errors, calls = [], []
    torch._dynamo.reset()
    w = torch.randn(4, requires_grad=True)
    f = lambda x, t: (x * w / t).softmax(-1) + 1.0 / t  # noqa: E731
    c = torch.compile(f, backend=_counting_coil(errors, calls), dynamic=True)
    for n in (3, 5):
        before = None
        for t in (0.7, 1.3):
            x = torch.randn(n, 4)
            out, ref = c(x, t), f(x, t)
            torch.testing.assert_close(out, ref)
            (g,) = torch.autograd.grad(out.sum(), w)
            (rg,) = torch.autograd.grad(ref.sum(), w)
            torch.testing.assert_close(g, rg)
            assert before is None or len(calls) == before  # a new value: no recompile
            before = len(calls)
    assert errors == []


def test_layer_norm_dynamic_true():
    """LayerNorm.eps becomes a symbolic float; native_layer_norm takes a C++ double, so
    the trace specializes it (as torch's AOTAutograd does) and the graph compiles."""
    errors, calls = [], []
    torch._dynamo.reset()
    ln = nn.LayerNorm(4)
    c = torch.compile(ln, backend=_counting_coil(errors, calls), dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, 4)
        out, ref = c(x), ln(x)
        torch.testing.assert_close(out, ref)
        gw = torch.autograd.grad(out.sum(), ln.weight)
        rw = torch.autograd.grad(ref.sum(), ln.weight)
        torch.testing.assert_close(gw, rw)
    assert errors == [] and calls


class _RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.variance_epsilon = eps

    def forward(self, h):
        dtype = h.dtype
        h = h.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * h.to(dtype)


def test_hf_rms_norm_dynamic_true_reads_eps_at_each_call(tmp_path):
    """variance + self.variance_epsilon reads the 0-d tensor (event aot_scalar_inputs),
    so a new eps does not recompile; the backward compiles too."""
    errors, calls = [], []
    torch._dynamo.reset()
    m = _RMSNorm(8)
    c = torch.compile(m, backend=_counting_coil(errors, calls), dynamic=True)
    old = trace.trace_dir()
    trace.set_dir(str(tmp_path))
    try:
        for n in (3, 5):
            for eps in (1e-6, 0.5):  # a new eps on the same shape: no recompile
                m.variance_epsilon = eps
                x = torch.randn(n, 8)
                before = len(calls)
                torch.testing.assert_close(c(x), m(x))
                assert eps == 1e-6 or len(calls) == before
        x = torch.randn(3, 8, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        c(x).sum().backward()
        m(xr).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
    finally:
        trace.set_dir(old)
    assert errors == []
    scalars = [e for e in _events(tmp_path) if e["event"] == "aot_scalar_inputs"]
    assert scalars and all(e["tensorized"] == ["aten.add.Tensor"] and e["specialized"] == [] for e in scalars)


def _events(d) -> list:
    return [json.loads(line) for p in d.glob("*.jsonl") for line in p.read_text().splitlines()]


def test_backend_failure_under_torch_compile_is_logged(tmp_path, monkeypatch):
    """torch's capture turns a backend exception into a warning and runs eagerly; the
    compile log must say why (it had only the ``aot`` stage)."""

    def boom(gm, example_inputs):
        raise RuntimeError("no kernels today")

    monkeypatch.setitem(registry._BACKENDS, "coil", boom)
    old = trace.trace_dir()
    trace.set_dir(str(tmp_path))
    try:
        gm = torch.fx.symbolic_trace(lambda x: x + 1)
        try:
            registry.coil_backend_entry(gm, [torch.randn(2)])
        except RuntimeError as e:
            assert "no kernels today" in str(e)
        else:
            raise AssertionError("the entry swallowed the backend's exception")
    finally:
        trace.set_dir(old)
    failed = [e for e in _events(tmp_path) if e["event"] == "backend_failed"]
    assert len(failed) == 1 and failed[0]["backend"] == "coil"
    assert "RuntimeError: no kernels today" in failed[0]["error"] and "boom" in failed[0]["traceback"]


@pytest.mark.parametrize("f", [
    lambda x, t: x * (t * 2 + 1) - t ** 2 + 1.0 / t,     # float arithmetic, in float64
    lambda x, t: x.clamp(min=t),                          # clamp → clamp.Tensor
    lambda x, t: torch.where(x > t, x, t),                # scalar_tensor
    lambda x, t: torch.full_like(x, t) + torch.lerp(x, 2 * x, t),  # full_like, full
    lambda x, t: (x * 4).long() + t,                      # an int tensor: promotes to float
    lambda x, t: x.masked_fill(x > 0, t) + x.pow(t),
    lambda x, t: x.add(x.sin(), alpha=-t),                # p.add_(g, alpha=-lr)
], ids=["arith", "clamp", "where", "full", "int", "masked_fill_pow", "alpha"])
def test_symbolic_float_uses_read_the_tensor(f):
    """Each use of the number reads the 0-d tensor (coil/aot/scalars.py): a second value
    is right and does not recompile."""
    errors, calls = [], []
    torch._dynamo.reset()
    c = torch.compile(f, backend=_counting_coil(errors, calls), dynamic=True)
    x = torch.randn(3, 4).abs() + 0.1
    for t in (0.7, 1.3):
        out, ref = c(x, t), f(x, t)
        assert out.dtype == ref.dtype
        torch.testing.assert_close(out, ref)
    assert errors == [] and len(calls) == 1


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_symbolic_number_outputs_are_evaluated_per_call(backend):
    # torch.compile(backend="coil", dynamic=True) returned the fake SymInt 2*s77 itself
    # (and 2*s77 again for every size) for x.shape[0] * 2; eager returns 10, 14, 6
    def f(x):
        n = x.shape[0]
        return n * 2, x.sin(), n / 3, n // 2, x.numel() - 1

    torch._dynamo.reset()
    c = torch.compile(f, backend=aot_eager if backend == "aot_eager" else "coil", dynamic=True)
    for n in (5, 7, 3, 1, 0):
        x = torch.randn(n, 3, requires_grad=n % 2 == 1)
        out, ref = c(x), f(x)
        assert [type(v) for v in out] == [type(v) for v in ref]
        assert out[0] == ref[0] and out[2:] == ref[2:]
        torch.testing.assert_close(out[1], ref[1])


def test_func_grad_under_torch_capture_is_not_zero():
    # torch's graph of torch.func.grad(f)(x) calls autograd.grad with no enable_grad of its
    # own (grad mode is on at the call); coil traced its inference graph under no_grad and
    # the gradient came out zeros (eager: cos(x), and 2 x^T (x w) for the closure)
    def f(x, w):
        return torch.func.grad(lambda r: r.sin().sum())(x), torch.func.grad(lambda v: (x @ v).pow(2).sum())(w)

    torch._dynamo.reset()
    c = torch.compile(f, backend="coil")
    for n in (3, 3, 5):
        x, w = torch.randn(n, 4), torch.randn(4, 2)
        torch.testing.assert_close(c(x, w), f(x, w))


def test_cond_on_a_symbolic_predicate_under_torch_capture():
    # torch's capture passes cond a symbolic bool (n > 2 for a changing int n; x.shape[0] > 4
    # with dynamic=True): the wrapper's run_cond called .item() on the bool (AttributeError),
    # and in training the min-cut partitioner could not save the SymBool the backward's
    # cond reads (NetworkXUnbounded)
    def f(x, w, n):
        return torch.cond(n > 2, lambda a: a @ w, lambda a: (a * 2) @ w, (x,))

    def g(x, w):
        return torch.cond(x.shape[0] > 4, lambda a: a @ w, lambda a: (a * 2) @ w, (x,))

    for fn, kw in ((f, {}), (g, {"dynamic": True})):
        torch._dynamo.reset()
        c = torch.compile(fn, backend="coil", **kw)
        for n in (3, 6, 2, 8):
            x, w = torch.randn(n, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)
            args = (x, w, n) if fn is f else (x, w)
            out, ref = c(*args), fn(*args)
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(torch.autograd.grad(out.sum(), (x, w)), torch.autograd.grad(ref.sum(), (x, w)))


def test_data_assignment_under_torch_capture_reaches_the_input():
    # torch's graph of x.data = y holds set_(x, y) under no_grad; coil's functionalized program
    # dropped it: x kept its old 3 values (eager: x is y's 4 values), though x * 2 was right
    def f(x, y):
        x.data = y
        return x * 2

    torch._dynamo.reset()
    c = torch.compile(f, backend="coil")
    for _ in range(3):
        x, y = torch.randn(3), torch.randn(4)
        x2 = x.clone()
        torch.testing.assert_close(c(x2, y), f(x, y))
        torch.testing.assert_close(x2, x)


@pytest.mark.parametrize("dropout", [False, True])
def test_checkpoint_body_with_inplace_op_or_dropout_under_torch_capture(dropout):
    # torch's capture holds checkpoint(fn, x, use_reentrant=False) as a tag_activation_checkpoint call of a
    # subgraph; traced as such, eager's checkpoint refused y.add_(1) or dropout: "Tensor cached during
    # selective activation checkpoint has been mutated" (BackendCompilerFailed). It is now inlined and tagged.
    import torch.utils.checkpoint as cp

    def blk(x):
        y = x * 2
        y.add_(1)
        return (torch.nn.functional.dropout(y, 0.5) if dropout else y).sin()

    def f(x):
        return cp.checkpoint(blk, x, use_reentrant=False) * 3

    torch._dynamo.reset()
    c = torch.compile(f, backend="coil", options={"fallback_random": True})
    x = torch.randn(64, requires_grad=True)
    for _ in range(2):
        torch.manual_seed(0)
        ref = f(x)
        (rg,) = torch.autograd.grad(ref.sum(), x)
        torch.manual_seed(0)
        out = c(x)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), x), (rg,))


def test_while_loop_under_torch_capture():
    # torch's while_loop fake kernel needs a ShapeEnv (its trip count is an unbacked size); the fresh fake
    # mode AOT made for real example inputs had none: AttributeError 'NoneType' ... ignore_fresh_unbacked_symbols
    from torch._higher_order_ops import while_loop

    def f(x, lim):
        return while_loop(lambda i, x: x.abs().sum() < lim, lambda i, x: (i + 1, x * 2 + 0.1), (torch.tensor(0), x))

    torch._dynamo.reset()
    c = torch.compile(f, backend="coil")
    for n, lim in ((3, 100.0), (3, 1000.0), (5, 10.0)):
        x, lim = torch.randn(n), torch.tensor(lim)
        torch.testing.assert_close(c(x, lim), f(x, lim))


def test_inference_mode_inside_torch_captured_graph():
    # torch's graph holds _enter/_exit_inference_mode around x * 2; traced to ATen, the output was an ordinary
    # tensor (is_inference() False, eager True), and inference_mode(False) under an outer inference_mode gave
    # an inference tensor. Such a graph runs eagerly (logged).
    def f(x):
        with torch.inference_mode():
            y = x * 2
        return y, x + 1

    def g(x):
        with torch.inference_mode(False):
            return x * 2

    for fn, outer in ((f, False), (g, True)):
        torch._dynamo.reset()
        x = torch.randn(3, requires_grad=not outer)
        with torch.inference_mode(outer):
            x = x.clone() if outer else x
            ref, out = fn(x), torch.compile(fn, backend="coil")(x)
        for o, r in zip(out if fn is f else [out], ref if fn is f else [ref]):
            assert (o.is_inference(), o.requires_grad) == (r.is_inference(), r.requires_grad)
            torch.testing.assert_close(o, r)


@pytest.mark.parametrize("mode, option", [("max-autotune-no-cudagraphs", "autotune"), ("reduce-overhead", "cudagraphs")])
def test_torch_compile_mode_reaches_coils_options(mode, option, monkeypatch):
    """``torch.compile(m, backend="coil", mode=...)`` passes ``mode`` to the backend, which raised
    "coil_backend_entry() got an unexpected keyword argument 'mode'"; it sets options as coil.compile's mode."""
    from coil.config import config
    seen = []

    def record(gm, example_inputs):
        seen.append(getattr(config, option))
        return gm.forward

    monkeypatch.setitem(registry._BACKENDS, "coil", record)
    torch._dynamo.reset()
    x = torch.randn(3)
    torch.testing.assert_close(torch.compile(lambda t: t.sin() + 1, backend="coil", mode=mode)(x), x.sin() + 1)
    assert seen == [True]
    torch._dynamo.reset()
