"""Launch-saving horizontal fusion (schedule/scheduler.py, ``config.launch_fusion_max_numel``):
pointwise kernels that read only graph inputs, with the same size and access pattern,
become one kernel although they share no read (autocast's parameter casts, the
channels-last copies of convolution weights)."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coil.aot.decompositions import get_decompositions
from coil.codegen import compile_aten_graph
from coil.config import patch


def _casts(x, w1, w2, w3, b):
    # three same-shape parameter casts feeding matmuls (extern kernels), one of another shape
    h = x @ w1.to(torch.bfloat16).float()
    h = h @ w2.to(torch.bfloat16).float()
    h = h @ w3.to(torch.bfloat16).float()
    return h + b.to(torch.bfloat16).float()


def _inputs():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return [r(4, 32), r(32, 32), r(32, 32), r(32, 32), r(32)]


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_same_shape_parameter_casts_share_one_kernel(backend):
    args = _inputs()
    gm = make_fx(_casts, decomposition_table=get_decompositions())(*args)
    counts = {}
    for limit in (0, 1 << 24):
        with patch(cpu_backend=backend, launch_fusion_max_numel=limit):
            c = compile_aten_graph(gm, args, torch.device("cpu"))
        torch.testing.assert_close(c(*args)[0], _casts(*args), atol=1e-5, rtol=1e-5)
        counts[limit] = len(c.kernels)
    assert counts[1 << 24] == counts[0] - 2, counts  # w1, w2, w3 casts: one kernel


def test_limit_keeps_large_kernels_apart():
    args = _inputs()
    gm = make_fx(_casts, decomposition_table=get_decompositions())(*args)
    with patch(cpu_backend="cpp", launch_fusion_max_numel=512):   # 32x32 = 1024 > 512
        c = compile_aten_graph(gm, args, torch.device("cpu"))
    with patch(cpu_backend="cpp", launch_fusion_max_numel=0):
        c0 = compile_aten_graph(gm, args, torch.device("cpu"))
    assert len(c.kernels) == len(c0.kernels)


def test_random_values_are_not_hoisted():
    """Kernels reading the RNG seeds are left where they are."""
    def f(x, w1, w2):
        a = torch.rand(32, 32) * w1
        return x @ a, x @ (torch.rand(32, 32) * w2)
    g = torch.Generator().manual_seed(1)
    args = [torch.randn(4, 32, generator=g), torch.randn(32, 32, generator=g),
            torch.randn(32, 32, generator=g)]
    gm = make_fx(f, decomposition_table=get_decompositions())(*args)
    with patch(cpu_backend="cpp", launch_fusion_max_numel=0):
        n0 = len(compile_aten_graph(gm, args, torch.device("cpu")).kernels)
    with patch(cpu_backend="cpp"):
        n1 = len(compile_aten_graph(gm, args, torch.device("cpu")).kernels)
    assert n0 == n1


def test_channels_last_weight_copies_share_kernels(monkeypatch):
    import coil.ir.graph as G
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.ModuleList(torch.nn.Conv2d(8, 8, 3, padding=1) for _ in range(3))

        def forward(self, x):
            for c in self.c:
                x = torch.relu(c(x))
            return x

    torch.manual_seed(0)
    m = M().eval()
    params = dict(m.named_parameters())
    names = list(params)

    def fn(x, *ps):
        return torch.func.functional_call(m, dict(zip(names, ps)), (x,))

    x = torch.randn(2, 8, 6, 6)
    ps = [params[n].detach() for n in names]
    gm = make_fx(fn, decomposition_table=get_decompositions())(x, *ps)
    counts = {}
    for limit in (0, 1 << 24):
        with patch(cpu_backend="triton", conv_channels_last=True, launch_fusion_max_numel=limit):
            c = compile_aten_graph(gm, [x, *ps], torch.device("cpu"))
        torch.testing.assert_close(c(x, *ps)[0], m(x), atol=1e-4, rtol=1e-4)
        counts[limit] = len(c.kernels)
    assert counts[1 << 24] == counts[0] - 2, counts  # three 8x8x3x3 weight copies: one kernel


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_second_stages_of_split_reductions_share_one_kernel(backend):
    """A BatchNorm-backward-like pair of column sums over many rows is split into partial sums and second stages;
    the two tiny second stages, fed by one kernel, run as one kernel."""
    def f(dy, x, m):
        return dy.sum(0), (dy * (x - m)).sum(0)
    g = torch.Generator().manual_seed(2)
    args = [torch.randn(8192, 8, generator=g), torch.randn(8192, 8, generator=g), torch.randn(8, generator=g)]
    gm = make_fx(f, decomposition_table=get_decompositions())(*args)
    counts = {}
    for limit in (0, 1 << 24):
        with patch(cpu_backend=backend, launch_fusion_max_numel=limit):
            c = compile_aten_graph(gm, args, torch.device("cpu"))
        for got, want in zip(c(*args), f(*args)):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)
        counts[limit] = len(c.kernels)
    assert counts[1 << 24] == counts[0] - 1, counts
