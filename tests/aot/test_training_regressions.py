"""Training-step regressions found by fresh users: gradients as eager gives them, over several
backward passes (accumulation) and in-place gradient updates."""
import copy
import math
import warnings

import pytest
import torch

import coil
from coil.bench.fuzz import check

BACKENDS = ["cpp", "triton"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_of_two_inputs_do_not_share_memory(backend):
    """``x + a + b``: the compiled backward returns the tangent as the gradient of both ``a`` and
    ``b``; autograd kept it as both ``.grad`` tensors, so the second backward accumulated into
    one memory twice (a.grad 6 instead of 4). Overlapping gradients are now cloned."""
    def f(x, a, b):
        return x + a + b

    grads = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        a, b = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
        for _ in range(2):
            fn(torch.ones(2, 3), a, b).sum().backward()
        assert a.grad.data_ptr() != b.grad.data_ptr()
        grads.append((a.grad, b.grad))
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clip_grad_norm_after_a_compiled_lstm_cell(backend):
    """LSTMCell's bias_ih and bias_hh get one gradient buffer from the compiled backward;
    clip_grad_norm_ scaled it in place once per parameter (0.0055 became 0.0001)."""
    torch.manual_seed(0)
    m = torch.nn.LSTMCell(4, 2)
    mc = copy.deepcopy(m)
    cm = coil.compile(mc, options={"cpu_backend": backend})
    x = torch.randn(3, 4)
    for mod, fn in ((m, m), (mc, cm)):
        sum(t.sum() for t in fn(x)).backward()
        torch.nn.utils.clip_grad_norm_(mod.parameters(), 0.1)
    for p, q in zip(m.parameters(), mc.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)


def test_split_gradients_may_share_storage_without_overlap():
    """Gradients that are disjoint views of one buffer (a cat's backward) are kept as they are,
    as eager keeps them; accumulation into each stays separate."""
    def f(a, b):
        return torch.cat([a, b]) * 2

    ref = []
    for fn in (f, coil.compile(f)):
        a, b = torch.ones(3, requires_grad=True), torch.ones(2, requires_grad=True)
        for _ in range(3):
            fn(a, b).sum().backward()
        ref.append((a.grad.clone(), b.grad.clone()))
    torch.testing.assert_close(ref[1], ref[0], rtol=0, atol=0)


@pytest.mark.parametrize("capture", ["coil", "torch"])
def test_in_place_write_to_a_saved_output_fails_at_backward_as_in_eager(capture):
    """``y = x.exp(); y.add_(1)`` with x requiring grad: eager runs the forward and raises only at
    backward (exp's saved result was modified); tracing the joint graph raised that at compile time, so a
    forward-only call failed (BackendCompilerFailed). It now runs eagerly (logged)."""
    import torch._dynamo

    def f(x):
        y = x.exp()
        y.add_(1)
        return y

    torch._dynamo.reset()
    c = coil.compile(f) if capture == "coil" else torch.compile(f, backend="coil")
    x = torch.randn(4, requires_grad=True)
    out = c(x)
    torch.testing.assert_close(out, f(x))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_output_the_loss_does_not_use_adds_no_nan(backend):
    """``(x * 2, x.sqrt())`` of ``x = 0`` with the loss on the first output: the backward got zeros
    for the unused output's tangent and computed ``2 + 0 * inf``: x.grad NaN (eager: 2; torch's
    aot_eager and inductor give NaN too). Found by the gradient fuzzer (seed 1000 #139)."""
    def f(x, w):
        return x * 2, x.sqrt(), x * w

    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        x, w = torch.zeros(3, requires_grad=True), torch.ones(3, requires_grad=True)
        fn(x, w)[0].sum().backward()
        torch.testing.assert_close(x.grad, torch.full((3,), 2.0), rtol=0, atol=0)
        assert w.grad is None  # reached only through an unused output (was zeros: a documented sharp edge)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_written_in_place_and_not_used_gets_no_gradient(backend):
    """A non-leaf input written in place (``b.mul_(s)``) that nothing reads afterwards: its leaf's grad
    was zeros (NaN for ``s = inf``: ``0 * inf``), eager's None; a leaf also reached by a used output
    got ``2 + 0 * inf``. Found by the gradient fuzzer (seed 1000 #79, #139; seed 1001 #43)."""
    def f(x, b, s):
        y = x * 2
        x.mul_(s)
        b.mul_(s)
        return y

    grads = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        x, b = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
        fn(x.clone(), b.clone(), torch.tensor([1.0, float("inf"), 2.0])).sum().backward()
        grads.append((x.grad, b.grad))
    assert grads[1][1] is None and grads[0][1] is None
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_of_a_view_of_an_expanded_input(backend):
    """``a[..., -2:]`` of ``a = t.expand(5, 4)`` (one element of memory) that requires grad: the output,
    rebuilt as ``as_strided`` of the input, differentiated the storage: every element of a.grad was the
    mean of the cotangent (2.25; eager: the cotangent in the last two columns, zeros elsewhere). Found by
    the gradient fuzzer (seed 1001 #32). The output is still a view of the input."""
    def f(a):
        return a[..., -2:]

    grads = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        a = torch.tensor([[-3.0]]).expand(5, 4).detach().requires_grad_()
        out = fn(a)
        assert out.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
        out.backward(torch.arange(10.0).view(5, 2))
        grads.append(a.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def _view_before_unsqueeze_(a, c):
    v0 = a[0::2]
    a.unsqueeze_(0)
    return (torch.std(v0, dim=0, keepdim=True),)


def _view_before_squeeze_(a, c):
    v4 = a.squeeze(1)
    a.squeeze_(-2)
    return (a * 2, v4)


def _split_after_squeeze_(a, c):
    a.squeeze_(0)
    return (torch.split(a, [2, 4], 0)[1],)


def _as_strided_after_a_write_reading_it(a, c):
    c.mul_(a)
    a.as_strided_((2,), (0,), 0)
    return (c.detach() * 2,)  # (eager's backward through c would raise: a changed after c.mul_ saved it)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,shape", [(_view_before_unsqueeze_, (3,)), (_view_before_squeeze_, (1, 1)),
                                      (_split_after_squeeze_, (6,)), (_as_strided_after_a_write_reading_it, ())])
