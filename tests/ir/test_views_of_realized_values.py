"""Views (permute/transpose/reshape chains) of pointwise values not yet realized, handed to extern kernels and returned
as graph outputs (GraphLowering._view_of_base): they read, or are, a strided view of the value realized once. The
reference is eager: values, strides where eager promises them (an output that is a view of another output), which
outputs share memory (a write through one shows in the other exactly when it does in eager), gradients; static and
``dynamic=True``."""
import pytest
import torch
import torch.nn.functional as F

import coil

DYNAMIC = [False, True]


def _shares(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _run(f, args, dynamic, grad=False, write=None):
    """(outputs, input grads) of ``f`` on clones of ``args``, eager and compiled, each called twice (the second call
    is the compiled graph's cached path); ``write(outputs)`` runs on the outputs (no_grad) before the backward."""
    results = []
    for fn in (f, coil.compile(f, dynamic=dynamic)):
        for _ in range(2):
            a = [t.clone().requires_grad_(grad and t.is_floating_point()) for t in args]
            outs = fn(*a)
            outs = outs if isinstance(outs, tuple) else (outs,)
            if write is not None:
                with torch.no_grad():
                    write(outs)
            if grad:
                torch.manual_seed(0)
                torch.autograd.backward([o for o in outs if o.requires_grad],
                                        [torch.randn_like(o) for o in outs if o.requires_grad])
        results.append((outs, [t.grad for t in a]))
    return results


def _assert_like_eager(results, strides=True):
    (eo, eg), (co, cg) = results
    for e, c in zip(eo, co):
        torch.testing.assert_close(c, e)
        if strides:
            assert [s for s, n in zip(c.stride(), c.shape) if n != 1] == \
                [s for s, n in zip(e.stride(), e.shape) if n != 1], (c.stride(), e.stride())
    for i in range(len(eo)):
        for j in range(i + 1, len(eo)):
            assert _shares(co[i], co[j]) == _shares(eo[i], eo[j]), (i, j)
    for e, c in zip(eg, cg):
        assert (e is None) == (c is None)
        if e is not None:
            torch.testing.assert_close(c, e)


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_value_returned_with_its_views_aliases_like_eager(dynamic):
    """``y`` returned with ``y.t()``, ``y.view(-1)`` and ``y.permute``: one memory, eager's strides, and a write
    through the transposed output (after the call) shows in the others, element for element as in eager."""
    def f(x):
        y = x.sin() * 2
        return y, y.t(), y.view(-1), y.unsqueeze(0).permute(2, 0, 1)

    def write(o):
        o[1][1:, :2].add_(100)

    _assert_like_eager(_run(f, [torch.randn(3, 4)], dynamic, write=write))


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_views_returned_without_their_base(dynamic):
    """Two views of one pointwise value, the value itself not returned: still one memory (eager's outputs are views
    of one tensor), written through one and read through the other."""
    def f(x):
        y = x.exp() + x
        return y.permute(2, 0, 1), y.reshape(6, 4).t()

    def write(o):
        o[0].mul_(-1)

    _assert_like_eager(_run(f, [torch.randn(2, 3, 4)], dynamic, write=write))


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_transposed_operand_of_mm_also_returned(dynamic):
    """``y.t() @ w`` and ``y`` returned, then ``y`` written by the caller: the mm read the buffer before the write
    (its result is eager's), and the write does not reach the mm's output."""
    def f(x, w):
        y = x.relu() + 1
        return y.t() @ w, y

    def write(o):
        o[1].fill_(3.0)

    _assert_like_eager(_run(f, [torch.randn(4, 3), torch.randn(4, 5)], dynamic, write=write))


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("op", ["mm", "bmm", "addmm", "linear", "matmul"])
def test_view_of_a_pointwise_value_into_a_matmul_with_gradients(dynamic, op):
    """Forward and backward of a matmul whose operand is a transposed or reshaped pointwise value that is also
    returned: values, strides of the returned view, and the inputs' gradients as eager."""
    fs = {
        "mm": lambda x, w: (lambda y: (y.t() @ w, y.t()))(x.tanh() * 3),
        "bmm": lambda x, w: (lambda y: (torch.bmm(y.transpose(1, 2), w), y.transpose(1, 2)))(x.sigmoid() - x),
        "addmm": lambda x, w: (lambda y: (torch.addmm(w[0], y.t(), w), y.view(-1)))(x * x),
        "linear": lambda x, w: (lambda y: (F.linear(y.view(-1, 4), w.t()[:, :4]), y.flatten()))(x.cos()),
        "matmul": lambda x, w: (lambda y: (y.transpose(-1, -2) @ w[..., :5], y.transpose(-1, -2)))(x.exp()),
    }
    shapes = {"mm": [(4, 3), (4, 5)], "bmm": [(2, 4, 3), (2, 4, 5)], "addmm": [(4, 3), (4, 5)],
              "linear": [(2, 3, 4), (5, 4)], "matmul": [(2, 4, 3), (4, 5)]}
    torch.manual_seed(1)
    args = [torch.randn(s) for s in shapes[op]]
    _assert_like_eager(_run(fs[op], args, dynamic, grad=True))


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_permuted_pointwise_value_as_attention_query(dynamic):
    """``(q * 0.5).transpose(1, 2)`` into ``scaled_dot_product_attention`` and returned: the attention reads the
    permuted view of the one buffer; values and gradients of q, k, v as eager."""
    def f(q, k, v):
        y = q * 0.5
        return F.scaled_dot_product_attention(y.transpose(1, 2), k, v), y.transpose(1, 2)

    torch.manual_seed(2)
    args = [torch.randn(2, 5, 3, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)]
    results = _run(f, args, dynamic, grad=True)
    _assert_like_eager(results, strides=False)  # (the attention output's strides are the kernel's)
    assert results[1][0][1].stride() == results[0][0][1].stride()  # the view's are eager's


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_qkv_split_of_a_pointwise_projection(dynamic):
    """GPT-style q/k/v: a pointwise value reshaped and permuted into (3, B, H, T, D), unbound into the attention's
    three operands (views of one buffer at three offsets)."""
    def f(x):
        y = (x * 0.5 + 1).view(2, 6, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(*y.unbind(0))

    torch.manual_seed(3)
    _assert_like_eager(_run(f, [torch.randn(2, 6, 24)], dynamic, grad=True), strides=False)


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("channels_last", [False, True])
def test_permuted_pointwise_value_into_a_convolution(dynamic, channels_last, monkeypatch):
    """An NHWC pointwise value permuted to NCHW for ``conv2d`` (a channels-last view of the buffer) and returned,
    also with the CUDA channels-last path switched on for CPU tensors: values and gradients as eager."""
    import coil.ir.graph as G
    if channels_last:
        monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))

    def f(x, w):
        y = x + 1
        return F.conv2d(y.permute(0, 3, 1, 2), w).relu(), y

    torch.manual_seed(4)
    args = [torch.randn(2, 5, 5, 3), torch.randn(4, 3, 3, 3)]
    _assert_like_eager(_run(f, args, dynamic, grad=True), strides=False)


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_returned_view_written_in_place_by_a_training_caller(dynamic):
    """``(x * 2).t()`` returned from a graph that requires grad, then written in place (no_grad) by the caller: eager
    allows it. The compiled forward returned a view of its buffer from a custom Function, which autograd refuses to
    let be written ("Output 0 of CompiledFunction is a view and ... modified inplace")."""
    def f(x, w):
        y = x * 2
        return y.t(), y.exp() @ w

    def write(o):
        o[0].mul_(3)

    torch.manual_seed(5)
    _assert_like_eager(_run(f, [torch.randn(3, 4), torch.randn(4, 2)], dynamic, grad=True, write=write))
