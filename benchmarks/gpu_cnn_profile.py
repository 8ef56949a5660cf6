"""Where the GPU time of CNN inference goes: eager, coil and torch.compile, kernel by kernel.

    python benchmarks/gpu_cnn_profile.py --out $OUT                 # the H200, < 4 minutes
    python benchmarks/gpu_cnn_profile.py --device cpu --out /tmp/p  # a smoke test on CPU
    python benchmarks/gpu_cnn_profile.py --out $OUT --batches 1 --compilers coil coil-base inductor
    python benchmarks/gpu_cnn_profile.py --out $OUT --batches 1 --compilers coil-ro inductor-ro

For timm ``resnet50`` and ``mobilenetv3_large_100`` (random weights; torchvision's
``resnet50`` / ``mobilenet_v3_large`` where timm is missing, and small hand-written
ResNet / MobileNetV3-style modules with the same op mix where both are) at batch 1 and
batch 32, bf16, eval mode, no_grad, each compiler in default mode (no CUDA graphs):

- the first call's seconds (the compile) and the largest difference from eager's output;
- wall ms per forward (synchronized), host ms per call (the GPU idle before it: what
  guards, wrappers and launches cost the CPU), GPU ms per forward (the sum of the kernels'
  device time from ``torch.profiler``) and kernels per forward, and the replay time of
  the forward recorded into one ``torch.cuda.CUDAGraph`` by hand (GPU time without
  launch gaps: what ``mode="reduce-overhead"`` can reach);
- the memory format each convolution ran in, from the kernel names (cuDNN names its
  NHWC kernels ``..nhwc..``; ATen's own depthwise kernel is NCHW) and the layout
  conversions (cuDNN's ``nchwToNhwc`` / ``nhwcToNchw`` transposes);
- the top kernels by total device time, with calls per forward, and the host-side ATen
  ops per forward (``aten::add_`` after a convolution is a bias cuDNN did not fuse,
  ``aten::copy_`` a layout fix-up).

Every stage is bounded by ``--budget`` seconds: work past it is skipped and named. The
report goes to ``<out>/cnn_profile.txt`` and stdout. On CPU the tables list CPU ops (a
smoke test of the script, not a measurement).
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ------------------------------------------------------------------ models

class _ConvBN(nn.Sequential):
    def __init__(self, cin, cout, k=1, stride=1, groups=1):
        super().__init__(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout))


class _Bottleneck(nn.Module):
    def __init__(self, cin, mid, cout, stride):
        super().__init__()
        self.a, self.b, self.c = _ConvBN(cin, mid), _ConvBN(mid, mid, 3, stride), _ConvBN(mid, cout)
        self.down = _ConvBN(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x):
        y = self.c(F.relu(self.b(F.relu(self.a(x)))))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class TinyResNet(nn.Module):
    """ResNet-50's op mix at a small size: 7x7 stem, max pool, bottlenecks with
    downsampling shortcuts, global average pool, linear head."""

    def __init__(self, width=16, classes=10):
        super().__init__()
        w = width
        self.stem, self.pool = _ConvBN(3, w, 7, 2), nn.MaxPool2d(3, 2, 1)
        self.layers = nn.Sequential(_Bottleneck(w, w, 4 * w, 1), _Bottleneck(4 * w, w, 4 * w, 1),
                                    _Bottleneck(4 * w, 2 * w, 8 * w, 2))
        self.fc = nn.Linear(8 * w, classes)

    def forward(self, x):
        x = self.layers(self.pool(F.relu(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class _SE(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(s))))


class _InvertedResidual(nn.Module):
    def __init__(self, cin, mid, cout, k, stride, se, act):
        super().__init__()
        self.act = act
        self.pw, self.dw = _ConvBN(cin, mid), _ConvBN(mid, mid, k, stride, groups=mid)
        self.se = _SE(mid) if se else nn.Identity()
        self.pwl = _ConvBN(mid, cout)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.pwl(self.se(self.act(self.dw(self.act(self.pw(x))))))
        return x + y if self.residual else y


class TinyMobileNetV3(nn.Module):
    """MobileNetV3's op mix at a small size: hardswish stem, inverted residuals with
    depthwise convolutions, squeeze-excitation (mean, 1x1 convolutions with bias, ReLU,
    hardsigmoid, multiply), a 1x1 head convolution with bias and hardswish."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = _ConvBN(3, 16, 3, 2)
        self.blocks = nn.Sequential(
            _InvertedResidual(16, 16, 16, 3, 1, False, F.relu),
            _InvertedResidual(16, 64, 24, 3, 2, False, F.relu),
            _InvertedResidual(24, 72, 24, 5, 1, True, F.relu),
            _InvertedResidual(24, 96, 40, 5, 2, True, F.hardswish),
            _InvertedResidual(40, 120, 40, 3, 1, True, F.hardswish))
        self.head = nn.Conv2d(40, 128, 1)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = self.blocks(F.hardswish(self.stem(x)))
        x = F.hardswish(self.head(F.adaptive_avg_pool2d(x, 1)))
        return self.fc(torch.flatten(x, 1))


