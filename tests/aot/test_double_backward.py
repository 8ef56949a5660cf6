"""Differentiating a compiled graph's gradients again raises coil's clear error, however it is
asked for: never a silent None or zero second derivative (allow_unused, materialize_grads), and
not autograd's "not used in the graph"."""
import pytest
import torch

import coil
from coil.aot.runtime import DOUBLE_BACKWARD_MESSAGE


def f(x):
    return (x.sin() * x).sum()


@pytest.mark.parametrize("kwargs", [{}, {"allow_unused": True}, {"materialize_grads": True}])
def test_second_derivative_with_autograd_grad_raises(kwargs):
    cf = coil.compile(f)
    x = torch.randn(3, requires_grad=True)
    g, = torch.autograd.grad(cf(x), x, create_graph=True)
    # the first derivative is still right
    torch.testing.assert_close(g, x.detach().cos() * x.detach() + x.detach().sin())
    with pytest.raises(RuntimeError, match="double backward through a compiled graph"):
        torch.autograd.grad(g.sum(), x, **kwargs)


def test_gradient_penalty_backward_raises():
    cf = coil.compile(f)
    x = torch.randn(3, requires_grad=True)
    g, = torch.autograd.grad(cf(x), x, create_graph=True)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD_MESSAGE[:40]):
        (g ** 2).sum().backward()


def test_create_graph_first_derivative_matches_eager():
    cf = coil.compile(f)
    x = torch.randn(5, requires_grad=True)
    g, = torch.autograd.grad(cf(x), x, create_graph=True)
    ge, = torch.autograd.grad(f(x), x, create_graph=True)
    torch.testing.assert_close(g, ge)
    assert g.requires_grad