def test_metadata_mutation_of_an_input_that_requires_grad(fn, shape, backend):
    """A non-leaf input that requires grad whose metadata the program changes (``unsqueeze_``, ``squeeze_``,
    ``as_strided_``), with a view of it taken before, a ``split`` after, or a write that saved it for backward: the
    joint trace regenerated the views in the new layout ("StdBackward0 returned an invalid gradient", IndexError)
    or met the write's version check, or the backward refused the split's view ("its base ... has been modified
    inplace"), where eager runs. Such programs run eagerly now (``aot_restrided_grad_eager``). Found by the gradient
    fuzzer (seed 1003 #154, #875, #524; seed 1004 #3)."""
    res = []
    for f in (fn, coil.compile(fn, options={"cpu_backend": backend})):
        leaves = [torch.arange(1.0, 1.0 + math.prod(shape)).reshape(shape).requires_grad_() for _ in range(2)]
        a, c = (x.clone() for x in leaves)
        outs = f(a, c)
        diff = [o for o in outs if o.requires_grad]
        if diff:
            torch.autograd.backward(diff, [torch.ones_like(o) for o in diff])
        res.append(([o.detach() for o in outs], a.shape, [x.grad for x in leaves]))
    torch.testing.assert_close(res[1], res[0], rtol=0, atol=0)