def build_model(name: str):
    """``(module, source)`` for timm ``name``, else torchvision's equivalent, else the
    hand-written module of the same family (random weights, nothing downloaded)."""
    torch.manual_seed(0)
    try:
        import timm
        return timm.create_model(name, pretrained=False), f"timm {name}"
    except ImportError:
        pass
    tv = {"resnet50": "resnet50", "mobilenetv3_large_100": "mobilenet_v3_large"}[name]
    try:
        import torchvision
        return getattr(torchvision.models, tv)(weights=None), f"torchvision {tv}"
    except ImportError:
        pass
    cls = TinyResNet if name == "resnet50" else TinyMobileNetV3
    return cls(), f"{cls.__name__} (neither timm nor torchvision is installed)"


# ------------------------------------------------------------------ compilers

#: ``coil-base``: coil without the convolution epilogues of coil/ir/lowering_conv.py (the A/B)
BASE_OPTIONS = {"conv_bias_epilogue": False, "lower_max_pool": False, "conv_matvec_max_macs": 0}


def make_callable(model: nn.Module, how: str):
    """The callable under test: the module itself (eager), ``coil.compile`` (``coil``;
    ``coil-base`` with :data:`BASE_OPTIONS`) or ``torch.compile`` (``inductor``); default
    mode, ``dynamic=False`` (one static graph per batch); a ``-ro`` suffix (``coil-ro``,
    ``inductor-ro``): ``mode="reduce-overhead"`` (CUDA graphs), as ``coil bench --mode
    reduce-overhead`` runs them."""
    mode = "reduce-overhead" if how.endswith("-ro") else None
    how = how[:-3] if mode else how
    if how == "eager":
        return model
    if how in ("coil", "coil-base"):
        import coil
        return coil.compile(model, dynamic=False, mode=mode,
                            options=BASE_OPTIONS if how == "coil-base" else None)
    return torch.compile(model, dynamic=False, mode=mode)


def reset_compilers() -> None:
    import coil
    coil.reset()
    torch._dynamo.reset()


# ------------------------------------------------------------------ kernel names

_CONV_RE = re.compile(r"conv|fprop|implicit_gemm|implicit_convolve|winograd|dwconv|depthwise|"
                      r"cudnn|xmma_(?!gemm)|nhwckrsc|nchwkcrs", re.I)
_CONVERT_RE = re.compile(r"nchwToNhwc|nhwcToNchw|transpose|convertTensor|nchw2nhwc|nhwc2nchw", re.I)


def kernel_kind(name: str) -> str:
    """What a device kernel's name says it is: ``conv NHWC`` / ``conv NCHW`` /
    ``conv ?`` (a convolution in that memory format), ``layout conversion``,
    ``generated`` (Triton), ``gemm`` or ``other``."""
    low = name.lower()
    if _CONVERT_RE.search(name):
        return "layout conversion"
    if low.startswith("triton") or "triton_" in low:
        return "generated"
    if "conv_depthwise2d" in low:
        return "conv NCHW"  # ATen's own depthwise kernel works on NCHW tensors
    if _CONV_RE.search(name) and "gemm" not in low.replace("implicit_gemm", ""):
        if "nhwc" in low or "nhwckrsc" in low:
            return "conv NHWC"
        if "nchw" in low:
            return "conv NCHW"
        return "conv ?"
    if "gemm" in low or "nvjet" in low or low.startswith("cutlass"):
        return "gemm"
    return "other"


