"""coil.testing: assert_same_as_eager and CompileCounter (issue 2, item 6).

Each check is shown to pass on a correct backend and to fail on a backend broken in
exactly the way that check exists to catch.
"""
import pytest
import torch
import torch.utils._pytree as pytree

import coil
from coil.testing import CompileCounter, assert_same_as_eager


def _tree_map_out(gm, fn):
    """A backend that runs ``gm`` and applies ``fn`` to every tensor it returns."""
    def run(*args):
        return pytree.tree_map(lambda t: fn(t) if isinstance(t, torch.Tensor) else t, gm(*args))
    return run


def wrong_by(delta):
    def backend(gm, example_inputs):
        return _tree_map_out(gm, lambda t: t + delta if t.is_floating_point() else t)
    return backend


def test_passes_for_a_correct_backend_with_pytree_outputs(fake_capture):
    def f(x, n):
        return {"y": x.sin(), "pair": (x.argmax(), n + 1)}

    out = assert_same_as_eager(f, (torch.randn(5), 3), backend="eager")
    assert out["pair"][1] == 4


def test_catches_wrong_values_and_names_the_path(fake_capture):
    def f(x):
        return {"y": x.sin(), "z": x.cos()}

    with pytest.raises(AssertionError, match=r"output\['y'\]"):
        assert_same_as_eager(f, (torch.randn(5),), backend=wrong_by(1e-2))


def test_catches_wrong_dtype_and_shape(fake_capture):
    def to_double(gm, example_inputs):
        return _tree_map_out(gm, lambda t: t.double())

    def flatten(gm, example_inputs):
        return _tree_map_out(gm, lambda t: t.reshape(-1))

    x = torch.randn(2, 3)
    with pytest.raises(AssertionError, match="dtype"):
        assert_same_as_eager(lambda x: x * 2, (x,), backend=to_double)
    with pytest.raises(AssertionError, match="shape"):
        assert_same_as_eager(lambda x: x * 2, (x,), backend=flatten)


def test_strides_of_dims_larger_than_one_are_compared(fake_capture):
    def contiguous(gm, example_inputs):
        return _tree_map_out(gm, lambda t: t.contiguous())

    x = torch.randn(3, 4)
    with pytest.raises(AssertionError, match=r"strides \(3, 1\) != eager's \(1, 4\)"):
        assert_same_as_eager(lambda x: x.t() * 2, (x,), backend=contiguous)
    assert_same_as_eager(lambda x: x.t() * 2, (x,), backend=contiguous, check_strides=False)
    # A size-1 dim's stride (here 4 vs eager's 1) and an empty tensor's strides are not compared.
    assert_same_as_eager(lambda x: (x[:1].t() * 2, x[:0].t() + 1), (x,), backend=contiguous)


def test_strides_of_arguments_after_the_call_are_compared(fake_capture):
    def untransposed(gm, example_inputs):  # runs the graph, then undoes the t_() on the argument
        return lambda x: (gm(x), x.t_())[0]

    with pytest.raises(AssertionError, match=r"args after call\[0\]: strides \(3, 1\) != eager's \(1, 3\)"):
        assert_same_as_eager(lambda x: x.t_().sum(), (torch.randn(3, 3),), backend=untransposed)


@pytest.mark.parametrize("dynamic", [False, True])
def test_scalar_base_pow_is_contiguous_as_eager(dynamic):
    """FINDINGS_77 #2: eager's ``pow(Scalar, Tensor)`` returns a contiguous result; torch's meta kernel kept the
    exponent's layout, so coil's output had other strides and a ``.view(-1)`` eager accepts raised."""
    x = torch.arange(1., 25.).view(4, 6).t()
    for fn in (lambda x: 2 ** x, lambda x: torch.pow(2.5, x), lambda x: torch.float_power(2, x),
               lambda x: (2 ** x).view(-1), lambda x: (2 ** x.unsqueeze(0).permute(2, 0, 1)).view(-1)):
        coil.reset()
        got, want = coil.compile(fn, dynamic=dynamic)(x), fn(x)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()


def test_integer_outputs_must_match_exactly(fake_capture):
    def off_by_one(gm, example_inputs):
        return _tree_map_out(gm, lambda t: t + 1)

    with pytest.raises(AssertionError, match="elements differ"):
        assert_same_as_eager(lambda x: x.argsort(), (torch.randn(6),), backend=off_by_one)


def test_per_dtype_tolerance_and_overrides(fake_capture):
    x = torch.randn(8)
    assert_same_as_eager(lambda x: x * 3, (x,), backend=wrong_by(1e-7))  # fp32 tol
    with pytest.raises(AssertionError):
        assert_same_as_eager(lambda x: x * 3, (x.double(),), backend=wrong_by(1e-5))
    assert_same_as_eager(lambda x: x * 3, (x,), backend=wrong_by(1e-2), atol=0.1, rtol=0)