def _read_before_a_no_op_squeeze_(b):
    v0 = torch.tanh(b)
    b.squeeze_()
    return (v0, torch.expm1(b))


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
@pytest.mark.parametrize("unseen", [False, True], ids=["analysed", "unseen-by-the-analysis"])
def test_read_before_a_no_op_squeeze_under_dynamic_shapes(backend, unseen, monkeypatch):
    """``v0 = tanh(b); b.squeeze_()`` of a non-leaf ``b`` that requires grad with no size-1 dim, under
    ``dynamic=True``: the symbolic ``squeeze_`` rewrite returned ``b`` without dispatching, so the analysis saw no
    restride, while autograd had rebased ``b``'s history; the joint trace took the gradient w.r.t. the squeezed
    ``b`` and dropped ``tanh``'s (float64 gradients wrong; gradient fuzzer s319 #989). ``unseen``: the rewrite as it
    was; the joint trace notices the rebased input itself and the program runs eagerly."""
    import coil.aot.functional as functional
    if unseen:
        monkeypatch.setattr(functional, "_squeeze_", lambda func, t, *dims: t)
    res = []
    for f in (_read_before_a_no_op_squeeze_, coil.compile(_read_before_a_no_op_squeeze_, dynamic=True,
                                                           backend=backend)):
        leaf = torch.tensor([[0.5, -1.25, 2.0], [0.25, 3.0, -0.75]], dtype=torch.float64, requires_grad=True)
        b = leaf.clone()
        outs = f(b)
        torch.autograd.backward(outs, [torch.full_like(o, 0.75) for o in outs])
        res.append(([o.detach() for o in outs], b.shape, leaf.grad))
    torch.testing.assert_close(res[1], res[0], rtol=1e-13, atol=0)


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_an_invalid_gradient_the_outputs_never_reach(backend):
    """``a.copy_(scatter(a, 0, index, a))`` with ``src`` larger than ``index``: scatter's backward gives ``src`` a
    gradient of the index's shape, which autograd refuses ("returned an invalid gradient"), eager only if a backward
    reaches it; the joint trace differentiates ``a``'s new value and failed the compile. It runs eagerly now (as
    for the version check). Found by the gradient fuzzer (s1035 #1689)."""
    def f(a, b):
        a.copy_(torch.scatter(a, 0, torch.tensor([[0, 0]]), a))
        return (b * 2,)

    res = []
    for fn in (f, coil.compile(f, backend=backend)):
        leaf, b = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True), torch.tensor(-1.0, requires_grad=True)
        a = leaf.clone()
        fn(a, b)[0].backward()
        res.append((a.detach(), b.grad))
    torch.testing.assert_close(res[1], res[0], rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_through_as_strided_of_a_non_contiguous_input_that_requires_grad(backend):
    """``c.as_strided((1, 1), (0, 2), 7).div_(2)`` of a transposed non-leaf ``c`` that requires grad: replaying
    the write under autograd hit torch's "as_strided_scatter is currently only supported for contiguous inputs"
    (an internal assert), where eager runs. Such a program runs eagerly (``aot_overlapping_write_eager``). Found by
    the gradient fuzzer (seed 1003 #733)."""
    def f(c):
        c.as_strided((1, 1), (0, 2), 7).div_(2)
        return (c * 1,)

    res = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        leaf = torch.arange(12.0).requires_grad_()
        c = leaf.clone().as_strided((2, 6), (1, 2))
        fn(c)[0].sum().backward()
        res.append((c.detach(), leaf.grad))
    torch.testing.assert_close(res[1], res[0], rtol=0, atol=0)


def test_write_through_a_view_of_an_overlapping_view_runs_eagerly():
    """``x.unfold(0, 3, 1)[0].add_(1)``: the select is not overlapping, its unfold base is; functionalization bans
    the write ("mutated that has internal overlap") and the compile failed where eager runs. The program runs
    eagerly (``aot_overlapping_write_eager``)."""
    def f(x, w):
        y = x * w
        y.unfold(0, 3, 1)[0].add_(1)
        return y.sum(), x.unfold(0, 2, 1)[1].mul_(3)

    w = torch.randn(6)
    leaves = [torch.randn(6, generator=torch.Generator().manual_seed(0), requires_grad=True) for _ in range(2)]
    want, got = f(leaves[0].clone(), w), coil.compile(f)(leaves[1].clone(), w)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    want[0].backward(), got[0].backward()
    torch.testing.assert_close(leaves[1].grad, leaves[0].grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_restrided_then_saved_for_backward(backend):
    """``a.squeeze_()`` of a bool input, then ``remainder(c, a)``, which saves ``a`` for its backward: the partitioner
    saved the input itself, the epilogue's ``as_strided_`` (the squeeze replayed on the caller's tensor) bumped its
    version, and the backward raised "modified by an inplace operation" where eager runs. A restrided input is saved
    as a copy, as a written one is. Found by the gradient fuzzer (seed 1005 #348), checked the way it checks."""
    def f(a, c):
        a.squeeze_()
        v5 = torch.abs(torch.remainder(c, a))
        return (v5, torch.min(c, dim=-2)[0])

    def make_inputs():
        return [torch.tensor(False), torch.tensor([-1.6405979, 0.3037467, -2.6083932, 0.45933223, -0.4596398]).expand(5, 5)]
    r = check(f, make_inputs, backend + "+grad")
    assert r.outcome == "ok", r


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_constant_gradient_beside_an_unused_written_input(backend):
    """``copysign(x, b)`` then ``b.mul_(2)`` of a non-leaf ``b``, the loss on the copysign: its gradient for ``b`` is a
    constant (``zeros_like(b)``) added to the written ``b``'s own, undefined one; the backward variant for the missing
    tangent dropped the sum and gave None (eager: zeros). Found by the gradient fuzzer (seed 1007 #740)."""
    def f(x, b):
        v0 = torch.copysign(x, b)
        b.mul_(2)
        return (v0,)

    grads = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        leaf = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
        fn(torch.tensor([-1.0, 2.0, 0.5]), leaf.clone())[0].sum().backward()
        grads.append(leaf.grad)
    assert grads[1] is not None
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_layer_norm_backward_reads_its_statistics_as_floats(backend, dtype):
    """Gradient fuzzer s1011 #422: ``layer_norm(b, (6,), b)`` of fp16 values near -2.5e4. On the CPU the forward
    saves mean and rstd in the input's dtype, as ATen does; torch's decomposition of the backward then took
    ``rstd / N`` in fp16 (b's grad 2 ulps from eager's: 1.290 for 1.293, -2.248 for -2.252). ATen's kernel reads the
    statistics as floats, and so does coil's decomposition now."""
    def f(b):
        return torch.nn.functional.layer_norm(b, (6,), b)

    dy = torch.tensor([0.5625, -0.3125, 0.9375, -0.6875, 0.8125, -0.0625], dtype=dtype)
    grads = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        b = torch.tensor([1.0, -2.52e4, 1.0, -0.9717, -2.734e4, -2.405e4], dtype=dtype, requires_grad=True)
        fn(b).backward(dy)
        grads.append(b.grad)
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_of_a_power_by_a_bool_tensor_raises_as_eager(backend):
    """Gradient fuzzer s1012 #405: the backward of ``d ** a`` with a bool ``a`` computes ``a - 1``, which eager
    refuses ("Subtraction, the `-` operator, with a bool tensor is not supported"); the fake tensors of the joint
    trace do not check it, and coil's kernel subtracted (d.grad 0.5). A bool ``sub`` runs as the ATen op."""
    def f(a, d):
        return d ** a

    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        d = torch.tensor(-0.0, requires_grad=True)
        with pytest.raises(RuntimeError, match="with a bool tensor is not supported"):
            fn(torch.tensor(True), d).backward(torch.tensor(0.5))


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_dividing_by_a_symbolic_zero_runs_eagerly(backend):
    """Gradient fuzzer s1006 #112: the backward of ``var(x, -1, correction=2)`` of 2 elements under ``dynamic=True``
    divides by ``n - 2``, 0 at the example's sizes: the joint trace raised ZeroDivisionError at compile time, eager
    gives inf gradients. Such a graph runs eagerly (logged ``aot_backward_error_eager``)."""
    def f(x):
        return x.var(dim=-1, correction=2)

    grads = []
    for fn in (f, coil.compile(f, dynamic=True, options={"cpu_backend": backend})):
        x = torch.tensor([[1.0, 2.0], [3.0, 5.0]], requires_grad=True)
        with pytest.warns(UserWarning, match="degrees of freedom"):
            fn(x).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["min", "max", "median", "amax"])
def test_backward_of_a_full_min_with_an_infinite_gradient(backend, op):
    """Gradient fuzzer s1004 #188: ``min(x) * inf``: eager's CPU backward of a full ``min``/``max``/``median`` fills
    zeros beside the chosen elements, the traced formula multiplied them by ``inf / count``: NaN (x.grad
    [nan, nan, inf] for eager's [0, 0, inf]). ``amax``'s backward multiplies in eager too: NaN stays there."""
    def f(x, y):
        return getattr(torch, op)(x) * y

    grads = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        x = torch.tensor([[1.0, 2.0, -1.0]], requires_grad=True)
        fn(x, torch.tensor(math.inf)).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0], equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_view_of_an_input_written_differentiably_is_returned_over_its_memory(backend):
    """Gradient fuzzer s1015 #155: ``v = b.view(torch.float16)`` of a bf16 ``b`` that requires grad is not an autograd
    view; ``v.div_(b.sum())`` makes it require grad, and eager returns it over b's memory. coil computed it as a
    graph output (to give it a grad_fn) and returned a copy: a later write to it did not reach ``b``. The runtime
    now points the computed tensor at the input's storage."""
    def f(b):
        v = b.view(torch.float16)
        v.div_(b.sum(dtype=torch.float32).expand(6).to(torch.float16))
        return v

    res = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        b = torch.ones(6, dtype=torch.bfloat16, requires_grad=True)
        out = fn(b)
        assert out.requires_grad and out.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        out.float().sum().backward()
        res.append((out.detach().clone(), b.detach().clone(), b.grad))
    torch.testing.assert_close(res[1], res[0])


