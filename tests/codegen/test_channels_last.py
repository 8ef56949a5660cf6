"""Channels-last convolutions (``config.conv_channels_last``, CUDA inference graphs; the
CPU device is allowed here to exercise the path). cuDNN transposed ResNet-50's NCHW
activations to NHWC and back around every convolution (0.58 ms of a 2.47 ms bf16 step on
an H200, BENCHMARKS.md); with the option on, convolution and pooling inputs, their
outputs and the pointwise buffers made from them are (N, H, W, C) in memory."""
import re

import pytest
import torch

import coil
import coil.ir.graph as G


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(16)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(16)
        self.c3 = torch.nn.Conv2d(16, 32, 1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        h = self.pool(torch.relu(self.b1(self.c1(x))))
        h = torch.relu(self.b2(self.c2(h)) + h)
        h = self.c3(h)
        return self.fc(h.mean((2, 3))), h


def _block():
    torch.manual_seed(0)
    m = Block().eval()
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.normal_()
            mod.running_var.uniform_(0.5, 2)
    return m


def _logged(tmp_path, run) -> list:
    """Run ``run()`` with the compile log in ``tmp_path``; its events."""
    import json
    from coil import trace
    old = trace.trace_dir()
    trace.set_dir(str(tmp_path))
    try:
        coil.reset()
        run()
    finally:
        trace.set_dir(old)
    return [json.loads(line) for p in tmp_path.iterdir() for line in p.read_text().splitlines()]


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_resnet_block_runs_channels_last_without_copies(backend, monkeypatch):
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    from codegen_helpers import count_layout_copies
    copies = count_layout_copies(monkeypatch)
    m, x = _block(), torch.randn(2, 3, 32, 32)
    coil.reset()
    f = coil.compile(m, options={"cpu_backend": backend, "conv_channels_last": True, "conv_channels_last_training": True})
    with torch.no_grad():
        out, ref = f(x), m(x)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
        assert o.stride() == r.stride()  # the 4-D output comes back NCHW, like eager
    assert copies == [], copies  # every extern output had the predicted (NHWC) layout


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_weights_passed_as_they_are(backend, monkeypatch):
    """``conv_channels_last_weights=False``: no kernel copies a parameter channels-last
    (ATen's convolution does), the outputs still come back in the predicted layout and
    the values match eager, in inference and in training (gradients too)."""
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    from codegen_helpers import count_layout_copies
    copies = count_layout_copies(monkeypatch)
    m, x = _block(), torch.randn(2, 3, 32, 32)
    coil.reset()
    f = coil.compile(m, options={"cpu_backend": backend, "conv_channels_last": True, "conv_channels_last_training": True,
                                 "conv_channels_last_weights": False})
    with torch.no_grad():
        out, ref = f(x), m(x)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
        assert o.stride() == r.stride()
    assert copies == [], copies
    _train_both(backend, monkeypatch, conv_channels_last_weights=False)


def test_weight_copies_in_the_wrapper(monkeypatch):
    """The 3x3 weights get a generated channels-last copy by default, none with
    ``conv_channels_last_weights=False``."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from coil.aot.decompositions import get_decompositions
    from coil.codegen import compile_aten_graph
    from coil.config import patch
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    m, x = _block(), torch.randn(2, 3, 32, 32)
    params = dict(m.named_parameters(), **dict(m.named_buffers()))
    names = list(params)

    def fn_inputs(x, *ps):  # the parameters as graph inputs, as aot passes them
        return torch.func.functional_call(m, dict(zip(names, ps)), (x,))

    kernels = {}
    with torch.no_grad():
        ps = [params[n] for n in names]
        gm = make_fx(fn_inputs, decomposition_table=get_decompositions())(x, *ps)
        for weights in (True, False):
            with patch(cpu_backend="triton", conv_channels_last=True, conv_channels_last_training=True,
                       conv_channels_last_weights=weights):
                c = compile_aten_graph(gm, [x, *ps], torch.device("cpu"))
            torch.testing.assert_close(c(x, *ps)[0], m(x)[0], atol=1e-4, rtol=1e-4)
            kernels[weights] = len(c.kernels)
    assert kernels[True] == kernels[False] + 2, kernels  # c1's and c2's 3x3 weights


def test_channels_last_layouts_in_the_wrapper(monkeypatch):
    """Convolution outputs and the BatchNorm+ReLU buffers after them are NHWC; the kernel
    between two convolutions reads and writes consecutive addresses."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from coil.aot.decompositions import get_decompositions
    from coil.codegen import compile_aten_graph
    from coil.config import patch
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    m, x = _block(), torch.randn(2, 3, 32, 32)
    params = dict(m.named_parameters(), **dict(m.named_buffers()))

    def fn(x):
        return torch.func.functional_call(m, params, (x,))

    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=get_decompositions())(x)
        with patch(cpu_backend="triton", conv_channels_last=True, conv_channels_last_training=True):
            c = compile_aten_graph(gm, [x], torch.device("cpu"))
        out = c(x)
    torch.testing.assert_close(out[0], m(x)[0], atol=1e-4, rtol=1e-4)
    assert "(16384, 1, 512, 16)" in c.source, c.source  # conv1 output, NHWC
    pw = [k for k in c.kernels if "triton_poi" in k.name and "in_ptr5" in k.source]
    assert pw, c.source
    # (stored over its dead input, the convolution's output: config.inplace_buffers)
    assert re.search(r"tl\.store\((out|in)_ptr\d+ \+ \(xindex\)", pw[0].source), pw[0].source


