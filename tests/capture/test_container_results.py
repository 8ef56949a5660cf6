"""A torch call whose result holds tensors in a dict (``vmap(grad(f))`` of a dict of parameters, per-sample
gradients) gives graph values; such a result was kept as a compile-time constant, and the user got the
capture's FakeTensors back. Other containers coil does not track are a graph break."""
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import coil


def test_per_sample_grads_of_a_param_dict_are_real_tensors():
    torch.manual_seed(0)
    m = nn.Linear(3, 2)
    params = {k: v.detach() for k, v in m.named_parameters()}

    def f(p, x, y):
        loss = lambda pp, xx, yy: F.mse_loss(functional_call(m, pp, (xx[None],)), yy[None])
        return vmap(grad(loss), in_dims=(None, 0, 0))(p, x, y)

    x, y = torch.randn(5, 3), torch.randn(5, 2)
    want, got = f(params, x, y), coil.compile(f)(params, x, y)
    assert list(got) == list(want)
    for k in want:
        assert type(got[k]) is torch.Tensor
        torch.testing.assert_close(got[k], want[k])


def test_dict_and_ordered_dict_results():
    by_dict = vmap(lambda x: {"s": x.sum(), "m": [x.max(), {"z": x + 1}]})
    by_od = vmap(lambda x: OrderedDict(a=x.sin()))
    x = torch.randn(3, 2)
    for fn in (lambda x: by_dict(x), lambda x: by_dict(x)["m"][1]["z"] * 2, lambda x: by_od(x)):
        want, got = fn(x), coil.compile(fn)(x)
        assert type(got) is type(want)
        for a, b in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
            assert type(b) is torch.Tensor
            torch.testing.assert_close(b, a)


_m = nn.Linear(3, 2)
_grad_of_loss = grad(lambda p, x: functional_call(_m, p, (x,)).pow(2).sum())  # made outside the frame


def test_grad_of_a_param_dict_made_outside_the_frame():
    params = {k: v.detach() for k, v in _m.named_parameters()}

    def sgd(p, x):
        g = _grad_of_loss(p, x)
        return {k: p[k] - 0.1 * g[k] for k in p}

    x = torch.randn(2, 3)
    want, got = sgd(params, x), coil.compile(sgd)(params, x)
    for k in want:
        assert type(got[k]) is torch.Tensor
        torch.testing.assert_close(got[k], want[k])