def _dtype_round_trip_written(a):  # gradient fuzzer s1037 #1355
    v = a.view(torch.int32).view(torch.float32)
    v.add_(torch.floor(a))
    return v, a * 2


def _detached_written(a, b):
    d = a.detach()
    d.mul_(b)
    return d, a * 2


def _view_of_detached_written(a, b):
    d = a.detach()[1:]
    d.mul_(b)
    return d, a * 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("f", [_dtype_round_trip_written, _detached_written, _view_of_detached_written])
def test_input_written_through_no_autograd_view_of_it(backend, f):
    """Gradient fuzzer s1037 #1355: ``a.view(torch.int32).view(torch.float32)`` is no autograd view of ``a`` (nor is
    ``a.detach()``); ``add_(floor(a))`` gives it a history of its own, floor's zero gradient, and leaves a's as it
    was. coil returned it as a differentiable view of ``a`` (a's gradient got its cotangent: 0.4375 for 0) and, for
    ``detach``, replayed the write with autograd (a's history replaced, b's gradient lost: the value returned twice
    by the forward was marked non-differentiable). Such an output is computed with its own gradient over a's
    memory, and a write autograd never saw is replayed untracked."""
    res = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        leaf = torch.tensor([1.5, -2.0, 3.25], requires_grad=True)
        b = torch.tensor([3.0], requires_grad=True)
        a = leaf.clone()
        outs = fn(a) if f is _dtype_round_trip_written else fn(a, b)
        assert outs[0].requires_grad and outs[0].untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
        torch.autograd.backward(outs, [torch.tensor([0.4375, -0.25, 0.5])[-len(outs[0]):], torch.full((3,), 0.75)])
        res.append((outs[0].detach(), a.detach(), leaf.grad, b.grad))
    torch.testing.assert_close(res[1], res[0], rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_written_through_a_dtype_view_then_saved_for_backward(backend):
    """Gradient fuzzer s1044 #112: ``v1 = b.squeeze().view(torch.bfloat16); v1.add_(c.bfloat16())``, then
    ``max_pool1d(b.reshape(1, 1, -1), 1)``: the forward saved a view of b's new value (max_pool's input), and the
    ``set_`` that puts ``v1`` over b's memory bumped the version counter it shares with it: the backward raised
    "modified by an inplace operation". ``set_`` writes no value; the version stays."""
    def f(b, c):
        v1 = b.squeeze().view(torch.bfloat16)
        v1.add_(c.to(torch.bfloat16))
        return v1, torch.nn.functional.max_pool1d(b.reshape(1, 1, -1), 1, stride=2)

    res = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        b, c = torch.tensor(1.0, dtype=torch.float16, requires_grad=True), torch.tensor(1.0, requires_grad=True)
        outs = fn(b, c)
        torch.autograd.backward(outs, [torch.tensor(0.5, dtype=torch.bfloat16), torch.full((1, 1, 1), 0.75).half()])
        res.append((outs[0].detach(), outs[1].detach(), b.detach(), b.grad, c.grad))
    torch.testing.assert_close(res[1], res[0], rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_piece_returned_after_its_base_was_written_raises_eagers_error(backend):
    """Gradient fuzzer s1046 #65: ``v1, v2 = torch.split(b, [4, 2]); b.view(torch.int64)[:, 0:] = 2; return v2`` with
    b a view that requires grad: autograd refuses v2's history once its base was written after it ("Output 1 of
    SplitWithSizes is a view and its base ... has been modified inplace") where the caller reads it; the compiled
    graph returned a fresh view and its gradient. Such a program runs eagerly (warned), raising eager's error."""
    def f(b):
        v1, v2 = torch.split(b, [4, 2], 0)
        b.view(torch.int64)[:, 0:] = 2
        return v2

    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        b = torch.ones(6, 1, dtype=torch.float64, requires_grad=True).clone()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = fn(b)
        assert fn is f or any("runs eagerly" in str(w.message) for w in seen)
        with pytest.raises(RuntimeError, match="SplitWithSizes is a view and its base"):
            out.sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_of_an_in_place_op_through_an_identity_expand(backend):
    """Gradient fuzzer s1016 #102: ``b.expand(-1).relu_()`` at b = 0, then ``remainder(b, nan) % b``: autograd
    writes relu's gradient through the expand in the backward, which functionalization wrote back as
    ``base + (new - base)``: NaN - NaN where eager's gradient is 0. The backward's views are re-expressed as the
    forward's are (the identity expand an alias)."""
    def f(b):
        b.expand(-1).relu_()
        v2 = torch.remainder(b, torch.nan)
        return v2, v2 % b

    grads = []
    for fn in (f, coil.compile(f, options={"cpu_backend": backend})):
        leaf = torch.tensor([0.0], requires_grad=True)
        torch.autograd.backward(fn(leaf.clone()), [torch.tensor([0.5]), torch.tensor([0.25])])
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0], equal_nan=True)


