"""Regressions from new-user trial 61 (FINDINGS_61.md): higher-order operators (cond, while_loop, scan, map,
checkpoint), torch.func, custom autograd Functions, dynamic and unbacked sizes, training-loop patterns.
"""

import pytest
import torch

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; crash): the backward of a torch.cond whose two outputs are summed failed with "cond_true might
# be aliasing the input or the output!": ``a + b`` gives both outputs one gradient tensor, torch's cond backward
# passes them as two operands of its backward cond, and torch's alias check refuses operands that alias each other
# (torch.compile fails the same way; eager's cond runs). capture now puts each cond output (with grad) through an
# identity whose backward copies the gradient.
# ---------------------------------------------------------------------------------------------------------------

def test_cond_two_outputs_added_backward(coil_reset):
    def f(x, y):
        a, b = torch.cond(x.sum() > 0, lambda x, y: (x * 2, y * 3), lambda x, y: (x * 4, y * 5), (x, y))
        return a + b

    for sign in (1, -1):
        x = (torch.rand(4) * sign).requires_grad_()
        y = torch.randn(4, requires_grad=True)
        x2, y2 = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
        ref = f(x, y)
        out = coil.compile(f)(x2, y2)
        torch.testing.assert_close(out, ref)
        ref.sum().backward()
        out.sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)
        torch.testing.assert_close(y2.grad, y.grad)
