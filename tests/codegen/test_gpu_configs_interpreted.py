"""Every GPU launch config of a sample of kernels, under Triton's interpreter (config.triton_check_configs): each
program runs at one size, then at another (the recompile makes the size symbolic), with every candidate config of
every kernel checked against the first and the output against eager's."""
import pytest
import torch
import torch.nn.functional as F

import coil
from coil.config import patch

PROGRAMS = {
    "softmax_rows": (lambda x: torch.softmax(x, -1), lambda n: (torch.randn(n, 40),)),
    "layer_norm": (lambda x: F.layer_norm(x, (24,)), lambda n: (torch.randn(n, 6, 24),)),
    "sum_dim0": (lambda x: x.sum(0), lambda n: (torch.randn(n, 37),)),
    "mean_columns_static_rows": (lambda x: x.mean((2, 3)), lambda n: (torch.randn(n, 8, 5, 5).to(
        memory_format=torch.channels_last),)),
    "var_middle_dim": (lambda x: x.var(1), lambda n: (torch.randn(n, 30, 3),)),
    "argmax_transposed": (lambda x: x.t().argmax(1), lambda n: (torch.randn(n, 19),)),
    "transpose_copy": (lambda x: x.t().contiguous() * 2, lambda n: (torch.randn(n, 33),)),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda n: (torch.randn(n, 50), torch.randint(0, 50, (n,)))),
    "logsumexp_cols": (lambda x: x.logsumexp(0), lambda n: (torch.randn(n, 21),)),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_gpu_config_gives_the_same_values(name):
    fn, make = PROGRAMS[name]
    torch.manual_seed(0)
    with patch(triton_check_configs=True):
        c = coil.compile(fn, options={"cpu_backend": "triton"})
        for n in (12, 7, 30):
            args = make(n)
            torch.testing.assert_close(c(*args), fn(*args), atol=1e-4, rtol=1e-4)