def test_input_mutation_is_compared(fake_capture):
    def f(x, y):
        x.add_(y)
        return y * 2

    def forgets_mutation(gm, example_inputs):
        return lambda *args: gm(*[a.clone() for a in args])

    args = (torch.randn(4), torch.randn(4))
    saved = [a.clone() for a in args]
    assert_same_as_eager(f, args, backend="eager")
    assert all(torch.equal(a, s) for a, s in zip(args, saved))  # caller's args untouched
    with pytest.raises(AssertionError, match=r"args after call\[0\]"):
        assert_same_as_eager(f, args, backend=forgets_mutation)
    assert_same_as_eager(f, args, backend=forgets_mutation, check_input_mutation=False)


def test_module_buffers_are_compared(fake_capture):
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(3)).train()

    def no_buffer_update(gm, example_inputs):
        def run(x):
            saved = {k: v.clone() for k, v in gm.state_dict().items()}
            out = gm(x)
            gm.load_state_dict(saved)  # undo the running-stat update
            return out
        return run

    x = torch.randn(6, 3)
    assert_same_as_eager(model, (x,), backend="eager")
    with pytest.raises(AssertionError, match="module state"):
        assert_same_as_eager(model, (x,), backend=no_buffer_update)


class _DoubleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        return 2 * g


def test_gradients_are_compared(fake_capture):
    def f(x, w):
        return (x @ w).tanh()

    def bad_grads(gm, example_inputs):
        return _tree_map_out(gm, _DoubleGrad.apply)

    args = (torch.randn(3, 4), torch.randn(4, 2))
    assert_same_as_eager(f, args, backend="eager", check_grads=True)
    assert_same_as_eager(f, args, backend=bad_grads)  # values alone are right
    with pytest.raises(AssertionError, match="grad of"):
        assert_same_as_eager(f, args, backend=bad_grads, check_grads=True)


def test_module_parameter_gradients_are_compared(fake_capture):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU())

    def bad_grads(gm, example_inputs):
        return _tree_map_out(gm, _DoubleGrad.apply)

    x = torch.randn(5, 4)
    assert_same_as_eager(model, (x,), backend="eager", check_grads=True)
    with pytest.raises(AssertionError, match="param 0.weight"):
        assert_same_as_eager(model, (x,), backend=bad_grads, check_grads=True)


def test_rng_seed_is_the_same_for_both_runs(fake_capture):
    def f(x):
        return x + torch.rand_like(x)

    x = torch.randn(10)
    state = torch.get_rng_state()
    assert_same_as_eager(f, (x,), backend="eager")  # fails if the runs draw differently
    assert torch.equal(state, torch.get_rng_state())  # the caller's RNG stream is kept


def test_low_precision_accepts_more_accurate_results(fake_capture):
    """(x + 1000) - 1000 in bf16 rounds to multiples of 4; a backend that computes in
    fp32 is far from eager but closer to the fp32 reference, so it passes."""
    def f(x):
        return (x + 1000) - 1000

    def in_fp32(gm, example_inputs):
        return lambda *args: gm(*[a.float() for a in args]).to(torch.bfloat16)

    x = torch.randn(64).to(torch.bfloat16)
    eager = f(x)
    assert (in_fp32(torch.fx.symbolic_trace(f), [x])(x) - eager).abs().max() > 0.5
    assert_same_as_eager(f, (x,), backend=in_fp32)


def test_low_precision_rejects_worse_results(fake_capture):
    def f(x):
        return x * 2

    x = torch.randn(64).to(torch.float16)
    with pytest.raises(AssertionError, match="fp32 reference"):
        assert_same_as_eager(f, (x,), backend=wrong_by(0.05))
    assert_same_as_eager(f, (x,), backend="eager")


def test_compile_counter_counts_graphs_and_ops():
    cnt = CompileCounter()
    gm = torch.fx.symbolic_trace(lambda x: (x.sin() + 1).relu())
    x = torch.randn(4)
    run = cnt(gm, [x])
    torch.testing.assert_close(run(x), (x.sin() + 1).relu())
    cnt(gm, [x])
    assert (cnt.frame_count, cnt.op_count, len(cnt.graphs)) == (2, 6, 2)
    cnt.clear()
    assert (cnt.frame_count, cnt.op_count, cnt.graphs) == (0, 0, [])


def test_compile_counter_is_a_torch_compile_backend():
    import torch._dynamo

    torch._dynamo.reset()
    cnt = CompileCounter()

    def f(x):
        return x.cos() * 2

    x = torch.randn(3)
    torch.testing.assert_close(torch.compile(f, backend=cnt)(x), f(x))
    assert cnt.frame_count == 1 and cnt.op_count == 2
