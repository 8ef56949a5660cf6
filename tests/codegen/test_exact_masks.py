"""Masks that are all true for every launch config are left out of Triton kernels
(backend.mask_exactness): XBLOCK dividing numel for every
candidate config drops ``xmask``, RBLOCK dividing rnumel drops ``rmask``. Each case
also runs the kernel (Triton interpreter) against eager on random data."""
import pytest
import torch

from codegen_helpers import check


def _body(src: str) -> str:
    """The generated kernel function (not the header or the shared prelude)."""
    return src[src.index("@triton.jit\ndef triton_"):]


def _kernel(c, kind=None):
    ks = [k for k in c.kernels if kind is None or k.name.split("_")[1] == kind]
    assert len(ks) == 1, [k.name for k in c.kernels]
    return ks[0].source


def _masks_line(src: str) -> str:
    return next(l for l in src.splitlines() if l.startswith("# masks:"))


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


# ------------------------------------------------------------------ pointwise
def test_pointwise_multiple_of_block_has_no_xmask():
    x, y = torch.randn(3, 4096), torch.randn(4096)
    src = _kernel(check(lambda x, y: torch.sigmoid(x) * y + 1, x, y, kernels=1))
    body = _body(src)
    assert _masks_line(src) == "# masks: x exact"
    assert "xmask" not in body and "other=" not in body, body
    assert "tl.load(in_ptr0 + (xindex))" in body and "tl.store(out_ptr0 + (xindex), " in body, body


def test_pointwise_odd_numel_keeps_xmask():
    x, y = torch.randn(3, 1001), torch.randn(1001)
    src = _kernel(check(lambda x, y: torch.sigmoid(x) * y + 1, x, y, kernels=1))
    body = _body(src)
    assert _masks_line(src) == "# masks: x masked"
    assert "xmask = xindex < xnumel" in body
    assert "tl.load(in_ptr0 + (xindex), xmask, other=0.0)" in body, body
    assert body.rstrip().endswith(", xmask)"), body


def test_ops_masked_mask_stays():
    # constant_pad_nd lowers to ops.masked: its bounds mask is not a block mask
    x = torch.randn(4, 1022)
    body = _body(_kernel(check(lambda x: torch.nn.functional.pad(x, (1, 1)) * 2, x, kernels=1)))
    assert "xmask" not in body, body  # 4 * 1024 elements
    assert "tl.where(" in body and ", other=0.0)" in body, body


# ------------------------------------------------------------------ persistent reductions
def test_persistent_reduction_pow2_row_has_no_masks():
    x, w = torch.randn(8, 1024), torch.randn(1024)
    src = _kernel(check(_rms, x, w, kernels=1, atol=1e-5, rtol=1e-4))
    body = _body(src)
    assert _masks_line(src) == "# masks: x exact, r exact"
    assert "rmask" not in body and "xmask" not in body and "tl.where" not in body, body
    assert "red.sum(" in body


def test_persistent_reduction_row_1000_keeps_rmask():
    x, w = torch.randn(8, 1000), torch.randn(1000)
    src = _kernel(check(_rms, x, w, kernels=1, atol=1e-5, rtol=1e-4))
    body = _body(src)
    # CPU: XBLOCK = 8 rows divides 8, RBLOCK = 1024 does not divide 1000
    assert _masks_line(src) == "# masks: x exact, r masked"
    assert "rmask = rindex < rnumel" in body and "xmask" not in body, body
    assert "tl.where(rmask, " in body and ", rmask, other=0.0)" in body, body


def test_persistent_reduction_x_masked_only():
    x = torch.randn(5, 1024)
    src = _kernel(check(lambda x: torch.softmax(x, -1), x, kernels=1))
    body = _body(src)
    assert _masks_line(src) == "# masks: x masked, r exact"  # XBLOCK = 8 > 5 rows
    assert "rmask" not in body and "tl.where(xmask, " in body, body


@pytest.mark.parametrize("op", [torch.argmax, torch.argmin])
def test_persistent_arg_reduction_without_masks(op):
    x = torch.randn(4, 256)
    x[1, 7] = x[1, 100] = 50.0 if op is torch.argmax else -50.0  # ties: the lowest index
    body = _body(_kernel(check(lambda x: op(x, -1), x, kernels=1)))
    assert "mask" not in body, body


# ------------------------------------------------------------------ looped reductions
# (rows < 4096 with power-of-two-divisible rows would be split: _split_factor)
LOOPED = (4096, 5120)  # CPU: XBLOCK 64, RBLOCK 1024


def test_looped_reduction_exact():
    x = torch.randn(*LOOPED)
    src = _kernel(check(lambda x: x.sum(-1) + x.amax(-1), x, kernels=1, atol=1e-4, rtol=1e-4))
    body = _body(src)
    assert "for roffset in range(0, 5120, RBLOCK):" in body
    assert _masks_line(src) == "# masks: x exact, r exact"
    assert "mask" not in body and "tl.where" not in body, body


def test_looped_softmax_online_and_argmax_exact():
    x = torch.randn(*LOOPED)
    body = _body(_kernel(check(lambda x: torch.softmax(x, -1), x, kernels=1, atol=1e-6)))
    assert "_prev = " in body and "mask" not in body, body  # online softmax still matches
    x = torch.randn(64, 8192)
    x[2, 5] = x[2, 6000] = 40.0
    body = _body(_kernel(check(lambda x: torch.argmax(x, -1), x, kernels=1)))
    assert "mask" not in body and "_take = (" in body, body


