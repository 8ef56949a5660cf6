"""A reduction over a static row inside a graph with a symbolic size is a persistent kernel (no loop over the row):
each launch config's RBLOCK must cover the row. The GPU's candidate configs for a looped column reduction have RBLOCK
16, and the dynamic launcher offered them to persistent kernels: eval BatchNorm + average pooling (rows of 25) at a
dynamic batch summed 16 of 25 elements on an H100 (eval outputs 0.09 off eager's after a recompile for a new batch).
Here the GPU's candidates and channels-last layouts are forced under Triton's interpreter."""
import pytest
import torch
import torch.nn as nn

import coil
from coil.runtime import triton_dynamic, triton_runtime


@pytest.fixture
def gpu_candidates(monkeypatch):
    real = triton_runtime.launch_configs

    def as_on_a_gpu(numel, rnumel, persistent, gpu, *a, **k):
        return [dict(c, num_warps=4) for c in real(numel, rnumel, persistent, True, *a, **k)]
    monkeypatch.setattr(triton_dynamic, "launch_configs", as_on_a_gpu)
    monkeypatch.setattr(triton_runtime, "launch_configs", as_on_a_gpu)
    # channels-last convolutions (CUDA's layout): the pooling then reduces a column (an outer reduction)
    import coil.ir.graph as G
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))


def test_dynamic_batch_pooling_after_eval_batchnorm_sums_whole_rows(gpu_candidates):
    torch.manual_seed(10)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.BatchNorm2d(8), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    # a new batch makes the batch dim symbolic (automatic dynamic shapes); the rows of 5 x 5 stay static
    c = coil.compile(m, options={"cpu_backend": "triton"})
    with torch.no_grad():
        for n in (4, 2, 3, 5):
            x = torch.randn(n, 3, 11, 11)
            torch.testing.assert_close(c(x), m(x), atol=1e-5, rtol=1e-5)


def test_dynamic_persistent_launcher_configs_cover_the_row():
    configs = triton_runtime.launch_configs(1024, 32, True, True, True)
    assert all(c["RBLOCK"] >= 25 for c in configs)
    looped = triton_runtime.launch_configs(1024, 32, False, True, True)
    assert any(c["RBLOCK"] < 25 for c in looped)   # (what the launcher offered before)


def test_config_check_mode_finds_the_wrong_config(monkeypatch):
    """config.triton_check_configs runs every GPU candidate under the interpreter: with the launcher's persistent flag
    dropped again (the defect above), the check names the kernel and the config."""
    import coil.ir.graph as G
    from coil.config import patch
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    real = triton_dynamic.DynamicTritonLauncher.__init__

    def drop_persistent(self, *a, **k):
        k["persistent"] = False
        real(self, *a, **k)
    monkeypatch.setattr(triton_dynamic.DynamicTritonLauncher, "__init__", drop_persistent)
    torch.manual_seed(10)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.BatchNorm2d(8), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    with patch(triton_check_configs=True):
        c = coil.compile(m, options={"cpu_backend": "triton"})
        with torch.no_grad(), pytest.raises(Exception, match="under launch config"):
            for n in (4, 2):
                c(torch.randn(n, 3, 11, 11))