def _view_before_squeeze_of_an_input(a):
    v1 = a.transpose(-1, -2)
    a.squeeze_()
    return torch.var(v1, correction=0)


def _view_before_squeeze_of_an_intermediate(a):
    y = a * 2
    v1 = y.transpose(-1, -2)
    y.squeeze_()
    return torch.var(v1, correction=0) + y


@pytest.mark.parametrize("fn", [_view_before_squeeze_of_an_input, _view_before_squeeze_of_an_intermediate])
def test_view_taken_before_squeeze_of_a_tensor_that_requires_grad(fn):
    """Gradient fuzzer s1016 #980: ``a.transpose(-1, -2)``, then ``a.squeeze_()`` of a (1, 1) tensor that requires grad
    (an input: a view of a clone of a leaf; or an intermediate), then ``var`` of the transpose: autograd rebuilt the
    transpose under functionalization by replaying it on the squeezed tensor (IndexError, BackendCompilerFailed). Such a
    program runs eagerly now; values, shapes and gradients are eager's."""
    res = []
    for f in (fn, coil.compile(fn)):
        leaf = torch.tensor([3.0], requires_grad=True)
        x = leaf.clone().as_strided((1, 1), (1, 1), 0)
        out = f(x)
        out.backward()
        res.append((out.detach(), x.shape, leaf.grad))
    torch.testing.assert_close(res[1], res[0])


