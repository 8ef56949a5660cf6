"""Regressions from new-user trial 65 (FINDINGS_65.md): higher-order operators, module features, Python semantics
under capture, views and aliasing, and the CPU meaning of ``mode=``, compared with eager on CPU.
"""

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
