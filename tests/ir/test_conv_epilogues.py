"""The kernels around convolutions (coil/ir/lowering_conv.py, GraphLowering.default_strides):
a convolution's bias added in the next kernel, max pooling as a generated window max fused
with the BatchNorm + ReLU before it, and channels-last layouts carried through them.

CPU tests with the CUDA channels-last path switched on for CPU tensors
(``_CHANNELS_LAST_DEVICES``), on both kernel backends (C++ and Triton through its
interpreter); the reference is eager: values, output strides, and a max pool's indices and
input gradient.
"""
import json
import re
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
from coil import trace

BACKENDS = ["cpp", "triton"]


@pytest.fixture
def log(monkeypatch, tmp_path):
    """Channels-last convolutions on CPU, and the compile log in ``tmp_path``."""
    import coil.ir.graph as G
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    old = trace.trace_dir()
    try:
        trace.set_dir(str(tmp_path))
        coil.reset()
        yield tmp_path
    finally:
        coil.reset()
        trace.set_dir(old)


def events(d, name):
    records = [json.loads(line) for f in d.glob("*.jsonl") for line in f.read_text().splitlines()]
    return [r for r in records if r["event"] == name]


def compiled(fn, backend, **options):
    return coil.compile(fn, options={"cpu_backend": backend, **options})


def assert_like_eager(out, ref, atol=1e-5, rtol=1e-5):
    out = out if isinstance(out, (tuple, list)) else (out,)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, atol=atol, rtol=rtol, equal_nan=True)
        assert o.stride() == r.stride(), (o.stride(), r.stride())


# ------------------------------------------------------------------ max pooling

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k,s,p,d,ceil", [(3, 2, 1, 1, False), (2, 2, 0, 1, False), (3, 2, 1, 1, True),
                                          (3, 1, 1, 2, False), ((2, 3), (1, 2), (1, 1), 1, True)])
def test_max_pool_lowered_matches_eager(log, backend, k, s, p, d, ceil):
    """Window max with padding, dilation and ceil_mode over a 4-D input holding NaN and
    -inf (NaN propagates, an all -inf window gives -inf), NCHW and channels-last."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 10)
    x[0, 0, 2, 3] = float("nan")
    x[1, 2, :4, :4] = float("-inf")

    def f(x):
        return F.max_pool2d(torch.relu(x) * 2 - 1, k, s, p, d, ceil_mode=ceil)
    for inp in (x, x.to(memory_format=torch.channels_last)):
        assert_like_eager(compiled(f, backend)(inp), f(inp))
    assert events(log, "max_pool_lowered")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k,s,ceil,div,lowered", [
    (2, 2, False, None, {False, True}), ((2, 3), (2, 4), False, 5, {False, True}), ((3, 1), (3, 1), True, None, {False, True}),
    (3, 2, False, None, {False}),  # overlapping windows: the forward is lowered, the backward runs ATen's
    (2, 3, True, None, set())])  # ceil mode adds a partial window: both run ATen's
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_avg_pool_lowered_matches_eager(log, backend, k, s, ceil, div, lowered, dtype):
    """Window mean and its gradient over odd image sizes (rows and columns no window covers, gaps between windows of
    a stride above the kernel), with divisor_override, NCHW and channels-last, fp32 and bf16."""
    torch.manual_seed(0)
    x0 = torch.randn(2, 3, 9, 11, dtype=dtype)

    def f(x):
        return F.avg_pool2d(torch.relu(x) * 2 - 1, k, s, ceil_mode=ceil, divisor_override=div)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for inp in (x0, x0.to(memory_format=torch.channels_last)):
        a, b = inp.clone().requires_grad_(), inp.clone().requires_grad_()
        out, ref = compiled(f, backend)(a), f(b)
        assert_like_eager(out, ref, **tol)
        g = torch.randn_like(ref)
        out.backward(g)
        ref.backward(g)
        torch.testing.assert_close(a.grad, b.grad, **tol)
        assert a.grad.stride() == b.grad.stride()
    kinds = {e["backward"] for e in events(log, "avg_pool_lowered")}
    assert kinds == lowered, kinds


#: every (kernel, stride, padding, dilation, ceil_mode) of kernels 2/3, strides 1/2, padding 0/1, dilation 1/2
POOLS = [(k, s, p, d, c) for k in (2, 3) for s in (1, 2) for p in (0, 1) for d in (1, 2) for c in (False, True)]
#: 8 of them (a fractional factorial: each pair of factors takes all four level pairs) for the CI run
POOLS_CI = [(k, s, p, d, c) for k, s, p, d, c in POOLS if ((k == 3) != (s == 2)) == (d == 2) and ((k == 3) != p) == c]


def _pool_input(dtype):
    """(2, 3, 11, 12) planes: random with a NaN; integer values (ties, signed zeros); all equal; random with a
    -inf block; two NaNs in one window and a NaN beside a larger value; all -inf (every index is the first tap inside
    the image)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 12)
    x[0, 0, 4, 5] = float("nan")
    x[0, 1] = torch.randint(-2, 3, (11, 12)).float()
    x[0, 1, ::2] *= -1  # (-0.0 beside 0.0: the first of the two is picked)
    x[0, 2] = 1.5
    x[1, 0, 2:7, 3:9] = float("-inf")
    x[1, 1, 0, 0] = x[1, 1, 1, 1] = x[1, 1, 6, 6] = float("nan")
    x[1, 1, 6, 7] = 100.0
    x[1, 2] = float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("backend,dtype,pools", [
    pytest.param(b, dt, pools, id=f"{b}-{str(dt)[6:]}-{len(pools)}",
                 marks=[pytest.mark.slow] if pools is POOLS or (b, dt) == ("triton", torch.bfloat16) else [])
    for b in BACKENDS for dt in (torch.float32, torch.bfloat16) for pools in (POOLS_CI, POOLS)])
