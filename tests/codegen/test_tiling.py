"""2-D tiled pointwise kernels (codegen/tiling.py): a kernel whose accesses are
contiguous along different dims (a transpose) runs as [XBLOCK, RBLOCK] tiles on a 2-D
grid, so Triton can coalesce both sides."""
import pytest
import torch

from codegen_helpers import check, compile_fn


def _kinds(c):
    return [k.name.split("_")[1] for k in c.kernels]


@pytest.mark.parametrize("shape", [(96, 64), (33, 517), (1000, 24)])
def test_transpose_plus_add_is_one_tiled_kernel(shape):
    def f(x, y):
        return (x.t() * 2).contiguous() + y

    x, y = torch.randn(*shape), torch.randn(shape[1], shape[0])
    c = check(f, x, y, kernels=1)
    assert _kinds(c) == ["til"], [k.name for k in c.kernels]
    src = c.kernels[0].source
    assert "tl.program_id(1) * RBLOCK" in src and "for roffset" not in src, src


def test_nchw_to_nhwc_copy_is_tiled():
    def f(x):
        return x.permute(0, 2, 3, 1).contiguous() * 2

    c = check(f, torch.randn(2, 16, 9, 11), kernels=1)
    assert _kinds(c) == ["til"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_transpose_low_precision(dtype):
    def f(x):
        return torch.sigmoid(x.t()).contiguous()

    check(f, torch.randn(40, 72).to(dtype), kernels=1, atol=1e-2, rtol=1e-2)


def test_contiguous_pointwise_stays_flat():
    c = check(lambda x, y: x * y + 1, torch.randn(64, 48), torch.randn(64, 48), kernels=1)
    assert _kinds(c) == ["poi"]


def test_tiling_can_be_turned_off():
    c = compile_fn(lambda x: x.t().contiguous() + 1, torch.randn(64, 48), triton_tile_2d=False)
    assert _kinds(c) == ["poi"]


def test_tiled_configs():
    from coil.runtime.triton_runtime import tiled_configs
    for y, x in [(3072, 4096), (64, 8), (10, 1000)]:
        cfgs = tiled_configs(y, x, gpu=True)
        assert 1 <= len(cfgs) <= 4
        for c in cfgs:
            assert c["XBLOCK"] <= max(16, 1 << (y - 1).bit_length())
            assert c["RBLOCK"] <= max(16, 1 << (x - 1).bit_length())
            assert c["XBLOCK"] * c["RBLOCK"] // max(c["num_warps"], 1) >= 32
    assert len(tiled_configs(3072, 4096, gpu=False)) == 1


def test_scatter_of_transposed_values_is_not_tiled():
    def f(x, idx, v):
        return torch.index_put(x, (idx,), v.t(), accumulate=True)

    x, v = torch.randn(50, 64), torch.randn(64, 40)
    idx = torch.randint(0, 50, (40,))
    c = check(f, x, idx, v, atol=1e-4, rtol=1e-4)
    assert "til" not in _kinds(c), [k.name for k in c.kernels]
