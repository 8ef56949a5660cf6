"""Regressions from new-user trial 69 (FINDINGS_69.md): dynamic block views, channels-last reductions on the C++
backend, wrapper buffer reuse; compared with eager.
"""

import warnings

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
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # compiled, not run eagerly after a failed code generation
        out, ref = coil.compile(f)(x), f(x)
    assert ref[0, 2] == float("inf") and ref[0, 3].isnan()
    torch.testing.assert_close(out, ref, equal_nan=True)


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; wrong strides): ``batch_norm`` (train and eval) of a channels-last input whose size-1 dim has a
# non-canonical stride (a channels-last ``(2, 3, 1, 2)`` permuted to ``(2, 3, 2, 1)``, strides ``(6, 1, 3, 6)``)
# returns NCHW strides ``(6, 2, 1, 1)``; eager's ``suggest_memory_format`` says channels-last: ``(6, 1, 3, 3)``. Already
# under ``backend="aot_eager"``: the decomposition's ``torch._prims_common.suggest_memory_format`` disagrees with ATen's.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_keeps_eagers_format_for_an_odd_size_one_stride(coil_reset, training):
    def f(x):
        return F.batch_norm(x, torch.zeros(3), torch.ones(3), training=training)
    x = torch.randn(2, 3, 1, 2).to(memory_format=torch.channels_last).permute(0, 1, 3, 2)
    out, ref = coil.compile(f)(x), f(x)
    torch.testing.assert_close(out, ref)
    assert out.stride() == ref.stride() == (6, 1, 3, 3)