# ------------------------------------------------------------------ measurement

def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def wall_ms(step, dev, steps: int) -> float:
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(dev)
    return (time.perf_counter() - t0) / steps * 1e3


def host_ms(step, dev, steps: int) -> float:
    """Median ms the Python call takes with the GPU idle before it (no synchronize after:
    the host's own cost of launching one forward: guards, wrappers, launches)."""
    times = []
    for _ in range(steps):
        _sync(dev)
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    _sync(dev)
    return sorted(times)[len(times) // 2] * 1e3


def graph_replay_ms(step, dev, steps: int):
    """ms per replay of ``step`` recorded into one CUDA graph (None off CUDA), or the
    error that stopped the recording."""
    if dev.type != "cuda":
        return None
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        g.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / steps
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return f"not recorded: {type(e).__name__}: {str(e).splitlines()[0][:120]}"


def profile_steps(step, dev, steps: int):
    """``(device_kernels, host_ops)``: per name, ``[total µs, calls]`` over ``steps``
    calls. On CPU the "kernels" are the CPU ops themselves (self time)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as p:
        for _ in range(steps):
            step()
        _sync(dev)
    kernels, host = {}, {}
    for e in p.events():
        dtype = getattr(e, "device_type", None)
        on_device = dtype is not None and dtype.name == "CUDA"
        if dev.type == "cuda" and on_device:
            t = getattr(e, "device_time_total", None)  # µs of this one kernel
            if t is None:
                t = getattr(e, "cuda_time_total", 0.0)
            k = kernels.setdefault(e.name, [0.0, 0])
            k[0] += t
            k[1] += 1
        elif not on_device and e.name.startswith("aten::"):
            h = host.setdefault(e.name, [0.0, 0])
            h[0] += e.self_cpu_time_total
            h[1] += 1
    if dev.type != "cuda":
        kernels = {n: v for n, v in host.items()}
    return kernels, host


def max_diff(out, ref) -> float:
    out = out[0] if isinstance(out, (tuple, list)) else out
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
    return (out.float() - ref.float()).abs().max().item()


# ------------------------------------------------------------------ report

def reporter(path: str):
    """A ``rep(line)`` that prints ``line`` to stdout and to the file ``path``."""
    f = open(path, "w")

    def rep(line: str = "") -> None:
        for stream in (sys.stdout, f):
            print(line, file=stream, flush=True)
    return rep


def run_case(rep, name: str, batch: int, dev: torch.device, res: int, compilers,
             steps: int, deadline: float, summary: list) -> None:
    base, src = build_model(name)
    base = base.eval().to(dev, torch.bfloat16)
    torch.manual_seed(1)
    x = torch.randn(batch, 3, res, res, device=dev).to(torch.bfloat16)
    with torch.no_grad():
        ref = base(x)
    rep(f"\n=== {name} batch {batch} ({src}), {batch}x3x{res}x{res} bf16, eval, no_grad")
    for how in compilers:
        if time.perf_counter() > deadline:
            rep(f"  [{how}] skipped: past the time budget")
            summary.append((name, batch, how, None, None, None, None, "skipped (budget)"))
            continue
        reset_compilers()
        model = copy.deepcopy(base)
        fn = make_callable(model, how)

        def step():
            with torch.no_grad():
                return fn(x)
        try:
            t0 = time.perf_counter()
            out = step()
            _sync(dev)
            first = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - one compiler failing is a result
            rep(f"  [{how}] failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            traceback.print_exc()
            summary.append((name, batch, how, None, None, None, None, f"error {type(e).__name__}"))
            continue
        diff = max_diff(out, ref)
        for _ in range(3):
            step()
        wall = wall_ms(step, dev, steps)
        hms = host_ms(step, dev, steps)
        kernels, host = profile_steps(step, dev, steps)
        graph = graph_replay_ms(step, dev, steps) if not how.endswith("-ro") else "n/a (CUDA graphs already)"
        gpu_us = sum(v[0] for v in kernels.values()) / steps
        launches = sum(v[1] for v in kernels.values()) / steps
        graph_s = f"{graph:.3f} ms" if isinstance(graph, float) else str(graph)
        rep(f"\n  [{how}] first call {first:.1f} s, max |out - eager| {diff:.3g}; wall {wall:.3f} ms"
            f" per forward (host {hms:.3f} ms of it with the GPU idle), {'GPU' if dev.type == 'cuda' else 'CPU op'} time {gpu_us / 1e3:.3f} ms"
            f" in {launches:.0f} kernels per forward; CUDA graph replay {graph_s}")
        summary.append((name, batch, how, wall, gpu_us / 1e3, launches,
                        graph if isinstance(graph, float) else None, f"host {hms:.3f}"))
        # memory formats of the convolutions and layout conversions
        kinds: dict = {}
        for kname, (t, n) in kernels.items():
            kk = kernel_kind(kname)
            agg = kinds.setdefault(kk, [0.0, 0])
            agg[0] += t
            agg[1] += n
        rep("    by kind:   " + "; ".join(f"{k} {v[0] / steps:.1f} µs x{v[1] / steps:.0f}"
                                          for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])))
        rep(f"    {'µs/fwd':>9} {'calls':>6}  {'kind':<17} kernel")
        top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:25]
        for kname, (t, n) in top:
            rep(f"    {t / steps:9.1f} {n / steps:6.1f}  {kernel_kind(kname):<17} {kname[:140]}")
        ops = sorted(host.items(), key=lambda kv: -kv[1][1])[:12]
        rep("    host ATen ops per forward: " + ", ".join(f"{k[6:]} x{v[1] / steps:.0f}" for k, v in ops))
        del fn, model
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="directory for cnn_profile.txt")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", nargs="+", default=["resnet50", "mobilenetv3_large_100"])
    ap.add_argument("--batches", nargs="+", type=int, default=None,
                    help="default: 1 32 on CUDA, 1 2 on CPU")
    ap.add_argument("--res", type=int, default=None, help="default: 224 on CUDA, 32 on CPU")
    ap.add_argument("--compilers", nargs="+", default=["eager", "coil", "inductor"],
                    help="of eager, coil, coil-base (coil without the conv epilogues), inductor; "
                         "coil-ro / coil-base-ro / inductor-ro: mode='reduce-overhead'")
    ap.add_argument("--steps", type=int, default=None, help="default: 20 on CUDA, 2 on CPU")
    ap.add_argument("--budget", type=float, default=215.0,
                    help="seconds after which remaining compilers/cases are skipped")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    batches = a.batches or ([1, 32] if cuda else [1, 2])
    res = a.res or (224 if cuda else 32)
    steps = a.steps or (20 if cuda else 2)
    os.makedirs(a.out, exist_ok=True)
    rep = reporter(os.path.join(a.out, "cnn_profile.txt"))
    import coil
    from coil.config import config
    rep(f"torch {torch.__version__}, device {torch.cuda.get_device_name() if cuda else 'cpu'}; "
        f"coil config: conv_channels_last={config.conv_channels_last}, "
        f"conv_channels_last_weights={config.conv_channels_last_weights}, "
        f"conv_bias_epilogue={config.conv_bias_epilogue}, lower_max_pool={config.lower_max_pool}, "
        f"conv_matvec_max_macs={config.conv_matvec_max_macs}; "
        f"cudnn.benchmark={torch.backends.cudnn.benchmark}; coil at {os.path.dirname(coil.__file__)}")
    start = time.perf_counter()
    deadline = start + a.budget
    summary: list = []
    for batch in batches:  # batch 1 first: the reduce-overhead rows
        for name in a.models:
            run_case(rep, name, batch, dev, res, a.compilers, steps, deadline, summary)
    rep(f"\n=== summary ({time.perf_counter() - start:.0f} s): ms per forward")
    rep(f"{'model':<24}{'batch':>6} {'compiler':<10}{'wall':>9}{'gpu':>9}{'kernels':>9}{'graph':>9}")
    for name, batch, how, wall, gpu, n, graph, note in summary:
        def f(v, fmt="{:9.3f}"):
            return fmt.format(v) if isinstance(v, float) else f"{'-':>9}"
        rep(f"{name:<24}{batch:>6} {how:<10}{f(wall)}{f(gpu)}{f(n, '{:9.0f}')}{f(graph)} {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