@pytest.mark.parametrize("backend", BACKENDS + ["cpp_dynamic"])
def test_an_input_written_after_the_graph_is_not_saved_for_its_cast(backend):
    """``v0.mul_(b.expand(1, 1).to(torch.float32))`` with a bool ``b``, then ``b[b] = False`` (a graph break): eager's
    ``mul`` saved the float cast; the min cut saved ``b``'s view instead (one byte, the cast recomputed), the write
    bumped its version, and the backward raised "modified by an inplace operation". An input that does not require
    grad is saved only where nothing computed from it can be (gradient fuzzer s1029 #176)."""
    def f(a, b):
        v0 = a.reshape(1, -1)
        v0.mul_(b.expand((1, 1)).to(torch.float32))
        b[b] = False
        return (torch.topk(v0, 0, 1, largest=False, sorted=True).values,)
    r = check(f, lambda: [torch.tensor(1.0), torch.tensor(False)], backend + "+grad")
    assert r.outcome == "ok", r


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_output_view_of_a_compiled_buffer_is_writable(backend):
    """``(x @ w).t()`` from a graph that requires grad: the compiled forward returns it as a view of the mm's buffer
    (the FX interpreter as ``t`` of it), and a custom Function's view output may not be written in place ("Output 0 of
    CompiledFunction is a view and is being modified inplace"); eager's may. The forward's view outputs are tensors
    of their own now (``_unsafe_view``, as torch's AOT autograd does)."""
    def f(x, w):
        return (x @ w).t()

    x, w, g = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5, 3)
    res = []
    for fn in (f, coil.compile(f, backend=backend)):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(a, b)
        out.mul_(2)
        out.backward(g)
        res.append((out.detach(), a.grad, b.grad))
    torch.testing.assert_close(res[1], res[0])


