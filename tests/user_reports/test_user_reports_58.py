"""Regressions from new-user trial 58 (FINDINGS_58.md): hand-written CNNs in training (DenseNet, ConvNeXt,
EfficientNet / MobileNetV3, RegNet, ResNeXt, U-Net, ShuffleNet) through coil's channels-last convolution path
(``_CHANNELS_LAST_DEVICES`` and ``_GPU_SPLIT_DEVICES`` patched to include "cpu"), float32 and bf16 autocast.

The xfail(strict=True) tests are open bugs: each fails today and starts passing (so must lose its mark) once fixed.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


@pytest.fixture
def gpu_plan(monkeypatch):
    """Channels-last convolutions and the GPU split-reduction plan on CPU tensors, as the brief of trial 58 asks."""
    import coil.ir.graph as G
    import coil.ir.lowering as L
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(L, "_GPU_SPLIT_DEVICES", ("cuda", "cpu"))


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed: the wrapper's ensure_layout converts a multi-output op's output to its predicted dtype; silent wrong value): GroupNorm's backward with a bf16 / fp16 input and float32 weight (a conv
# followed by nn.GroupNorm under torch.autocast("cpu", bfloat16)) gives garbage gradients on the C++ backend.
# On CPU, ATen's native_group_norm returns float32 mean / rstd for a half input with float32 weight, but its meta
# function says bf16; coil's extern call keeps the meta dtype and the backward kernel reads the float32 buffers as
# bf16 (1e36, inf, NaN in x.grad and weight.grad). The Triton backend gives eager's values.
# ---------------------------------------------------------------------------------------------------------------

def _group_norm_grads(fn, x, w, b):
    xi, wi, bi = (t.clone().requires_grad_() for t in (x, w, b))
    out = fn(xi, wi, bi)
    out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape).to(out.dtype))
    return out, xi.grad, wi.grad, bi.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_group_norm_half_input_float_weight_backward_cpp(coil_reset, dtype):
    def f(x, w, b):
        return F.group_norm(x, 3, w, b)

    torch.manual_seed(0)
    x, w, b = torch.randn(2, 6, 4, 4).to(dtype), torch.ones(6), torch.zeros(6)
    ref = _group_norm_grads(f, x, w, b)
    out = _group_norm_grads(coil.compile(f, options={"cpu_backend": "cpp"}), x, w, b)
    for o, r in zip(out, ref):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o.float(), r.float(), rtol=2e-2, atol=2e-2)


# (fixed: coil.capture.meta_checks.cpu_mixed_norm gives the metas and decompositions eager's float32 statistics)
@pytest.mark.parametrize("op", ["group_norm", "layer_norm", "batch_norm"])
def test_mixed_dtype_norm_statistics_keep_eagers_float32(coil_reset, op):
    w, b = torch.ones(4), torch.zeros(4)
    f = {"group_norm": lambda x: torch.ops.aten.native_group_norm(x, w, b, 2, 4, 9, 2, 1e-5),
         "layer_norm": lambda x: torch.ops.aten.native_layer_norm(x, [3, 3], w[:3].expand(3, 3), None, 1e-5),
         "batch_norm": lambda x: torch.ops.aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)}[op]
    x = torch.randn(2, 4, 3, 3).bfloat16()
    assert [t.dtype for t in coil.compile(f)(x)] == [t.dtype for t in f(x)]


def test_conv_group_norm_training_step_under_bf16_autocast_cpp(coil_reset, gpu_plan):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(5, 6, 1), nn.GroupNorm(3, 6))
    x = torch.randn(2, 5, 8, 8)
    me, mc = copy.deepcopy(m), copy.deepcopy(m)
    fc = coil.compile(mc, options={"cpu_backend": "cpp"})
    for mod, fn in ((me, me), (mc, fc)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(x)
        (out.float() ** 2).mean().backward()
    for (n, pe), (_, pc) in zip(me.named_parameters(), mc.named_parameters()):
        assert torch.isfinite(pc.grad).all(), n
        torch.testing.assert_close(pc.grad, pe.grad, rtol=5e-2, atol=5e-2, msg=lambda s: f"{n}: {s}")


def test_group_norm_half_input_backward_through_torch_compile_backend_coil(coil_reset, dynamo_reset):
    def f(x, w, b):
        return F.group_norm(x, 3, w, b)

    torch.manual_seed(0)
    x, w, b = torch.randn(2, 6, 4, 4).to(torch.bfloat16), torch.ones(6), torch.zeros(6)
    ref = _group_norm_grads(f, x, w, b)
    out = _group_norm_grads(torch.compile(f, backend="coil", options={"cpu_backend": "cpp"}), x, w, b)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.float(), r.float(), rtol=2e-2, atol=2e-2)


def test_group_norm_half_input_float_weight_backward_triton_matches(coil_reset):
    """The same program through the Triton backend (its kernels take the real buffers' dtypes): eager's values."""
    pytest.importorskip("triton")

    def f(x, w, b):
        return F.group_norm(x, 3, w, b)

    torch.manual_seed(0)
    x, w, b = torch.randn(2, 6, 4, 4).to(torch.bfloat16), torch.ones(6), torch.zeros(6)
    ref = _group_norm_grads(f, x, w, b)
    out = _group_norm_grads(coil.compile(f, options={"cpu_backend": "triton"}), x, w, b)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.float(), r.float(), rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed: coil's max_unpool2d decomposition keeps x's memory format on CPU; wrong strides): max_unpool2d
# of a channels-last input returned a contiguous (NCHW) tensor where eager
# returns channels-last. Values and gradients are right, but anything stride-dependent downstream differs from eager:
# torch.randn_like(out) draws its numbers in the output's memory order, so the same seed gives other values per element.
# ---------------------------------------------------------------------------------------------------------------

def _pool_unpool(x):
    y, i = F.max_pool2d(x, 2, return_indices=True)
    return F.max_unpool2d(y, i, 2)


def test_max_unpool2d_channels_last_input_keeps_eager_strides(coil_reset):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4).contiguous(memory_format=torch.channels_last)
    ref, out = _pool_unpool(x), coil.compile(_pool_unpool)(x)
    torch.testing.assert_close(out, ref)
    assert ref.stride() == (32, 1, 8, 2)
    assert out.stride() == ref.stride()


def test_max_unpool2d_channels_last_gradients_match(coil_reset, gpu_plan):
    """The training values are right (cotangent built from the shape, not with randn_like)."""
    torch.manual_seed(0)
    w, b = torch.randn(6, 4, 1, 1), torch.randn(6)
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    cot = torch.randn(2, 6, 8, 8)

    def f(x, w, b):
        return _pool_unpool(F.conv2d(x, w, b))

    grads = []
    for fn in (f, coil.compile(f)):
        a = [t.clone().requires_grad_() for t in (x, w, b)]
        out = fn(*a)
        out.backward(cot)
        grads.append([out.detach()] + [t.grad for t in a])
    for o, r in zip(grads[1], grads[0]):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# Passing cases (keep them passing): CNN-family training steps through the channels-last path
# ---------------------------------------------------------------------------------------------------------------

class _DenseNet(nn.Module):
    """DenseNet: BN-ReLU-conv layers, each reading torch.cat of every previous feature map; transition + pool."""

    def __init__(self, c0=6, g=5, n=3):
        super().__init__()
        self.stem = nn.Conv2d(3, c0, 3, padding=1, bias=False)
        self.bns = nn.ModuleList([nn.BatchNorm2d(c0 + i * g) for i in range(n)])
        self.convs = nn.ModuleList([nn.Conv2d(c0 + i * g, g, 3, padding=1, bias=False) for i in range(n)])
        c = c0 + n * g
        self.bn = nn.BatchNorm2d(c)
        self.trans = nn.Conv2d(c, c // 2, 1, bias=False)
        self.fc = nn.Linear(c // 2, 7)

    def forward(self, x):
        feats = [self.stem(x)]
        for bn, conv in zip(self.bns, self.convs):
            feats.append(conv(F.relu(bn(torch.cat(feats, 1)))))
        x = F.avg_pool2d(self.trans(F.relu(self.bn(torch.cat(feats, 1)))), 2)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class _ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.ln = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        y = self.fc2(F.gelu(self.fc1(self.ln(self.dw(x).permute(0, 2, 3, 1)))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class _LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                            self.eps).permute(0, 3, 1, 2)


class _ConvNeXt(nn.Module):
    def __init__(self, c=12):
        super().__init__()
        self.stem, self.norm0 = nn.Conv2d(3, c, 2, stride=2), _LayerNorm2d(c)
        self.b1, self.dnorm, self.down = _ConvNeXtBlock(c), _LayerNorm2d(c), nn.Conv2d(c, 2 * c, 2, stride=2)
        self.b2, self.head, self.fc = _ConvNeXtBlock(2 * c), nn.LayerNorm(2 * c), nn.Linear(2 * c, 5)

    def forward(self, x):
        x = self.b2(self.down(self.dnorm(self.b1(self.norm0(self.stem(x))))))
        return self.fc(self.head(x.mean((2, 3))))


class _MBConv(nn.Module):
    """EfficientNet / MobileNetV3 block: expand 1x1, depthwise 3x3, squeeze-excitation, project, residual."""

    def __init__(self, cin, cout, exp, stride, act, gate):
        super().__init__()
        m = cin * exp
        self.pw, self.bn1 = nn.Conv2d(cin, m, 1, bias=False), nn.BatchNorm2d(m)
        self.dw, self.bn2 = nn.Conv2d(m, m, 3, stride, 1, groups=m, bias=False), nn.BatchNorm2d(m)
        self.se_r, self.se_e = nn.Conv2d(m, max(1, m // 4), 1), nn.Conv2d(max(1, m // 4), m, 1)
        self.pwl, self.bn3 = nn.Conv2d(m, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.act, self.gate, self.res = act(), gate, stride == 1 and cin == cout

    def forward(self, x):
        y = self.act(self.bn2(self.dw(self.act(self.bn1(self.pw(x))))))
        y = y * self.gate(self.se_e(self.act(self.se_r(F.adaptive_avg_pool2d(y, 1)))))
        y = self.bn3(self.pwl(y))
        return x + y if self.res else y


class _EffNet(nn.Module):
    def __init__(self, act=nn.SiLU, gate=torch.sigmoid):
        super().__init__()
        self.stem, self.bn, self.act = nn.Conv2d(3, 10, 3, 2, 1, bias=False), nn.BatchNorm2d(10), act()
        self.blocks = nn.Sequential(_MBConv(10, 10, 2, 1, act, gate), _MBConv(10, 14, 3, 2, act, gate),
                                    _MBConv(14, 14, 3, 1, act, gate))
        self.fc = nn.Linear(14, 6)

    def forward(self, x):
        x = self.blocks(self.act(self.bn(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class _ResNeXt(nn.Module):
    """Grouped-conv bottleneck with a strided projection shortcut, max pool stem, in-place ReLU."""

    def __init__(self, groups=4):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16)
        self.c1, self.b1 = nn.Conv2d(16, 12, 1, bias=False), nn.BatchNorm2d(12)
        self.c2, self.b2 = nn.Conv2d(12, 12, 3, 2, 1, groups=groups, bias=False), nn.BatchNorm2d(12)
        self.c3, self.b3 = nn.Conv2d(12, 24, 1, bias=False), nn.BatchNorm2d(24)
        self.down = nn.Sequential(nn.Conv2d(16, 24, 1, 2, bias=False), nn.BatchNorm2d(24))
        self.fc = nn.Linear(24, 7)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x)), inplace=True), 3, 2, 1)
        y = self.b3(self.c3(F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))))))
        x = F.relu(y + self.down(x), inplace=True)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


class _UNet(nn.Module):
    """Encoder / decoder with max pool, transposed conv, bilinear upsampling and a skip concatenation."""

    def __init__(self, c=6):
        super().__init__()

        def blk(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))
        self.e1, self.e2, self.mid = blk(3, c), blk(c, 2 * c), blk(2 * c, 2 * c)
        self.up, self.d1, self.out = nn.ConvTranspose2d(2 * c, c, 2, 2), blk(2 * c, c), nn.Conv2d(c, 3, 1)

    def forward(self, x):
        a = self.e1(x)
        m = self.mid(self.e2(F.max_pool2d(a, 2)))
        u = self.up(m) + F.interpolate(m, size=a.shape[-2:], mode="bilinear", align_corners=False)[:, :a.shape[1]]
        return self.out(self.d1(torch.cat([u, a], 1)))


def _channel_shuffle(x, g):
    b, c, h, w = x.shape
    return x.view(b, g, c // g, h, w).transpose(1, 2).contiguous().view(b, c, h, w)


class _ShuffleNet(nn.Module):
    """ShuffleNetV2-style split / branch / concat / channel shuffle, strided channel slices, adaptive max pool."""

    def __init__(self, c=12):
        super().__init__()
        h = c // 2
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.branch = nn.Sequential(nn.Conv2d(h, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU(),
                                    nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h),
                                    nn.Conv2d(h, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU())
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        x1, x2 = self.stem(x).chunk(2, dim=1)
        x = _channel_shuffle(torch.cat((x1, self.branch(x2)), 1), 2)
        x = x[:, ::2] + x[:, 1::2].flip(1)
        x = torch.cat([x, x[:, 1:3]], 1)
        return self.fc(F.adaptive_max_pool2d(x, 1).flatten(1)[:, :5])


def _train_and_compare(model, x, *, channels_last, steps=2, opt="sgd", backend="cpp", atol=1e-5, rtol=1e-4):
    """``steps`` optimizer steps on deep copies, eager and coil; loss, every gradient (values and 4-D strides),
    every buffer (BatchNorm running stats, num_batches_tracked) and the final parameters must agree."""
    torch.manual_seed(0)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    me, mc = copy.deepcopy(model), copy.deepcopy(model)
    fc = coil.compile(mc, options={"cpu_backend": backend})
    make = ((lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)) if opt == "sgd"
            else (lambda p: torch.optim.AdamW(p, lr=1e-3)))
    oe, oc = make(me.parameters()), make(mc.parameters())
    for _ in range(steps):
        losses = []
        for fn, o in ((me, oe), (fc, oc)):
            o.zero_grad()
            out = fn(x)
            loss = (out ** 2).mean()
            loss.backward()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0], atol=atol, rtol=rtol)
        for (n, pe), (_, pc) in zip(me.named_parameters(), mc.named_parameters()):
            # a conv bias that feeds a training BatchNorm has a gradient that is zero up to rounding
            torch.testing.assert_close(pc.grad, pe.grad, atol=1e-4, rtol=1e-3, msg=lambda s: f"{n}: {s}")
            if pe.dim() == 4:
                assert all(a == b for a, b, k in zip(pc.grad.stride(), pe.grad.stride(), pe.shape) if k > 1), n
        for (n, be), (_, bc) in zip(me.named_buffers(), mc.named_buffers()):
            torch.testing.assert_close(bc, be, atol=atol, rtol=rtol, msg=lambda s: f"{n}: {s}")
        oe.step()
        oc.step()
    for (n, pe), (_, pc) in zip(me.named_parameters(), mc.named_parameters()):
        torch.testing.assert_close(pc, pe, atol=1e-4, rtol=1e-3, msg=lambda s: f"{n}: {s}")


_FAMILIES = {
    "densenet": (_DenseNet, (2, 3, 9, 9)),
    "convnext": (_ConvNeXt, (2, 3, 12, 12)),
    "efficientnet": (_EffNet, (3, 3, 13, 13)),
    "mobilenetv3": (lambda: _EffNet(nn.Hardswish, F.hardsigmoid), (1, 3, 11, 11)),
    "resnext": (_ResNeXt, (2, 3, 9, 9)),
    "unet": (_UNet, (2, 3, 8, 8)),
    "shufflenet": (_ShuffleNet, (2, 3, 7, 7)),
}


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_cnn_family_training_steps_channels_last_match_eager(coil_reset, gpu_plan, family):
    mk, shape = _FAMILIES[family]
    torch.manual_seed(0)
    _train_and_compare(mk(), torch.randn(*shape), channels_last=True)


def test_densenet_training_nchw_input_through_channels_last_path_matches_eager(coil_reset, gpu_plan):
    torch.manual_seed(0)
    _train_and_compare(_DenseNet(), torch.randn(2, 3, 9, 9), channels_last=False)


def test_bn_split_reduction_channels_last_matches_eager(coil_reset, gpu_plan):
    """8x16x16 = 2048 rows per channel: the BatchNorm statistics and their backward are split reductions on the GPU
    plan (``reduction_split`` events with split 4)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(5, 7, 3, padding=1), nn.BatchNorm2d(7), nn.ReLU())
    x = torch.randn(8, 5, 16, 16).contiguous(memory_format=torch.channels_last).requires_grad_()
    me, mc = copy.deepcopy(m).to(memory_format=torch.channels_last), copy.deepcopy(m).to(memory_format=torch.channels_last)
    xe, xc = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    out_e = me(xe)
    out_c = coil.compile(mc)(xc)
    assert out_c.stride() == out_e.stride()
    g = torch.randn_like(out_e)
    out_e.backward(g)
    out_c.backward(g)
    torch.testing.assert_close(out_c, out_e, atol=1e-5, rtol=1e-4)
    assert xc.grad.stride() == xe.grad.stride()
    torch.testing.assert_close(xc.grad, xe.grad, atol=1e-5, rtol=1e-4)
    for (n, be), (_, bc) in zip(me.named_buffers(), mc.named_buffers()):
        torch.testing.assert_close(bc, be, msg=lambda s: f"{n}: {s}")