def test_max_pool_indices_and_backward(log, backend, dtype, pools):
    """``max_pool2d_with_indices`` and its backward generated for each of ``pools`` in one training graph: values and
    indices exactly eager's (ties pick the first tap, NaN the last NaN, never a padding tap), the input gradient
    within float32 rounding (bf16: one rounding of the fp32 sum), strides as eager's, NCHW and channels-last."""
    x0 = _pool_input(dtype)

    def f(x):
        return [t for k, s, p, d, c in pools for t in F.max_pool2d(x * 1, k, s, p, d, c, return_indices=True)]
    # (bf16: autograd sums the pools' gradients in bf16, in an order of its own)
    tol = dict(atol=1e-5, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=2e-2)
    for inp in (x0, x0.to(memory_format=torch.channels_last)):
        a, b = inp.clone().requires_grad_(), inp.clone().requires_grad_()
        out, ref = compiled(f, backend)(a), f(b)
        for o, r in zip(out, ref):
            assert torch.equal(o.float().nan_to_num(7.0), r.float().nan_to_num(7.0)) and o.stride() == r.stride()
        for vals, x in ((out, a), (ref, b)):
            sum((v.float() * torch.linspace(-1, 1, v.numel()).view(v.shape)).nan_to_num(0.0).sum()
                for v in vals[::2]).backward()
        torch.testing.assert_close(a.grad, b.grad, equal_nan=True, **tol)
        assert a.grad.stride() == b.grad.stride()
    lowered = events(log, "max_pool_lowered")
    assert sum(e["backward"] for e in lowered) == sum(not e["backward"] for e in lowered) == 2 * len(pools)


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_pool_training_channels_last(log, backend):
    """A channels-last training graph (conv + ReLU + max pool + conv): the pool's values and indices are one generated
    kernel writing NHWC buffers (no ATen pool in either wrapper), its backward is generated too, and the gradients
    and their strides are eager's."""
    torch.manual_seed(0)
    w1, w2 = torch.randn(8, 3, 3, 3), torch.randn(4, 8, 1, 1)

    def f(x, w1, w2):
        return F.conv2d(F.max_pool2d(F.relu(F.conv2d(x, w1, padding=1)), 3, 2, 1), w2)
    x0 = torch.randn(2, 3, 10, 10).to(memory_format=torch.channels_last)
    grads = []
    for fn in (f, compiled(f, backend)):
        args = [t.clone().requires_grad_() for t in (x0, w1, w2)]
        fn(*args).sum().backward()
        grads.append([t.grad for t in args])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert a.stride() == b.stride()
    assert sorted(e["backward"] for e in events(log, "max_pool_lowered")) == [False, True]
    wrappers = [e["text"] for e in events(log, "artifact") if e["name"] == "wrapper"]
    assert len(wrappers) == 2 and not any("aten.max_pool" in w for w in wrappers)
    pooled = {line.split(" = ")[0].strip() for line in wrappers[0].splitlines()
              if "empty_strided((2, 8, 5, 5), (200, 1, 40, 8)" in line}  # the values and the int64 indices
    assert len(pooled) == 2 and any(re.match(r"\s*k\d+(\._call)?\(", line) and all(b in line for b in pooled)
                                    for line in wrappers[0].splitlines()), (pooled, wrappers[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_pool_off(log, backend):
    x = torch.randn(1, 2, 8, 8)
    f = lambda x: F.max_pool2d(x, 2)  # noqa: E731
    assert_like_eager(compiled(f, backend, lower_max_pool=False)(x), f(x))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(lambda x: F.max_pool2d(x, 3, 2, 1), backend, lower_max_pool=False)(a).sum().backward()
    F.max_pool2d(b, 3, 2, 1).sum().backward()
    assert torch.equal(a.grad, b.grad)
    assert not events(log, "max_pool_lowered")


# ------------------------------------------------------------------ convolution bias

@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_bias_joins_next_kernel(log, backend):
    """conv + bias then ReLU, a biased conv as a graph output (eager's strides), a
    transposed conv and a 1-D conv with bias: values and strides as eager's; the bias add
    is logged and no ATen add kernel is left."""
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 4, 7, 7), torch.randn(6, 4, 3, 3), torch.randn(6)
    wt, bt = torch.randn(6, 3, 2, 2), torch.randn(3)
    x1, w1, b1 = torch.randn(2, 4, 9), torch.randn(5, 4, 3), torch.randn(5)

    def f(x, w, b, wt, bt, x1, w1, b1):
        h = F.conv2d(x, w, b, padding=1)
        return (torch.relu(h), F.conv2d(x, w, b), F.conv_transpose2d(h, wt, bt, stride=2),
                F.conv1d(x1, w1, b1))
    args = (x, w, b, wt, bt, x1, w1, b1)
    assert_like_eager(compiled(f, backend)(*args), f(*args), atol=1e-4, rtol=1e-4)
    assert len(events(log, "conv_bias_epilogue")) == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_bias_epilogue_bf16(log, backend):
    """bf16: the add computes in fp32 and rounds once, as eager's add_ does."""
    torch.manual_seed(0)
    x, w, b = (torch.randn(1, 8, 5, 5).bfloat16(), torch.randn(8, 8, 1, 1).bfloat16(),
               torch.randn(8).bfloat16())
    f = lambda x, w, b: F.hardsigmoid(F.conv2d(x, w, b))  # noqa: E731
    assert_like_eager(compiled(f, backend)(x, w, b), f(x, w, b), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_bias_epilogue_off(log, backend):
    x, w, b = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.randn(3)
    f = lambda x, w, b: torch.relu(F.conv2d(x, w, b))  # noqa: E731
    assert_like_eager(compiled(f, backend, conv_bias_epilogue=False)(x, w, b), f(x, w, b), atol=1e-4,
                      rtol=1e-4)
    assert not events(log, "conv_bias_epilogue")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_matvec(log, backend, dtype):
    """1x1 convolutions of 1x1 images (squeeze-excitation) as reductions: with and
    without bias, a stride and dilation that do not matter, bf16 (fp32 sums); over
    ``conv_matvec_max_macs`` (here 0) cuDNN's path runs. Values and strides as eager's."""
    torch.manual_seed(0)
    x = torch.randn(3, 16, 6, 6).to(dtype)
    w1, b1, w2 = (torch.randn(8, 16, 1, 1).to(dtype), torch.randn(8).to(dtype),
                  torch.randn(16, 8, 1, 1).to(dtype))

    def f(x, w1, b1, w2):
        s = F.relu(F.conv2d(x.mean((2, 3), keepdim=True), w1, b1))
        return x * torch.sigmoid(F.conv2d(s, w2, stride=2, dilation=3)), s
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert_like_eager(compiled(f, backend)(x, w1, b1, w2), f(x, w1, b1, w2), atol=tol, rtol=tol)
    assert len(events(log, "conv_matvec")) == 2
    coil.reset()
    assert_like_eager(compiled(f, backend, conv_matvec_max_macs=0)(x, w1, b1, w2), f(x, w1, b1, w2),
                      atol=tol, rtol=tol)
    assert len(events(log, "conv_matvec")) == 2


# ------------------------------------------------------------------ small conv nets

class _SE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(x.mean((2, 3), keepdim=True)))))


