"""The GPU rule for split reductions (``_split_decision`` in coil/ir/lowering.py): a
reduction over the innermost dims is split on a GPU only when it has fewer output rows
than SMs and rows of >= GPU_SPLIT_MIN_RNUMEL elements; leading (outer) and full
reductions, and every reduction on the CPU, keep the earlier rules.

The CUDA plan is exercised on CPU tensors by adding "cpu" to ``_GPU_SPLIT_DEVICES``
(like ``_PAD_DEVICES`` in ir/graph.py) and running the Triton kernels in the
interpreter."""
import json

import pytest
import torch

import coil.ir.lowering as L
from coil import trace
from coil.config import patch
from codegen_helpers import check

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


def _softmax(x):
    return torch.softmax(x, -1)


@pytest.fixture
def gpu_plan(monkeypatch):
    """Plan CPU graphs with the GPU split rule (132 SMs, an H200)."""
    monkeypatch.setattr(L, "_GPU_SPLIT_DEVICES", ("cuda", "cpu"))
    with patch(gpu_sm_count=132):
        yield


def test_gpu_rows_that_fill_the_sms_are_not_split():
    with patch(gpu_sm_count=132):
        assert L._split_decision([256], 8192, "max", False, CUDA) == (1, "gpu_rows_fill_sms")
        assert L._split_factor([132], 8192, "sum", device=CUDA) == 1
        assert L._split_factor([512], 32000, "sum", device=CUDA) == 1
        assert L._split_factor([1024], 8192, "max", device=CUDA) == 1
        assert L._split_factor([256], 1 << 20, "sum", device=CUDA) == 1  # whatever the length
        # a GPU with more SMs than rows splits long ones again
        with patch(gpu_sm_count=300):
            assert L._split_factor([256], 32768, "max", device=CUDA) == 32
            assert L._split_factor([256], 8192, "max", device=CUDA) == 1


def test_gpu_few_long_rows_still_split():
    with patch(gpu_sm_count=132):
        assert L._split_factor([128], 32768, "max", device=CUDA) == 64
        assert L._split_factor([64], 65536, "sum", device=CUDA) == 128
        assert L._split_factor([131], 16384, "sum", device=CUDA) == 32
        # few rows, but short: one launch beats a split
        assert L._split_decision([128], 8192, "max", False, CUDA) == (1, "gpu_rows_short")
        assert L._split_factor([16], 4096, "sum", device=CUDA) == 1
        assert L._split_factor([64], 5000, "max", device=CUDA) == 1


def test_gpu_leading_reductions_split_into_chunks_of_256_rows():
    with patch(gpu_sm_count=132):
        # LLaMA RMSNorm weight gradients: dim 0 of (4*512, 4096) and of (2048, 1024); at most 32k partials
        assert L._split_decision([4096], 2048, "sum", True, CUDA) == (8, "gpu_leading_rows")
        assert L._split_factor([1024], 2048, "sum", leading=True, device=CUDA) == 8
        assert L._split_factor([768], 2048, "sum", leading=True, device=CUDA) == 8
        assert L._split_factor([4096], 32768, "sum", leading=True, device=CUDA) == 8
        assert L._split_factor([512], 8192, "sum", leading=True, device=CUDA) == 32
        assert L._split_factor([32768], 8192, "sum", leading=True, device=CUDA) == 1
        # the CPU keeps its rule; full reductions keep theirs
        assert L._split_decision([4096], 2048, "sum", True, torch.device("cpu")) == (2, "leading_few_programs")
        assert L._split_factor([], 12297, "sum", leading=True, device=CUDA) > 1


@pytest.mark.parametrize("shape", [(256, 8192), (128, 8192), (512, 32000), (16, 4096)])
def test_cpu_rule_unchanged(shape):
    rows, rnumel = shape
    assert L._split_factor([rows], rnumel, "max", device=CPU) > 1
    assert L._split_factor([rows], rnumel, "max", device=CPU) == L._split_factor([rows], rnumel, "max")


def test_softmax_256x8192_one_kernel_on_gpu_plan(gpu_plan):
    x = torch.randn(256, 8192, generator=torch.Generator().manual_seed(0)) * 3
    c = check(_softmax, x, kernels=1, atol=1e-6, rtol=1e-4)
    assert "for roffset" in c.kernels[0].source  # one looped row reduction


def test_softmax_256x8192_still_split_on_cpu_plan():
    x = torch.randn(256, 8192, generator=torch.Generator().manual_seed(1))
    c = check(_softmax, x, atol=1e-6, rtol=1e-4)
    assert c.kernel_count > 1


def test_softmax_few_long_rows_split_on_gpu_plan(gpu_plan):
    x = torch.randn(128, 32768, generator=torch.Generator().manual_seed(2)) * 3
    c = check(_softmax, x, atol=1e-6, rtol=1e-4)
    assert c.kernel_count > 1


def _split_events(log_dir, fn, *args, **check_kwargs) -> list:
    """``check(fn, *args)`` with the compile log on; its ``reduction_split`` events."""
    old = trace.trace_dir()
    trace.set_dir(str(log_dir))
    try:
        check(fn, *args, **check_kwargs)
    finally:
        trace.set_dir(old)
    events = [json.loads(line) for p in log_dir.iterdir() for line in p.read_text().splitlines()]
    return [e for e in events if e["event"] == "reduction_split"]


