"""Training-step regressions found by fresh users: gradients as eager gives them, over several
backward passes (accumulation) and in-place gradient updates."""
import copy

import pytest
import torch

import coil

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
