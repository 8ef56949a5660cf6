"""Inputs a training step mutates where autograd does not see it (BatchNorm's running statistics): their new values
leave the autograd Function beside it (aot/runtime.py ``training_runner``), and a kernel that alone reads such an input
stores the new value over it (codegen ``_input_targets``, KernelPlan.inplace); the inputs still get eager's values and
versions, and gradients and the differentiable mutations after them are unchanged."""
import pytest
import torch
import torch.nn as nn
from test_inputs_written_in_place import _records

import coil
from coil.testing import assert_same_as_eager


def _written(run) -> list:
    """The input indices the codegen log says a compiled graph stores over (inputs_written_in_place)."""
    return [r["inputs"] for r in _records(run) if r["event"] == "inputs_written_in_place"]


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_batchnorm_running_stats_over_steps_match_eager(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4))
    ref = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4))
    ref.load_state_dict(model.state_dict())
    fast = coil.compile(model, options={"cpu_backend": backend})
    stats = [model[1].running_mean, model[4].running_var]
    ptrs, versions = [t.data_ptr() for t in stats], [t._version for t in stats]

    def step(m, x):
        m(x).square().sum().backward()

    xs = [torch.randn(2, 3, 6, 6) for _ in range(3)]
    written = _written(lambda: step(fast, xs[0]))
    assert written and len(written[-1]) == 6   # 2 x (running_mean, running_var, num_batches_tracked)
    for x in xs[1:]:
        step(fast, x)
    for x in xs:
        step(ref, x)
    assert [t.data_ptr() for t in stats] == ptrs and [t._version for t in stats] == [v + 3 for v in versions]
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


def test_running_stat_read_by_another_kernel_is_copied_back():
    """An input whose old value another step reads (here the output) is not stored over: same values as eager."""
    def f(x, buf):
        y = x + buf            # reads buf's old value
        buf.mul_(0.5).add_(x.detach().mean(0))
        return (y + 1).sum()

    fast = coil.compile(f)
    for _ in range(2):
        x, buf = torch.randn(4, 3, requires_grad=True), torch.randn(3)
        x2, buf2 = x.detach().clone().requires_grad_(), buf.clone()
        fast(x, buf).backward()
        f(x2, buf2).backward()
        torch.testing.assert_close(buf, buf2)
        torch.testing.assert_close(x.grad, x2.grad)