def test_memory_format_changes_between_calls_match_eager(coil_reset, gpu_plan):
    """One compiled DenseNet-style cat + BN layer called with NCHW, channels-last, batch-1 channels-last, 1x1
    channels-last, permuted and sliced inputs: each call's output strides, values and x.grad match eager's."""
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(5, 3, 1), nn.BatchNorm2d(8)
    m = nn.ModuleDict({"c": conv, "bn": bn})

    def f(mod, x):
        return mod["bn"](torch.cat([x, F.relu(mod["c"](x))], 1))

    me, mc = copy.deepcopy(m), copy.deepcopy(m)
    fc = coil.compile(lambda x: f(mc, x))
    cl = torch.channels_last
    base = torch.randn(2, 5, 8, 8)
    xs = [base, base.contiguous(memory_format=cl), torch.randn(1, 5, 8, 8).contiguous(memory_format=cl),
          torch.randn(3, 5, 1, 1).contiguous(memory_format=cl), torch.randn(2, 8, 8, 5).permute(0, 3, 1, 2)[:, :, 1:, 1:],
          torch.randn(4, 5, 8, 8)[::2]]
    for i, x in enumerate(xs):
        xe = x.clone(memory_format=torch.preserve_format).requires_grad_()
        xc = x.clone(memory_format=torch.preserve_format).requires_grad_()
        oe, oc = f(me, xe), fc(xc)
        assert all(a == b for a, b, k in zip(oc.stride(), oe.stride(), oe.shape) if k > 1), (i, oc.stride(), oe.stride())
        torch.testing.assert_close(oc, oe, atol=1e-5, rtol=1e-4)
        g = torch.randn_like(oe)
        oe.backward(g)
        oc.backward(g)
        torch.testing.assert_close(xc.grad, xe.grad, atol=1e-5, rtol=1e-4)
        for (n, be), (_, bc) in zip(me.named_buffers(), mc.named_buffers()):
            torch.testing.assert_close(bc, be, atol=1e-5, rtol=1e-4, msg=lambda s: f"call {i} {n}: {s}")