def test_looped_reduction_ragged_keeps_rmask():
    x = torch.randn(64, 5003)  # prime rows: not split
    src = _kernel(check(lambda x: torch.softmax(x, -1), x, kernels=1, atol=1e-6))
    body = _body(src)
    assert _masks_line(src) == "# masks: x exact, r masked"
    assert "rmask = rindex < rnumel" in body and "xmask" not in body, body
    assert "tl.where(rmask, " in body, body


# ------------------------------------------------------------------ 2-D tiled kernels
def test_tiled_transpose_exact():
    x = torch.randn(64, 96)
    src = _kernel(check(lambda x: (x.t() * 2).contiguous(), x, kernels=1), "til")
    body = _body(src)
    assert _masks_line(src) == "# masks: x exact, r exact"
    assert "mask" not in body and "tl.program_id(1) * RBLOCK" in body, body


def test_tiled_transpose_ragged_keeps_masks():
    x, y = torch.randn(33, 517), torch.randn(517, 33)
    src = _kernel(check(lambda x, y: (x.t() * 2).contiguous() + y, x, y, kernels=1), "til")
    body = _body(src)
    assert _masks_line(src) == "# masks: x masked, r masked"
    assert "xmask & rmask" in body, body


# ------------------------------------------------------------------ GPU candidate sets
def _capture_plans(monkeypatch):
    from coil.codegen.triton.backend import TritonBackend
    plans = []
    orig = TritonBackend.generate

    def generate(self, plan, kernel_name):
        plans.append((plan, kernel_name))
        return orig(self, plan, kernel_name)

    monkeypatch.setattr(TritonBackend, "generate", generate)
    return plans


@pytest.mark.parametrize("numel,cpu_exact,gpu_exact", [
    (2048 * 3, False, True),   # CPU XBLOCK 4096; GPU 512 / 256 / 1024 all divide 6144
    (64, True, False),         # CPU XBLOCK 64; GPU blocks are at least 128
    (4096 * 3, True, True),
])
def test_gpu_decision_uses_gpu_candidates(monkeypatch, numel, cpu_exact, gpu_exact):
    from coil.codegen.triton.backend import kernel_source, launch_args, mask_exactness
    from coil.runtime.triton_runtime import blocks_divide, launch_configs
    plans = _capture_plans(monkeypatch)
    x = torch.randn(numel)
    check(lambda x: x * 3 + 1, x, kernels=1)
    (plan, name), = plans
    assert mask_exactness(plan, gpu=False) == (cpu_exact, False)
    assert mask_exactness(plan, gpu=True) == (gpu_exact, False)
    gpu_cfgs = launch_configs(**launch_args(plan, True, False))
    assert gpu_cfgs != launch_configs(**launch_args(plan, False, False))
    assert blocks_divide(gpu_cfgs, numel, 1)[0] == gpu_exact
    src, _, _ = kernel_source(plan, name, gpu=True)
    assert ("xmask" not in _body(src)) == gpu_exact, src
    assert _masks_line(src) == f"# masks: x {'exact' if gpu_exact else 'masked'}"


def test_gpu_layer_norm_shape_is_exact():
    from coil.runtime.triton_runtime import blocks_divide, launch_configs
    for eb in (4, 2):  # 32768 x 4096 persistent rows, fp32 and bf16 candidate sets
        assert blocks_divide(launch_configs(32768, 4096, True, True, elem_bytes=eb), 32768, 4096) == (True, True)
    # 4000-wide rows: RBLOCK 4096 != 4000
    assert blocks_divide(launch_configs(32768, 4000, True, True), 32768, 4000) == (True, False)
    # looped 32000-wide rows: RBLOCK 2048 / 1024 / ... do not divide 32000
    assert blocks_divide(launch_configs(8192, 32000, False, True), 8192, 32000) == (True, False)
    assert blocks_divide(launch_configs(8192, 32768, False, True), 8192, 32768) == (True, True)


def test_outer_reduction_gpu_decision(monkeypatch):
    """Outer reductions (known only after generating) get the wide-x GPU candidate set,
    after a replan to looped: the decision must use that set, as the launcher does."""
    from coil.codegen.triton.backend import kernel_source, launch_args, mask_exactness
    from coil.runtime.triton_runtime import blocks_divide, launch_configs
    plans = _capture_plans(monkeypatch)
    x = torch.randn(512, 96)  # x.sum(0): 96 outputs over 512 rows, loads contiguous along x
    c = check(lambda x: x.sum(0), x, kernels=1, atol=1e-4, rtol=1e-4)
    (plan, name), = plans
    assert not plan.persistent  # replanned by generate
    assert _masks_line(c.kernels[0].source) == "# masks: x masked, r masked"  # CPU: 64 x 1024
    src, _, _ = kernel_source(plan, name, gpu=True)
    assert "# outer reduction" in src
    # wide-x set: XBLOCK 128 / 256 do not divide 96, RBLOCK 16..64 divide 512; the
    # inner-reduction set (XBLOCK 1..8, RBLOCK 256..512) would have dropped xmask too
    assert mask_exactness(plan, True, outer=True) == (False, True)
    assert mask_exactness(plan, True, outer=False) == (True, True)
    cfgs = launch_configs(**launch_args(plan, True, True))
    assert blocks_divide(cfgs, plan.numel, plan.rnumel) == (False, True)
    assert _masks_line(src) == "# masks: x masked, r exact", src
    body = _body(src)
    assert "rmask" not in body and "tl.where(xmask, " in body, body


def test_symbolic_sizes_are_never_exact():
    import sympy
    from coil.runtime.triton_runtime import blocks_divide
    s = sympy.Symbol("s0", integer=True, positive=True)
    assert blocks_divide([dict(XBLOCK=1, RBLOCK=1)], s, s) == (False, False)
    assert blocks_divide([dict(XBLOCK=4, RBLOCK=8)], sympy.Integer(8), sympy.Integer(16)) == (True, True)
