"""Training-path outputs that leave the autograd Function beside it (aot/runtime.py ``training_runner``: the new values
of leading mutated inputs autograd never differentiates, BatchNorm's running statistics): the inputs still get eager's
values and versions, and gradients and the differentiable mutations after them are unchanged."""
import torch
import torch.nn as nn

import coil
from coil.testing import assert_same_as_eager


def test_batchnorm_running_stats_over_steps_match_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4))
    ref = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4))
    ref.load_state_dict(model.state_dict())
    fast = coil.compile(model)
    for _ in range(3):
        x = torch.randn(2, 3, 6, 6)
        fast(x).square().sum().backward()
        ref(x).square().sum().backward()
    for (n, a), (_, b) in zip(model.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(a, b, msg=n)
    for (n, a), (_, b) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4)
    assert model[1].num_batches_tracked.item() == 3


def test_hidden_mutation_before_a_differentiable_one():
    def f(buf, x, w):
        buf.add_(1)
        x.mul_(w)     # x: not a leaf; its mutation is differentiated
        return x.sum() + buf.sum()

    torch.manual_seed(0)
    fast = coil.compile(f)
    got, want = [], []
    for fn, out in ((fast, got), (f, want)):
        torch.manual_seed(1)
        buf, base, w = torch.randn(4), torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
        x = base * 1
        fn(buf, x, w).backward()
        out += [buf, x.detach(), base.grad, w.grad]
        assert buf.grad_fn is None and x.grad_fn is not None
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_mutated_input_value_that_is_also_a_differentiable_output():
    def f(a, b):
        y = a * 2 + b
        a.detach().copy_(y.detach())   # a's new value: y's, written where autograd does not see it
        return y

    assert_same_as_eager(f, (torch.randn(3, requires_grad=True), torch.randn(3)), check_grads=True)


def test_mutated_buffer_versions_and_grad_mode_off():
    buf = torch.zeros(3)

    @coil.compile
    def f(x):
        buf.add_(x.detach())
        return (x * 2).sum()

    x = torch.randn(3, requires_grad=True)
    v = buf._version
    f(x).backward()
    assert buf._version > v and not buf.requires_grad and buf.grad_fn is None
    torch.testing.assert_close(buf, x.detach())
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
