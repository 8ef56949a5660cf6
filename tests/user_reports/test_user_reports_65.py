"""Regressions from new-user trial 65 (FINDINGS_65.md): higher-order operators, module features, Python semantics
under capture, views and aliasing, and the CPU meaning of ``mode=``, compared with eager on CPU.
"""

import warnings

import pytest
import torch

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; silent wrong values): under ``dynamic=True`` an f-string, ``%`` or ``str.format`` of a symbolic
# ``x.shape`` gave ``"(2, 3)"`` where eager gives ``"torch.Size([2, 3])"``: the constant value of capture's
# SizeVariable was a plain tuple.
# ---------------------------------------------------------------------------------------------------------------

def test_formatting_a_symbolic_shape_keeps_torch_size(coil_reset):
    def f(x):
        return x * 1, f"{x.shape}", "%s" % (x.shape,), "{}".format(x.shape), str(x.shape), f"{tuple(x.shape)}"
    cf = coil.compile(f, dynamic=True)
    for n in (2, 3, 5):
        x = torch.randn(n, 3)
        out, ref = cf(x), f(x)
        assert out[1:] == ref[1:]
        torch.testing.assert_close(out[0], ref[0])


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; error where eager runs): a buffer overwritten from a value that requires grad, with no
# ``detach()`` (``self.stat.copy_(y.mean(0))``, ``.zero_()`` then ``+=``, ``[:] =``), in a training loop: the second
# step's backward raised "Trying to backward through the graph a second time". That call's compiled node takes the
# buffer (now carrying the first step's history) as an input and passes it no gradient; autograd still runs the
# first step's node, whose saved values were freed. A compiled node reached with no gradient at all now returns
# None without reading them, as eager's nodes do.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["copy", "zero_add", "setitem", "fill_add"])
def test_buffer_overwritten_from_grad_value_over_training_steps(coil_reset, how):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("stat", torch.zeros(3))
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            y = self.lin(x)
            v = y.mean(0)
            if how == "copy":
                self.stat.copy_(v)
            elif how == "zero_add":
                self.stat.zero_()
                self.stat += v
            elif how == "setitem":
                self.stat[:] = v
            else:
                self.stat.fill_(0).add_(v)
            return y

    torch.manual_seed(0)
    ref = M()
    model = M()
    model.load_state_dict(ref.state_dict())
    cm = coil.compile(model)
    for _ in range(3):
        x = torch.randn(4, 3)
        for m in (ref, cm):
            m(x).pow(2).sum().backward()
    torch.testing.assert_close(model.lin.weight.grad, ref.lin.weight.grad)
    torch.testing.assert_close(model.stat, ref.stat)


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed; silent wrong buffers): BatchNorm (training) inside ``checkpoint(..., use_reentrant=True)``: eager's
# backward runs the body again, so the running statistics are updated twice (``num_batches_tracked`` 2 after one
# step); coil's compiled graph updated them once. A graph where a reentrant checkpoint body writes an input now runs
# eagerly, warned (the non-reentrant case already did, through autograd's version check).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reentrant", [True, False])
def test_reentrant_checkpoint_writing_running_stats(coil_reset, reentrant):
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    model.load_state_dict(ref.state_dict())
    f = lambda m, x: checkpoint(m, x, use_reentrant=reentrant)    # noqa: E731
    cf = coil.compile(f)
    for step in range(2):
        x = torch.randn(4, 3, requires_grad=True)
        f(ref, x).sum().backward()
        if step == 0:
            with pytest.warns(UserWarning, match="runs eagerly"):
                cf(model, x.detach().clone().requires_grad_()).sum().backward()
        else:
            cf(model, x.detach().clone().requires_grad_()).sum().backward()
    for (k, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(b, a, msg=k)
    torch.testing.assert_close(model[0].weight.grad, ref[0].weight.grad)


# Finding 3, second part: a counter buffer bumped under ``no_grad`` in a reentrant checkpoint body. Eager counts the
# backward's recomputation too (4 after two steps); coil counted 2, and once such a graph ran eagerly, its
# replay returned the buffer through the reentrant checkpoint, which made the buffer that Function's output: the
# backward recursed into itself until memory ran out. Tensors from outside the body are no longer returned through it.
@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_body_counting_under_no_grad(coil_reset, reentrant):
    from torch.utils.checkpoint import checkpoint

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            with torch.no_grad():
                self.calls += 1
            return self.lin(x).tanh()

    torch.manual_seed(0)
    ref, model = M(), M()
    model.load_state_dict(ref.state_dict())
    f = lambda m, x: checkpoint(m, x, use_reentrant=reentrant)    # noqa: E731
    cf = coil.compile(f)
    for _ in range(2):
        x = torch.randn(4, 3, requires_grad=True)
        f(ref, x).sum().backward()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cf(model, x.detach().clone().requires_grad_()).sum().backward()
    assert model.calls.item() == ref.calls.item() == 4
    torch.testing.assert_close(model.lin.weight.grad, ref.lin.weight.grad)
