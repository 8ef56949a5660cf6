"""Concat buffers (docs/ir.md, "Concat buffers"): a ``cat`` of ``config.concat_buffer_min_inputs`` or more inputs is
allocated once and each input is computed or copied into its slice (a ``ConcatSlice``, bound by the wrapper to a view
of the concatenation), instead of one pointwise body selecting among all inputs, inlined into every reader (DenseNet's
dense blocks: one kernel source per concatenation, up to 32 masked loads each). Every case is compared with eager on
random data, on the C++ backend and on Triton under its interpreter."""
import copy

import pytest
import torch

import coil
import coil.ir.graph as G
from coil.aot.decompositions import get_decompositions
from coil.ir.graph import GraphLowering
from coil.ir.nodes import ConcatBuffer, ConcatSlice
from coil.ir.reference import run_reference
from codegen_helpers import aten_graph, check

BACKENDS = ["cpp", "triton"]


def _slices(compiled) -> int:
    return compiled.source.count("# slice of ")


def r(*s, dtype=torch.float32):
    return torch.randn(*s).to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pointwise_inputs_computed_into_their_slices(backend):
    def f(a, b, c, d, e):
        return torch.cat([a.relu(), b * 2, c, d.sin(), e], 1).sigmoid()
    c = check(f, *[r(2, 3, 4) for _ in range(5)], backend=backend)
    assert _slices(c) == 5 and "concatenation of" in c.source, c.source


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_cat_stays_one_pointwise_body(backend):
    c = check(lambda a, b: torch.cat([a, b.exp()], 0) * 3, r(3, 4), r(2, 4), backend=backend, kernels=1)
    assert _slices(c) == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_dims_and_realized_inputs(backend, dim):
    # inputs realized by reductions (keepdim) and graph inputs, along the first, a middle and the last dim
    def f(a, b, c, d, e, x):
        s = x.sum(dim, keepdim=True)
        return torch.cat([a, s, b, c, s * 2, d, e], dim) + 1, s
    shape = [3, 4, 5]
    args = []
    for k in range(5):
        sh = list(shape)
        sh[dim] = k + 1
        args.append(r(*sh))
    check(f, *args, r(*shape), backend=backend, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_dtypes_promote(backend):
    def f(a, b, c, d, e):
        return torch.cat([a, b, c, d, e], 1) * 2
    args = [torch.randint(-5, 5, (2, 3), dtype=torch.int32), r(2, 2, dtype=torch.float16), r(2, 4),
            r(2, 1, dtype=torch.bfloat16), (r(2, 3) > 0)]
    c = check(f, *args, backend=backend, atol=1e-3, rtol=1e-3)
    assert _slices(c) == 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size_inputs_are_skipped(backend):
    def f(a, b, c, d, e, z):
        return torch.cat([a, z, b.cos(), c, z, d, e], 1)
    c = check(f, *[r(2, k + 1, 3) for k in range(5)], r(2, 0, 3), backend=backend)
    assert _slices(c) == 5
    # every input empty along another dim: an empty result
    check(lambda *xs: torch.cat(xs, 1), *[r(0, 2) for _ in range(6)], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_last_inputs(backend):
    xs = [r(2, 3 + k, 4, 5).to(memory_format=torch.channels_last) for k in range(5)]
    c = check(lambda *xs: torch.relu(torch.cat(xs, 1)), *xs, backend=backend)
    assert _slices(c) == 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_and_view_of_the_concatenation(backend):
    """The concatenation is a graph output and also read through views by an extern matmul and a kernel; a value
    computed into a slice and also returned comes back in its own storage, as eager's."""
    def f(a, b, c, d, e, w):
        a2 = a * 2
        cat = torch.cat([a2, b, c, d, e], 1)
        return cat, cat[:, 2:9] @ w, cat.t()[3:].exp(), a2
    outs = check(f, *[r(4, 3) for _ in range(5)], r(7, 5), backend=backend, atol=1e-4)
    got = outs(*[r(4, 3) for _ in range(5)], r(7, 5))
    assert got[3].untyped_storage().data_ptr() != got[0].untyped_storage().data_ptr()


def test_reference_interpreter():
    def f(a, b, c, d, e):
        return (torch.cat([a.relu(), b, c * c, d, e.to(torch.float64)], 0) - 1,)
    args = [r(k + 1, 3) for k in range(5)]
    gm = aten_graph(f, *args)
    g = GraphLowering(gm, args, torch.device("cpu")).lower()
    assert sum(isinstance(b, ConcatSlice) for b in g.buffers) == 5
    assert sum(isinstance(b, ConcatBuffer) for b in g.buffers) == 1
    torch.testing.assert_close(run_reference(g, args)[0], f(*args)[0])


class Dense(torch.nn.Module):
    """A dense block (DenseNet): each layer reads the concatenation of every earlier feature map."""

    def __init__(self, c0=8, growth=4, layers=6):
        super().__init__()
        nn = torch.nn
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(c0 + k * growth), nn.ReLU(), nn.Conv2d(c0 + k * growth, growth, 3, padding=1))
            for k in range(layers))

    def forward(self, x):
        feats = [x]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return torch.cat(feats, 1)