def test_output_view_of_a_saved_buffer_is_a_copy():
    """``y = x @ w`` saved for ``y * s``'s backward and returned as ``y.t()``: the compiled forward's output and its
    saved tensor are one buffer, so the caller's write to the output (under no_grad) would reach the backward
    through it; the output is a copy then. Eager's backward raises its version check here, and so does coil's
    (``OutputInfo.saved``: the runtime compares the output's version; tests/user_reports/test_user_reports_66b.py)."""
    def f(x, w, s):
        y = x @ w
        return y.t(), y * s

    x, w, s = torch.randn(3, 4), torch.randn(4, 5), torch.randn(())
    for fn in (f, coil.compile(f)):
        a, b, c = (t.clone().requires_grad_() for t in (x, w, s))
        out = fn(a, b, c)
        with torch.no_grad():
            out[0].fill_(100.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out[1].sum().backward()


def test_output_view_of_an_input_stays_a_view_of_it():
    """s1036 #360: ``torch.split`` of an expanded input that requires grad: the graph returns the pieces as views of
    the input (eager's are), and making every view output a tensor of its own (above) lost that (out-alias)."""
    def fn(a):
        v1, v2 = torch.split(a, [1, 1], 0)
        return torch.stack([a, a], 2), v1, v2

    def make_inputs():
        return [torch.tensor([[-2.35, 1.875, -0.6875, 4.25, -0.0625, 4.0]]).expand(2, 6)]
    r = check(fn, make_inputs, "cpp+grad")
    assert r.outcome == "ok", (r.kind, r.detail)


def test_missing_derivative_only_the_joint_trace_meets_runs_eagerly():
    """s321 #256: ``floor_divide(a, 7)`` written into an empty slice of a view of ``a`` (a view of a leaf), nothing
    returned: eager never runs a backward, the joint trace differentiates ``a``'s new value and met floor_divide's
    missing derivative, and the compile failed. Like the version check, that error makes the program run eagerly."""
    def fn(a):
        v0 = torch.floor_divide(a, 7)
        v1 = a.view(1, -1)
        v1[:, 1:] = v0.expand((1, 0))
        return ()

    r = check(fn, lambda: [torch.tensor(1.0)], "cpp_dynamic+grad", grad_key=82192693)
    assert r.outcome == "ok", (r.kind, r.detail)


def test_a_graph_run_eagerly_is_warned_and_counted(tmp_path):
    """A graph AOT cannot compile (here its backward is refused: ``exp``'s saved output is written in place) runs
    eagerly on every call: the user gets a warning naming why, and the compile log an ``eager_fallback`` event (the
    report's fallbacks column)."""
    import json

    import coil
    from coil import trace

    def f(x):
        y = x.exp()
        y.add_(1)
        return y

    x = torch.randn(3, requires_grad=True)
    trace.set_dir(str(tmp_path))
    try:
        with pytest.warns(UserWarning, match="runs eagerly on every call"):
            out = coil.compile(f)(x)
    finally:
        trace.set_dir(None)
    assert torch.equal(out, f(x))
    events = [json.loads(ln).get("event") for p in tmp_path.glob("*.jsonl") for ln in open(p)]
    assert "eager_fallback" in events


def test_an_input_without_gradient_is_not_differentiated():
    """s1038 #195: a graph break's local ``v = b // 2`` is an input of the next graph, which never reads it: eager's
    backward never reaches ``v``'s history, the compiled one gave autograd an edge to it and ran floor_divide's
    missing derivative ("not implemented"). An input that gets no gradient enters the autograd node detached."""
    def f(a, b):
        v = b // 2
        print(end="")  # a graph break: v is an input of the second graph
        return a * 2, v

    for fn in (f, coil.compile(f)):
        a, b = torch.ones(2, requires_grad=True), torch.ones(1, requires_grad=True)
        fn(a, b)[0].sum().backward()
        assert a.grad.tolist() == [2.0, 2.0] and b.grad is None


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_a_non_leaf_input_written_after_the_graph_is_not_saved_for_min_dim(backend):
    """``v1, _ = torch.min(b, dim=-1, keepdim=True)``, a graph break, then ``b[b > 0] = 1`` on a non-leaf 0-d ``b``:
    eager's ``min`` saves its indices (8 bytes), the min cut saved ``b`` (4 bytes, the min recomputed), the write bumped
    its version and the backward raised "modified by an inplace operation" (gradient fuzzer s1042 #309, shared with
    torch.compile's aot_eager). An input that is not a leaf is saved only where nothing computed can stand in."""
    def f(b):
        v1, _ = torch.min(b, dim=-1, keepdim=True)
        print("graph break")
        b[b > 0] = 1
        return v1 * 3

    cnt = coil.testing.CompileCounter()
    grads, xs = [], [torch.tensor(0.5), torch.randn(2, 3)]
    for fn in (f, coil.compile(f, backend=backend), coil.compile(f, backend=cnt)):
        coil.reset()
        for x in xs:
            a = x.clone().requires_grad_()
            b = a * 2
            out = fn(b)
            out.sum().backward()
            grads.append((out.detach(), b.detach(), a.grad))
    for got in (grads[2:4], grads[4:6]):
        torch.testing.assert_close(got, grads[0:2])
    assert 2 <= cnt.frame_count <= 5   # the graphs before and after the break, then the recompiles for a new shape


def _checkpointed_writes():
    from torch.utils.checkpoint import checkpoint

    def viewed(z):
        y = z.tanh()
        w = y.view(-1).sin()
        y.add_(1)
        return w.view(2, 3) * y

    bodies = {"tanh_add_": lambda z: z.tanh().add_(1.0),
              "relu__mul_": lambda z: torch.relu_(z * 2).mul_(2),
              "replayed": lambda z: z.tanh().add_(1.0).exp(),  # eager's recomputation writes before exp's save
              "view": viewed}
    fns = {k: (lambda b: lambda x: checkpoint(b, x, use_reentrant=False).sum())(b) for k, b in bodies.items()}
    fns["after"] = lambda x: checkpoint(torch.tanh, x, use_reentrant=False).mul_(3).sum()
    return fns


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
@pytest.mark.parametrize("body", ["tanh_add_", "relu__mul_", "replayed", "view", "after"])
def test_checkpointed_value_written_after_it_was_saved(body, backend):
    """A non-reentrant checkpoint body writing a value its autograd saved (``z.tanh().add_(1)``): eager's checkpoint
    recomputes saved values in the backward (up to the region's last save), so it has no version error; the joint
    trace met autograd's, and coil ran the graph eagerly without the checkpoint, whose backward raised. The joint now
    reads the value as eager's recomputation gives it (the partitioner recomputes the region): eager's gradients,
    compiled, only the input saved."""
    from helpers import CountingAotEager

    f = _checkpointed_writes()[body]
    x0 = torch.randn(2, 3)
    xe, xc = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    f(xe).backward()
    coil.reset()
    counter = CountingAotEager()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        coil.compile(f, backend=counter if backend == "aot_eager" else "coil")(xc).backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    assert counter.paths in ([], ["training"])


class _Triples(torch.autograd.Function):
    """Forward doubles, backward triples: a gradient that is not the forward's derivative."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 3


def _no_grad_region(x, k):
    with torch.no_grad():
        y = x * k
    return y


_BESIDE_A_FLOAT = {"no_grad": _no_grad_region, "detach": lambda x, k: x.detach() * k,
                   "data": lambda x, k: x.data * k, "torch_detach": lambda x, k: torch.detach(x) * k,
                   "function": lambda x, k: _Triples.apply(x) * k,
                   "gradient": lambda x, k: torch.gradient(x, dim=1)[0] * k}


@pytest.mark.parametrize("what", sorted(_BESIDE_A_FLOAT))
def test_training_float_beside_what_the_forward_aten_graph_forgets(what):
    """A training graph reading a changing Python float is differentiated from its forward ATen graph with the float
    tensorized (no recompile per value), except where a node does more for autograd than its ATen ops (a no_grad
    region, detach, ``.data``, an autograd.Function), which that graph forgets: gradients stay eager's. The check was a
    substring filter on target names, which also refused ``torch.gradient`` (a recompile per value, then eager)."""
    g = _BESIDE_A_FLOAT[what]

    def fn(x, k):
        return (torch.lerp(x, g(x, k), k) * x).sum()

    coil.reset()
    cf = coil.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(5):
            x0, k = torch.randn(3, 4), 0.3 + 0.13 * i
            xe, xc = x0.clone().requires_grad_(), x0.clone().requires_grad_()
            fn(xe, k).backward()
            cf(xc, k).backward()
            torch.testing.assert_close(xc.grad, xe.grad)
    if what == "gradient":
        assert coil.capture.stats["frames"] <= 2 and coil.capture.stats["eager_limit"] == 0, coil.capture.stats


def test_autograd_function_beside_a_changing_float_keeps_its_backward():
    """``_Triples.apply(x) * k`` with ``k`` a symbolic float (its second value): the substring filter missed capture's
    ``_Triples_apply`` target, the joint differentiated the forward ATen graph (``x * 2``) and the gradient was
    ``2k`` where eager's backward gives ``3k`` (silently)."""
    cf = coil.compile(lambda x, k: (_Triples.apply(x) * k).sum())
    for k in (0.5, 0.7, 0.9):
        x = torch.ones(3, requires_grad=True)
        cf(x, k).backward()
        torch.testing.assert_close(x.grad, torch.full((3,), 3 * k))


def test_reentrant_checkpoint_writing_its_saved_output_raises_as_eager():
    """With ``use_reentrant=True`` eager's backward re-runs the whole body under autograd, whose version check refuses
    ``z.tanh().add_(1)``: the saved values are not read as of their save (the graph runs eagerly, warned, and its
    backward raises eager's error)."""
    from torch.utils.checkpoint import checkpoint

    def f(x):
        return checkpoint(lambda z: z.tanh().add_(1.0), x, use_reentrant=True).sum()

    coil.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for g in (f, coil.compile(f)):
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                g(torch.randn(4, requires_grad=True)).backward()


def test_checkpointed_value_written_after_it_was_saved_saves_only_the_input(tmp_path):
    """The copy the backward reads of ``tanh`` (written by ``add_``) is recomputed with the region: the forward saves
    the checkpoint's input only, as eager's checkpoint does (compile log: ``aot_partition``,
    ``aot_checkpoint_written_save``)."""
    import json

    from coil import trace

    coil.reset()
    trace.set_dir(str(tmp_path))
    try:
        coil.compile(_checkpointed_writes()["tanh_add_"])(torch.randn(2, 3, requires_grad=True)).backward()
    finally:
        trace.set_dir(None)
    events = [json.loads(line) for f in tmp_path.iterdir() for line in f.open()]
    parts = [e for e in events if e.get("event") == "aot_partition"]
    assert [[s["name"] for s in p["saved"]] for p in parts] == [["primals_1"]]
    assert [e["shape"] for e in events if e.get("event") == "aot_checkpoint_written_save"] == [["2", "3"]]


@pytest.mark.xfail(strict=True, reason="open: relu_'s saved output written afterwards through another view; eager's "
                   "backward raises the version check, coil's functional graph differentiates the value relu read "
                   "(torch's aot_eager misses it too; docs/fuzzing.md, the open missing_error class)")
def test_relu_output_written_through_another_view_fails_backward_as_eager():
    """s1053 #263 (``cpp_dynamic+grad``; static shapes the same class as s1004 #110)."""
    def fn(a):
        a.view(1, -1).relu_()
        v3 = a.squeeze()
        v3[v3 > 0] = -0.0
        return (a,)

    r = check(fn, lambda: [torch.tensor(1.0)], "cpp_dynamic+grad", grad_key=3097863368)
    assert r.outcome == "both_raise", (r.kind, r.detail)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_expanded_output_of_an_input_sums_its_gradient_as_eager(dtype, dynamic):
    """An output that is an expand of an input was rebuilt as ``as_strided`` of it: its backward added the 720
    gradients of a (6,) input expanded to (8, 3, 5, 6) one at a time in bf16 (-0.078 where eager's ExpandBackward,
    summing in float, gives -0.160; float64: -0.167). The broadcast dims are an ``expand`` of that view now."""
    import coil
    x = torch.randn(1, 1, 6, generator=torch.Generator().manual_seed(0)).to(dtype)
    f = lambda a: (a.expand(8, 3, 5, 6), a * 2)  # noqa: E731
    w = torch.linspace(-1, 1, 720).reshape(8, 3, 5, 6)
    grads = []
    for fn in (f, coil.compile(f, dynamic=dynamic)):
        leaf = x.clone().requires_grad_()
        out = fn(leaf * 1)[0]
        assert out.stride() == (0, 0, 0, 1)
        grads.append(torch.autograd.grad((out.float() * w).sum(), leaf)[0])
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