class _Net(nn.Module):
    """Stem conv + BN + ReLU + max pool, a residual block, a depthwise block with SE and
    hardswish, a biased 1x1 head on the pooled features, linear classifier."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8)
        self.c1, self.b1 = nn.Conv2d(8, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8)
        self.pw, self.b2 = nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.dw, self.b3 = nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16)
        self.se, self.pwl = _SE(16), nn.Conv2d(16, 8, 1)
        self.head, self.fc = nn.Conv2d(8, 12, 1), nn.Linear(12, 5)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.stem(x))), 3, 2, 1)
        x = F.relu(x + self.b1(self.c1(x)))
        y = self.se(F.hardswish(self.b3(self.dw(F.hardswish(self.b2(self.pw(x)))))))
        x = x + self.pwl(y)
        return x, self.fc(F.hardswish(self.head(F.adaptive_avg_pool2d(x, 1))).flatten(1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last_input", "channels_last_model"])
def test_conv_net_inference(log, backend, layout):
    """The whole net in eval mode, no_grad: both outputs (a 4-D feature map and the
    logits) match eager's values and strides for an NCHW input, a channels-last input and
    a channels-last model; the max pool and the four biased convolutions are lowered; the
    stem's BatchNorm + ReLU + pool write one channels-last buffer (no copy between)."""
    # (the max pool, the biased pwl conv, and the SE's and the head's 1x1-of-1x1 convs)
    torch.manual_seed(0)
    m = _Net().eval()
    x = torch.randn(2, 3, 20, 20)
    if layout != "contiguous":
        x = x.to(memory_format=torch.channels_last)
    if layout == "channels_last_model":
        m = m.to(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = m(x)
        out = compiled(m, backend)(x)
    assert_like_eager(out, ref, atol=1e-4, rtol=1e-4)
    assert len(events(log, "max_pool_lowered")) == 1
    assert len(events(log, "conv_bias_epilogue")) == 1  # pwl; the SE FCs and head are reductions
    assert len(events(log, "conv_matvec")) == 3
    wrapper = next(e["text"] for e in events(log, "artifact") if e["name"] == "wrapper")
    pooled = [line for line in wrapper.splitlines() if "empty_strided((2, 8, 5, 5)" in line]
    assert "(200, 1, 40, 8)" in pooled[0], pooled


@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_last_dynamic_shapes(log, backend):
    """A channels-last graph with symbolic batch and image sizes compiles (strict codegen:
    no FX-interpreter fallback) and matches eager at three sizes; the max pool and the
    extern inputs compare sizes as expressions (``int()`` of a symbol raised)."""
    torch.manual_seed(0)
    w, b, w2, b2 = torch.randn(8, 3, 3, 3), torch.randn(8), torch.randn(8, 8, 1, 1), torch.randn(8)

    def f(x, w, b, w2, b2):
        h = F.max_pool2d(F.relu(F.conv2d(x, w, b, padding=1)), 3, 2, 1)
        return h * torch.sigmoid(F.conv2d(h.mean((2, 3), keepdim=True), w2, b2))
    c = coil.compile(f, dynamic=True, options={"cpu_backend": backend, "strict_codegen": True})
    for n, hw in ((2, 12), (3, 16), (1, 9)):
        x = torch.randn(n, 3, hw, hw)
        assert_like_eager(c(x, w, b, w2, b2), f(x, w, b, w2, b2), atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (cuDNN's convolutions)")
@pytest.mark.parametrize("layout", ["contiguous", "channels_last_input"])
def test_conv_net_inference_cuda_bf16(log, layout):
    """The net on CUDA in bf16 (the path the H200 benchmarks take): values within bf16
    rounding of eager's and eager's output strides; max pool, bias epilogue and the
    SE/head reductions taken."""
    torch.manual_seed(0)
    m = _Net().eval().cuda().bfloat16()
    x = torch.randn(2, 3, 32, 32, device="cuda").bfloat16()
    if layout != "contiguous":
        x = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = m(x)
        out = coil.compile(m)(x)
    assert_like_eager(out, ref, atol=5e-2, rtol=5e-2)
    assert events(log, "max_pool_lowered") and events(log, "conv_bias_epilogue")
    assert len(events(log, "conv_matvec")) == 3


def test_conv_layouts_traced_with_cudnn_flag(log, monkeypatch):
    """Graph outputs take eager's strides where tracing (cuDNN off, for batch_norm's
    choice) gave a convolution other strides. On CUDA a convolution's fake output with cuDNN
    off is NCHW (ATen's non-cuDNN CUDA backends), with it on channels-last for a
    channels-last input, as eager returns it: the H200's channels-last CNN output came
    back NCHW. Emulated on CPU: the fake memory-format choice returns NCHW while cuDNN is
    off, and the device check counts CPU as a cuDNN device."""
    import coil.aot.functional as AF
    choose = torch._C._conv_determine_backend_memory_format

    def like_cuda(*a):
        return choose(*a) if torch._C._get_cudnn_enabled() else torch.contiguous_format
    monkeypatch.setattr(torch._C, "_conv_determine_backend_memory_format", like_cuda)
    monkeypatch.setattr(AF, "_CUDNN_LAYOUT_DEVICES", ("cuda", "cpu"))
    w = torch.randn(4, 3, 3, 3)
    x = torch.randn(1, 3, 6, 6).to(memory_format=torch.channels_last)

    def f(x):
        return F.conv2d(x, w, padding=1) + 1
    out = compiled(f, "cpp")(x)
    assert_like_eager(out, f(x), atol=1e-5, rtol=1e-5)
    assert [e["restrided"] > 0 for e in events(log, "aot_cudnn_layouts")] == [True]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_training_saved_channels_last_activation(log, backend):
    """``conv2d(x, w).relu()`` trained with ``dynamic=True``: the forward saved relu's output for the backward in the
    channels-last layout it computed it in, and reported no strides for it (``output_strides`` are ints, these are
    symbolic), so the backward was compiled for the traced NCHW strides and read the NHWC buffer as NCHW: x's gradient
    was wrong everywhere. A symbolic saved output now has the traced strides."""
    def f(x, w):
        return F.conv2d(x, w).relu()

    x, w, g = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(2, 4, 4, 4)
    grads = []
    for fn in (f, coil.compile(f, dynamic=True, options={"cpu_backend": backend})):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(a, b).backward(g)
        grads.append((a.grad, b.grad))
    torch.testing.assert_close(grads[1], grads[0])