def _run_dense(backend, monkeypatch, train: bool, channels_last: bool, dynamic=None):
    if channels_last:
        monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    m = Dense().train(train)
    m2 = copy.deepcopy(m)
    coil.reset()
    f = coil.compile(m2, dynamic=dynamic, options={"cpu_backend": backend, "conv_channels_last": channels_last,
                                                   "conv_channels_last_training": channels_last})
    for n in (2, 3) if dynamic else (2,):
        x = torch.randn(n, 8, 6, 6)
        with torch.set_grad_enabled(train):
            out, ref = f(x), m(x)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        assert out.stride() == ref.stride()
        if train:
            w = torch.randn_like(ref)
            (out * w).sum().backward()
            (ref * w).sum().backward()
            for (name, p), (_, p2) in zip(m.named_parameters(), m2.named_parameters()):
                torch.testing.assert_close(p2.grad, p.grad, atol=1e-3, rtol=1e-3, msg=name)
                p.grad = p2.grad = None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_dense_block_of_convolutions(backend, train, monkeypatch):
    _run_dense(backend, monkeypatch, train, channels_last=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dense_block_channels_last_training(backend, monkeypatch):
    _run_dense(backend, monkeypatch, True, channels_last=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dense_block_dynamic_batch(backend, monkeypatch):
    _run_dense(backend, monkeypatch, True, channels_last=False, dynamic=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_concat_offsets(backend):
    """Offsets of the slices are symbolic (sizes along the concatenated dim are dynamic)."""
    import torch._dynamo
    torch._dynamo.reset()

    def fn(a, b, c, d, e):
        return torch.cat([a.relu(), b, c * 2, d, e], 0).sum(1)
    f = torch.compile(fn, backend="coil", dynamic=True)
    with coil.config.patch(cpu_backend=backend):
        for n in (2, 5, 9):
            args = [r(n + k, 3) for k in range(5)]
            torch.testing.assert_close(f(*args), fn(*args))


@pytest.mark.parametrize("backend", BACKENDS)
def test_storage_views_of_a_computed_slice(backend):
    """A value computed into its slice and then read through its storage (``view(dtype)``, ``as_strided``) reads
    its own elements, not the concatenation's (ATen's storage offsets are absolute)."""
    def f(a, b, c, d, e):
        a2 = a * 2
        return torch.cat([a2, b, c, d, e], 0) + 1, a2.view(torch.int32), a2.as_strided((3,), (2,), 1)
    xs = [r(2, 4) for _ in range(5)]
    check(f, *xs, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dense_block_shares_one_storage(backend):
    """A dense block's concatenations are prefixes of its last one: one storage, each feature map written once."""
    torch.manual_seed(0)
    m = Dense(layers=6).eval()
    with torch.no_grad():
        c = check(lambda x: m(x), torch.randn(2, 8, 6, 6), backend=backend, atol=1e-4, rtol=1e-4)
    assert _slices(c) == 7 and c.source.count("# concatenation of") == 7, c.source
    assert c.source.count("empty_strided((2, 32, 6, 6)") == 1, c.source


@pytest.mark.parametrize("backend", BACKENDS)
def test_families_that_branch_and_prefixes_returned(backend):
    """Two longer concatenations extend the same prefix; the prefix and both are returned (each its own memory)."""
    def f(a, b, c, d, e, g, h, i):
        be = b.exp()
        p = torch.cat([a, be], 1)
        x = torch.cat([a, be, c, d, e], 1)
        y = torch.cat([a, be, g, h, i, c], 1)
        return p, x * 2, y, p.sum(1)
    args = [r(3, k + 2) for k in range(8)]
    c = check(f, *args, backend=backend, atol=1e-5)
    out = c(*args)
    assert len({o.untyped_storage().data_ptr() for o in out[:3]}) == 3
    assert _slices(c) == 5 + 6, c.source  # p is a prefix of y (the longest), x has its own storage


def _costly(x, n=10):
    """A pointwise body of about ``5 n`` ops, each value read once."""
    for k in range(n):
        x = (x * (1 + k / 10)).sin() + k
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_costly_inputs_computed_into_their_slices(backend):
    # two inputs of ~40 ops each: inlined as one where-chain, every element would compute both
    c = check(lambda a, b: torch.cat([_costly(a), _costly(b.cos())], 1) * 3, r(3, 4), r(3, 5), backend=backend,
              atol=1e-4)
    assert _slices(c) == 2, c.source


@pytest.mark.parametrize("backend", BACKENDS)
def test_costly_cat_laid_out_for_its_transposing_clone(backend):
    """A rotary backward's shape: the q/k/v gradient ``cat`` is permuted and cloned for the projection's mm. The
    storage takes the clone's layout, the slices are written there, and the clone reads it as it is: no kernel
    copies the whole concatenation."""
    def f(q, k, v, w):
        cat = torch.cat([_costly(q), _costly(k), v * 2], 3)  # (2, 4, 6, 24): batch, heads, tokens, 3 x 8
        return cat.permute(0, 2, 1, 3).contiguous().view(2, 6, 96) @ w
    c = check(f, r(2, 4, 6, 8), r(2, 4, 6, 8), r(2, 4, 6, 8), r(96, 5), backend=backend, atol=1e-4)
    assert _slices(c) == 3, c.source
    assert c.kernel_count == 1, c.source  # the three slices, fused; no copy of the whole concatenation


@pytest.mark.parametrize("backend", BACKENDS)
def test_costly_cat_of_a_family_is_still_cloned(backend):
    # a shorter cat shares the storage: the clone of the longer one copies, and both results stay eager's
    def f(a, b, c):
        short = torch.cat([_costly(a), _costly(b)], 1)
        long = torch.cat([_costly(a), _costly(b), c], 1)
        return short * 2, long.t().clone()
    outs = check(f, r(3, 4), r(3, 5), r(3, 2), backend=backend, atol=1e-4)
    got = outs(r(3, 4), r(3, 5), r(3, 2))
    assert got[1].untyped_storage().data_ptr() != got[0].untyped_storage().data_ptr()
