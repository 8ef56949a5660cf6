"""Regressions from new-user trial 69 (FINDINGS_69.md): dynamic block views, channels-last reductions on the C++
backend, wrapper buffer reuse; compared with eager.
"""

import pytest
import torch
import torch.nn.functional as F

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; a silent NaN): a channels-last sum / mean over (H, W) longer than one 32-row block, with a +inf in
# a channel, returned NaN where eager returns inf: the lane reduction's Kahan compensation computed ``inf - inf``.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["sum", "mean"])
def test_channels_last_sum_of_an_inf_is_inf(coil_reset, op):
    f = lambda x: getattr(x, op)((2, 3))  # noqa: E731
    x = torch.zeros(1, 8, 7, 7).to(memory_format=torch.channels_last)
    x[0, 2, 1, 1] = float("inf")
    x[0, 3, 0, 0], x[0, 3, 6, 6] = float("inf"), -float("inf")
    out, ref = coil.compile(f)(x), f(x)
    assert ref[0, 2] == float("inf") and ref[0, 3].isnan()
    torch.testing.assert_close(out, ref, equal_nan=True)
