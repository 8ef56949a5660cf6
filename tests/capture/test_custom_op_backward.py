"""A custom op (``torch.library.custom_op`` + ``register_autograd``) whose backward cannot run
on fake tensors (transformers' grouped-mm fallback loops over ``offs.tolist()``): AOT's joint
trace failed and the whole compile raised BackendCompilerFailed where eager runs. Capture now
runs the registered backward once on the fake values. When it cannot, a ``custom_op``'s formula
runs eagerly inside the compiled backward (coil.capture.opaque_autograd: one graph); an op made
with ``torch.library.define`` is a graph break and runs eagerly with its own backward."""
import pytest
import torch

import coil


@torch.library.custom_op("coil_test::grouped_mm", mutates_args=())
def grouped_mm(inp: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    out = inp.new_zeros(inp.size(0), weight.size(2))
    start = 0
    for i, end in enumerate(offs.tolist()):
        out[start:end] = inp[start:end] @ weight[i]
        start = end
    return out


@grouped_mm.register_fake
def _(inp, weight, offs):
    return inp.new_empty(inp.size(0), weight.size(2))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


def _backward(ctx, grad):
    inp, weight = ctx.saved_tensors
    gi, gw = torch.zeros_like(inp), torch.zeros_like(weight)
    start = 0
    for i, end in enumerate(ctx.offs.tolist()):    # data-dependent: no fake run
        gi[start:end] = grad[start:end] @ weight[i].T
        gw[i] = inp[start:end].T @ grad[start:end]
        start = end
    return gi, gw, None


torch.library.register_autograd("coil_test::grouped_mm", _backward, setup_context=_setup)

# the same op made with torch.library.define + register_autograd: no CustomOpDef holds its formula (the compile
# raised BackendCompilerFailed: DataDependentOutputException in AOT's joint trace)
torch.library.define("coil_test::grouped_mm_def", "(Tensor inp, Tensor weight, Tensor offs) -> Tensor")
torch.library.impl("coil_test::grouped_mm_def", "CompositeExplicitAutograd", grouped_mm._init_fn)
torch.library.register_fake("coil_test::grouped_mm_def", lambda inp, weight, offs: inp.new_empty(
    inp.size(0), weight.size(2)))
torch.library.register_autograd("coil_test::grouped_mm_def", _backward, setup_context=_setup)


@pytest.mark.parametrize("call", ["def", "packet", "overload", "library_define"])
def test_untraceable_custom_backward_runs_eagerly_with_grads_equal_to_eager(call):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    w = torch.randn(3, 8, 4, requires_grad=True)
    op = {"def": grouped_mm, "packet": torch.ops.coil_test.grouped_mm,
          "overload": torch.ops.coil_test.grouped_mm.default,
          "library_define": torch.ops.coil_test.grouped_mm_def}[call]

    def f(x, offs):
        return (op(lin(x).relu(), w, offs) * 2).sin().sum()

    x, offs = torch.randn(10, 8), torch.tensor([3, 7, 10])
    want = f(x, offs)
    want.backward()
    grads = [w.grad.clone(), lin.weight.grad.clone()]
    w.grad = lin.weight.grad = None
    got = coil.compile(f)(x, offs)
    got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(w.grad, grads[0])
    torch.testing.assert_close(lin.weight.grad, grads[1])
    ex = coil.explain(f, x, offs)
    assert (ex.graph_count, ex.graph_break_count) == ((2, 1) if call == "library_define" else (1, 0)), ex


@torch.library.custom_op("coil_test::split_scale", mutates_args=())
def split_scale(x: torch.Tensor, n: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    a = x * scale
    a[int(n):] = 0
    return a, x * 2


@split_scale.register_fake
def _(x, n, scale=1.0):
    return torch.empty_like(x), torch.empty_like(x)


BACKWARD_CALLS = []


def _ss_setup(ctx, inputs, output):
    ctx.n, ctx.scale = inputs[1], inputs[2]


def _ss_backward(ctx, ga, gb):
    BACKWARD_CALLS.append(1)                 # a side effect: once per backward, as in eager
    k = int(ctx.n)                           # data-dependent
    g = (ga * ctx.scale).index_fill(0, torch.arange(k, ga.size(0)), 0).double() + gb * 2  # autograd casts it back
    return g.t().contiguous().t() if g.dim() == 2 else g, None, None   # a layout unlike the input's


split_scale.register_autograd(_ss_backward, setup_context=_ss_setup)


def test_eager_formula_with_two_outputs_defaults_side_effects_and_foreign_layout():
    def f(x, n):
        a, b = split_scale(x.exp(), n, scale=3.0)
        return (a.sum(0) + b.sum(0)).sin()

    torch.manual_seed(0)
    x, n = torch.randn(6, 5, requires_grad=True), torch.tensor(2)
    want = f(x, n)
    want.sum().backward()
    gx, x.grad = x.grad.clone(), None
    BACKWARD_CALLS.clear()
    cf = coil.compile(f)
    got = cf(x, n)
    got.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, gx, rtol=1e-4, atol=1e-4)     # (exp's gradient, fused: fp32 rounding)
    assert x.grad.dtype == torch.float32 and x.grad.stride() == (5, 1)
    assert BACKWARD_CALLS == [1]
    ex = coil.explain(f, x, n)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex


def test_custom_op_without_grad_stays_in_the_graph():
    w = torch.randn(3, 8, 4)
    calls = []

    def counting(gm, example_inputs):
        calls.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    def f(x, offs):
        return grouped_mm(x.relu(), w, offs) * 2

    x, offs = torch.randn(10, 8), torch.tensor([3, 7, 10])
    torch.testing.assert_close(coil.compile(f, backend=counting)(x, offs), f(x, offs))
    assert len(calls) == 1 and any("grouped_mm" in t for t in calls[0]), calls