def _train_both(backend, monkeypatch, **options):
    import copy
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    m, x = _block().train(), torch.randn(2, 3, 32, 32)
    m2 = copy.deepcopy(m)
    coil.reset()
    f = coil.compile(m2, options={"cpu_backend": backend, "conv_channels_last": True, "conv_channels_last_training": True, **options})
    out, ref = f(x), m(x)
    (out[0].sum() + out[1].mean()).backward()
    (ref[0].sum() + ref[1].mean()).backward()
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
        assert o.stride() == r.stride()
    for (n, p), (_, p2) in zip(m.named_parameters(), m2.named_parameters()):
        torch.testing.assert_close(p2.grad, p.grad, atol=1e-4, rtol=1e-4, msg=n)
        assert p2.grad.stride() == p.grad.stride(), n
    for (n, b), (_, b2) in zip(m.named_buffers(), m2.named_buffers()):
        torch.testing.assert_close(b2, b, atol=1e-5, rtol=1e-5, msg=n)  # BN running stats


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_channels_last_training_step(backend, monkeypatch):
    """Training graphs run channels-last too: the forward returns its saved activations
    NHWC (aot compiles the backward for the strides it reports, event
    aot_saved_layouts), convolution/pooling backward take and return NHWC, gradients
    and BatchNorm running stats match eager, and no extern output needs a layout copy."""
    from codegen_helpers import count_layout_copies
    copies = count_layout_copies(monkeypatch)
    _train_both(backend, monkeypatch)
    assert copies == [], copies


def test_channels_last_training_survives_the_aten_fallback(monkeypatch):
    """If generated kernels fail to compile (the graph then runs with ATen ops), the
    forward still returns its saved tensors in the strides the backward was compiled
    for."""
    from coil.exc import KernelCompileError
    from coil.runtime import triton_runtime

    def broken(self, *args):
        raise KernelCompileError(f"test: {self.name} does not compile")

    monkeypatch.setattr(triton_runtime.TritonLauncher, "__call__", broken)
    monkeypatch.setattr(triton_runtime.TritonLauncher, "wrapper_entry", None)  # the wrapper calls __call__
    from coil.config import config
    monkeypatch.setattr(config, "strict_codegen", False)  # the fallback is the subject
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _train_both("triton", monkeypatch)


@pytest.mark.parametrize("training", [False, True])
def test_training_graphs_follow_the_training_option(training, monkeypatch, tmp_path):
    """``conv_channels_last`` (on by default) covers inference graphs; training graphs
    follow ``conv_channels_last_training`` (on by default, turned off here)."""
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    m, x = _block().train(training), torch.randn(2, 3, 32, 32)

    def run():
        f = coil.compile(m, options={"cpu_backend": "cpp", "conv_channels_last_training": False})
        if training:
            out = f(x)
            (out[0].sum() + out[1].mean()).backward()
        else:
            with torch.no_grad():
                f(x)
    events = _logged(tmp_path, run)
    enabled = {e["graph"]: e["enabled"] for e in events if e["event"] == "layout_channels_last"}
    if training:
        assert enabled == {"forward": False, "backward": False}, enabled
    else:
        assert enabled == {"inference": True}, enabled


