"""Regressions from new-user trial 64 (FINDINGS_64.md): training steps, custom autograd, dynamic shapes, dtype corner
cases and Python control flow, compared with eager on CPU.
"""

import pytest
import torch

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; silent wrong gradients): ``torch.autograd.grad(out, x, create_graph=True)`` of a compiled output
# whose backward reads only values the forward computed (``tanh(x)``, not ``x``) gave a gradient that did not require
# grad: a gradient penalty ``out + g.pow(2).sum()`` then backpropagated without its penalty term. Such gradients
# now require grad, as eager's do, and differentiating them raises coil's documented double-backward error.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_create_graph_gradient_of_computed_saved_values_is_not_detached(coil_reset, backend):
    f = lambda x: (x.tanh() ** 2).sum()                           # noqa: E731
    x = torch.arange(1.0, 4.0, requires_grad=True)
    out = coil.compile(f, options={"cpu_backend": backend})(x)
    g, = torch.autograd.grad(out, x, create_graph=True)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="double backward"):
        (out + g.pow(2).sum()).backward()
    # gradients that read no computed value stay constants, usable as in eager
    h = lambda x: (x * 3).sum()                                   # noqa: E731
    x = torch.arange(1.0, 4.0, requires_grad=True)
    out = coil.compile(h, options={"cpu_backend": backend})(x)
    g, = torch.autograd.grad(out, x, create_graph=True)
    assert not g.requires_grad
    (out + g.pow(2).sum()).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))