def test_rms_norm_weight_grad_split_on_gpu_plan(gpu_plan, tmp_path):
    """The leading rule still splits the weight gradients (dim 0 of 2048 x 1024) and
    the row reductions (2048 rows: fill the SMs) are not split; logged in the compile log."""
    def f(g, x, w):
        xh = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (g * xh).sum((0, 1)), g.sum((0, 1))

    gen = torch.Generator().manual_seed(3)
    args = (torch.randn(2, 1024, 1024, generator=gen), torch.randn(2, 1024, 1024, generator=gen),
            torch.randn(1024, generator=gen))
    splits = _split_events(tmp_path, f, *args, atol=2e-3, rtol=1e-4)
    assert len(splits) == 2, splits
    for e in splits:
        assert (e["outputs"], e["rnumel"], e["leading"], e["split"]) == (1024, 2048, True, 8), e
        assert e["reason"] == "gpu_leading_rows" and e["rule"] == "gpu" and e["sm_count"] == 132


def test_reduction_split_event(gpu_plan, tmp_path):
    (e,) = _split_events(tmp_path, lambda x: x.amax(-1), torch.randn(256, 8192), kernels=1)
    assert e["stage"] == "lowering" and e["device"] == "cpu" and e["reduction_type"] == "max"
    assert (e["outputs"], e["rnumel"], e["split"], e["chunk"]) == (256, 8192, 1, 8192)
    assert (e["rule"], e["sm_count"], e["reason"]) == ("gpu", 132, "gpu_rows_fill_sms")


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def test_few_short_rows_not_split_on_gpu_plan(gpu_plan):
    """Fewer rows than SMs but shorter than GPU_SPLIT_MIN_RNUMEL: one launch (the CPU
    plan splits these: rms_norm 3 kernels, cross-entropy 5)."""
    gen = torch.Generator().manual_seed(4)
    check(_rms, torch.randn(16, 4096, generator=gen), torch.randn(4096, generator=gen),
          kernels=1, atol=1e-5, rtol=1e-5)
    x, t = torch.randn(64, 5000, generator=gen), torch.randint(0, 5000, (64,), generator=gen)
    check(lambda a, b: torch.nn.functional.cross_entropy(a, b), x, t, kernels=2,
          atol=1e-5, rtol=1e-5)


def _bn_stats(x):
    return x.sum([0, 2, 3]), (x * x).sum([0, 2, 3])


@pytest.mark.parametrize("channels_last", [True, False])
def test_split_partials_follow_the_inputs_memory_order(gpu_plan, tmp_path, channels_last):
    """BatchNorm's per-channel sums over (N, H, W) of a channels-last input split as a
    leading reduction (partials along the contiguous C, loads coalesced): as rows of
    stride-C loads they ran 10x slower than torch.compile on an H200 (EfficientNet-B0
    training, channels-last). An NCHW input keeps the row split."""
    x = torch.randn(16, 8, 32, 32)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    events = _split_events(tmp_path, _bn_stats, x, atol=1e-3, rtol=1e-4)
    assert len(events) == 2 and all(e["split"] > 1 for e in events)
    assert all(e["leading"] is channels_last for e in events), events


def test_transposed_input_reduction_is_leading_in_memory(gpu_plan, tmp_path):
    (e,) = _split_events(tmp_path, lambda x: x.sum(1), torch.randn(8192, 64).t(), atol=1e-4, rtol=1e-4)
    assert e["leading"] is True and e["split"] > 1


def test_gpu_short_leading_reductions_split_to_fill_the_sms():
    """Bias and LayerNorm weight gradients of 8 x 128 tokens (512-2048 outputs over 1024
    rows) ran unsplit on 2-16 programs of 132 SMs; the GPU rule now splits them."""
    with patch(gpu_sm_count=132):
        assert L._split_decision([512], 1024, "sum", True, CUDA) == (16, "gpu_leading_few_programs")
        assert L._split_factor([2048], 1024, "sum", leading=True, device=CUDA) == 4
        assert L._split_factor([1536], 1024, "sum", leading=True, device=CUDA) == 4
        assert L._split_factor([4096], 1024, "sum", leading=True, device=CUDA) == 1  # enough programs
        assert L._split_factor([512], 128, "sum", leading=True, device=CUDA) == 1    # too short
        assert L._split_factor([512], 1024, "sum", leading=True, device=CPU) == 1    # CPU rule


def test_bias_grad_of_1024_rows_split_on_gpu_plan(gpu_plan, tmp_path):
    def f(g, h):
        return (g * torch.tanh(h)).sum(0), g.sum(0)

    gen = torch.Generator().manual_seed(5)
    args = (torch.randn(1024, 512, generator=gen), torch.randn(1024, 512, generator=gen))
    splits = _split_events(tmp_path, f, *args, atol=1e-4, rtol=1e-4)
    assert splits and all(e["split"] == 16 and e["reason"] == "gpu_leading_few_programs" for e in splits)


def test_per_row_statistics_do_not_decide_the_memory_order(gpu_plan, tmp_path):
    """A LayerNorm weight gradient over (B, H, W) of a (B, H, W, C) gradient also loads the per-token mean and rstd,
    whose index steps through W with coefficient 1. Those broadcast loads outvoted the one full load, the reduction was
    planned as 192 rows of stride-C loads and ran unsplit on 6 programs (timm Swin-T training on an H200: 0.9 ms a
    kernel); only loads that vary along the kept dim vote."""
    def f(g, mean, rstd):
        return (g * mean * rstd).sum((0, 1, 2))

    gen = torch.Generator().manual_seed(6)
    args = (torch.randn(4, 32, 32, 192, generator=gen), torch.randn(4, 32, 32, 1, generator=gen),
            torch.rand(4, 32, 32, 1, generator=gen))
    (e,) = _split_events(tmp_path, f, *args, atol=1e-3, rtol=1e-4)
    assert e["leading"] is True and e["split"] > 1, e
