"""A scatter whose index holds one entry per row along its dim (nll_loss's backward, one_hot) lowers to a pointwise
select: no scatter buffer, so it fuses with its readers; values as eager's, out-of-range indices still raise."""
import pytest
import torch
import torch.nn.functional as F

from codegen_helpers import check, compile_fn
from coil.exc import KernelIndexError

BACKENDS = ["triton", "cpp"]


def _args(dt=torch.float32):
    torch.manual_seed(0)
    return torch.randn(6, 10).to(dt), torch.randint(0, 10, (6, 1)), torch.randn(6, 3).to(dt)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.int32])
def test_one_per_row_scatter_values_match_eager(backend, dt):
    x, idx, src = _args(dt)
    check(lambda x, i, s: torch.zeros_like(x).scatter(1, i, s) * 2 + x, x, idx, src, backend=backend, atol=0, rtol=0)
    check(lambda x, i, s: (x + 1).scatter(1, i, 3), x, idx, src, backend=backend, atol=0, rtol=0)
    check(lambda x, i, s: (x * 2).scatter_add(1, i, s), x, idx, src, backend=backend, atol=0, rtol=0)
    # along dim 0: the index is (1, 10)
    rows, vals = torch.randint(0, 6, (1, 10)), torch.randn(1, 10).to(dt)
    check(lambda x, i, s: (x - 1).scatter(0, i, s), x, rows, vals, backend=backend, atol=0, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_add_keeps_negative_zero_where_nothing_is_added(backend):
    x = torch.full((4, 5), -0.0)
    idx = torch.tensor([[0], [1], [2], [3]])
    out = compile_fn(lambda x, i: (x * 1).scatter_add(1, i, torch.ones(4, 1)), x, idx, backend=backend)(x, idx)[0]
    assert torch.equal(out.signbit(), torch.ones(4, 5).scatter(1, idx, 0.0).bool())


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_per_row_scatter_is_one_fused_kernel(backend):
    x, idx, _ = _args()
    c = check(lambda x, i: (torch.zeros_like(x).scatter(1, i, -1.0) * x).sum(1), x, idx, backend=backend)
    assert c.kernel_count == 1, c.source


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_per_row_scatter_index_out_of_range_raises(backend):
    x, idx, _ = _args()
    fn = compile_fn(lambda x, i: (x + 1).scatter(1, i, 3.0), x, idx, backend=backend)
    idx[2] = 10
    with pytest.raises(KernelIndexError):
        fn(x, idx)


def test_cross_entropy_backward_writes_no_float32_logits_sized_buffer():
    """The gradient of bf16 logits through a float32 cross-entropy: eager's decomposition scatters into a float32
    (N, vocab) zeros; here only the bf16 gradient of the logits' size is written (32 MiB less at 1024 x 8192)."""
    torch.manual_seed(0)
    logits, target = torch.randn(8, 512, dtype=torch.bfloat16), torch.randint(0, 512, (8,))

    def grad(z, t):
        return torch.func.grad(lambda z: F.cross_entropy(z.float(), t))(z)
    c = check(grad, logits, target, atol=1e-2, rtol=1e-2)
    assert "(8, 512), (512, 1), torch.float32" not in c.source, c.source