class _DenseLayer(torch.nn.Module):
    """A DenseNet layer (timm's): BatchNorm + ReLU of the concatenation of every earlier feature map, then
    1x1 and 3x3 convolutions."""

    def __init__(self, cin, growth):
        super().__init__()
        self.n1, self.c1 = torch.nn.BatchNorm2d(cin), torch.nn.Conv2d(cin, 2 * growth, 1, bias=False)
        self.n2, self.c2 = torch.nn.BatchNorm2d(2 * growth), torch.nn.Conv2d(2 * growth, growth, 3, padding=1, bias=False)

    def forward(self, feats):
        return self.c2(torch.relu(self.n2(self.c1(torch.relu(self.n1(torch.cat(feats, 1)))))))


class _DenseBlock(torch.nn.Module):
    def __init__(self, layers, c0=8, growth=4):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c0, 3, padding=1, bias=False)
        self.layers = torch.nn.ModuleList(_DenseLayer(c0 + i * growth, growth) for i in range(layers))

    def forward(self, x):
        feats = [self.stem(x)]
        for layer in self.layers:
            feats.append(layer(feats))
        return torch.cat(feats, 1).mean((2, 3)).sum()


@pytest.mark.parametrize("layers", [2, 5])  # a cat as a where-chain; a concat storage (config.concat_buffer_min_inputs)
def test_dense_block_training_buffers_stay_channels_last(layers, monkeypatch, tmp_path):
    """Every 4-D buffer a DenseNet block's training graphs compute is channels-last. The backward recomputes ReLU(BN(
    concatenation)) for the ReLU mask; that buffer reads a concatenation (inputs of other channel counts) or a channel
    slice of a concat storage (row stride the storage's channel count, not the slice's), and was laid out NCHW, so
    the BatchNorm-backward reductions over it mixed NCHW and NHWC loads and ran as uncoalesced row reductions
    (DenseNet-121 training on an H100: 0.89 of torch.compile)."""
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    m, x = _DenseBlock(layers), torch.randn(2, 3, 8, 8)
    m2 = _DenseBlock(layers)
    m2.load_state_dict(m.state_dict())
    losses = []

    def run():
        losses.append(coil.compile(m, options={"cpu_backend": "triton"})(x))
        losses[0].backward()
    events = _logged(tmp_path, run)
    loss = losses[0]
    ref = m2(x)
    ref.backward()
    torch.testing.assert_close(loss, ref, atol=1e-4, rtol=1e-4)
    for (n, p), p2 in zip(m.named_parameters(), m2.parameters()):
        torch.testing.assert_close(p.grad, p2.grad, atol=1e-4, rtol=1e-4, msg=n)
    irs = [e["text"] for e in events if e["event"] == "artifact" and e["name"].startswith("loop_ir")]
    assert len(irs) == 2
    nchw = []  # activations (batch 2, 8 x 8 images) of more than one channel whose W is at stride 1
    for line in (line for ir in irs for line in ir.splitlines()):
        if (m_ := re.match(r"buf\d+: Pointwise.* size=\['2', '(\d+)', '8', '8'\] stride=\[.*'1'\]$", line)) and m_[1] != "1":
            nchw.append(line)
    assert nchw == [], nchw


@pytest.mark.parametrize("groups,expect", [(4, False), (16, True)])
def test_grouped_convolutions_run_nchw(groups, expect, monkeypatch, tmp_path):
    """cuDNN runs a grouped convolution of more than one input channel per group slower channels-last (RegNetY's 24
    channels a group: a generic transform kernel of its own, 2x the NCHW time on an H100); a depthwise one (16
    groups of 16 channels: one each) is what channels-last makes fast. The graph's values are eager's either way."""
    monkeypatch.setattr(G, "_CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                            torch.nn.Conv2d(16, 16, 3, padding=1, groups=groups), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    outs = []

    def run():
        outs.append(coil.compile(m, options={"cpu_backend": "cpp"})(x))
        outs[0].sum().backward()
    events = _logged(tmp_path, run)
    torch.testing.assert_close(outs[0], m(x.detach()), atol=1e-4, rtol=1e-4)
    cl = {e["graph"]: (e["enabled"], e["reason"]) for e in events if e["event"] == "layout_channels_last"}
    assert {g: e for g, (e, _) in cl.items()} == {"forward": expect, "backward": expect}, cl
    assert all(("grouped convolution" in (r or "")) != expect for _, r in cl.values()), cl
