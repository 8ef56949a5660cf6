"""Sweep the broad suite's small models on CPU with coil's GPU-only paths emulated, looking for silent wrong values.

Usage (one process at a time; each row runs in its own child process under a time limit)::

    PYTHONPATH=. OMP_NUM_THREADS=1 nice python benchmarks/emu_sweep.py \
        [--models b_gpt2,b_bert] [--modes bf16,train,amp] [--backends triton,cpp] \
        [--dynamic] [--persistent-rnumel N] [--timeout 600] [--out /tmp/emu_sweep.jsonl]

One row in this process, printing the tensors whose error is over 3x eager's::

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/emu_sweep.py --child b_xlm_roberta,train,triton --detail

Without ``--models`` every model of ``coil.bench.broad.BROAD`` runs, in the order of ``--order`` (a file of names,
default: BROAD's order). Each row prints one JSON line (also appended to ``--out``): model, mode, backend, status
(ok | mismatch | error | timeout), seconds, and the reason.

What a row does (the bench's own step and accuracy rule, coil/bench/suite.py and measure.py):

- builds ``BROAD_MODELS[name].build(cpu, "small")``; the float64 reference and the eager result come from
  ``suite._reference_outputs`` (bf16: bf16 weights and inputs, no_grad; train: float32 forward + backward, as the bench
  runs training on CPU; amp: the same under ``torch.autocast("cpu", bfloat16)``, the GPU's AMP step, judged with the
  bench's low-precision rule);
- compiles a fresh copy with ``coil.compile(options={"cpu_backend": backend, "strict_codegen": True})`` and compares
  its first step with ``measure.compare``;
- ``--dynamic``: compiles with ``dynamic=True`` and runs a second step on the inputs at another batch size (batch 3:
  the first row appended), judged against a reference of its own (dynamic launchers choose configs per size bucket).

Emulation (set in the child before anything compiles): ``TRITON_INTERPRET=1``; for the triton backend
``COIL_TRITON_CHECK_CONFIGS=1`` (masks and launch configs decided as for a GPU, every candidate config run and
compared at a kernel's first launch per bucket); the GPU-only lowering paths turned on for "cpu":
``coil.ir.graph._CHANNELS_LAST_DEVICES`` / ``_PAD_DEVICES``, ``coil.ir.lowering._GPU_SPLIT_DEVICES``,
``coil.aot.functional._CUDNN_LAYOUT_DEVICES``, ``coil.ir.upcast_matmul.DEVICES`` (with a CPU ``aten.mm.dtype``
kernel accumulating in float32, as the tests register). ``--persistent-rnumel N`` lowers
``triton_persistent_rnumel`` so small models reach the looped reductions that full-size models run on a GPU.

timm is optional: without it the timm CNNs ResNet-50, ConvNeXt-T, EfficientNet-B0 (and their channels-last rows),
RegNetY and MobileNet-V2 run as transformers' models of the same architecture (``HF_STANDINS``); the other timm rows
report an error.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


_MM_LIB = None


def _emulate(backend: str, persistent_rnumel: int) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    if backend == "triton":
        os.environ["COIL_TRITON_CHECK_CONFIGS"] = "1"
    import coil.aot.functional
    import coil.ir.graph
    import coil.ir.lowering
    from coil.config import config
    coil.ir.graph._CHANNELS_LAST_DEVICES = ("cuda", "cpu")
    coil.ir.graph._PAD_DEVICES = ("cuda", "cpu")
    coil.ir.lowering._GPU_SPLIT_DEVICES = ("cuda", "cpu")
    coil.aot.functional._CUDNN_LAYOUT_DEVICES = ("cuda", "cpu")
    import coil.ir.upcast_matmul   # AMP weight gradients' bf16 mm with a float32 result (where aten.mm.dtype runs)
    coil.ir.upcast_matmul.DEVICES = ("cuda", "cpu")
    import torch   # (CPU has no aten.mm.dtype kernel: one with cuBLAS's float32 accumulation, as the tests register)
    global _MM_LIB
    _MM_LIB = torch.library.Library("aten", "IMPL")
    _MM_LIB.impl("mm.dtype", lambda a, b, dt: torch.mm(a.float(), b.float()).to(dt), "CPU")
    if backend == "triton":
        config.triton_check_configs = True
        if persistent_rnumel:
            config.triton_persistent_rnumel = persistent_rnumel
        from coil.runtime import triton_runtime as tr
        init, checked = tr.TritonLauncher.__init__, tr.TritonLauncher._checked

        def counting_init(self, *a, **k):
            COUNTS["kernels"] += 1
            init(self, *a, **k)

        def counting_checked(self, run, launch):
            COUNTS["checked"] += 1
            COUNTS["configs"] += len(self.configs)
            return checked(self, run, launch)
        tr.TritonLauncher.__init__, tr.TritonLauncher._checked = counting_init, counting_checked


#: Triton launchers made, checked launch paths and their candidate configs (the row reports them)
COUNTS = {"kernels": 0, "checked": 0, "configs": 0}


def _grow_batch(obj, b: int):
    """``obj`` with every tensor of batch ``b`` grown to ``b + 1`` (its first row appended)."""
    import torch
    if isinstance(obj, torch.Tensor):
        return torch.cat([obj, obj[:1]]) if obj.dim() and obj.shape[0] == b else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_grow_batch(o, b) for o in obj)
    if isinstance(obj, dict):
        return {k: _grow_batch(v, b) for k, v in obj.items()}
    return obj


#: transformers stand-ins for the timm CNNs when timm is not importable (same architecture family, the same batch 2 x
#: 3 x 64 x 64 input): model class, config class, config overrides
HF_STANDINS = {
    "b_resnet50": ("ResNetForImageClassification", "ResNetConfig", {}),   # ResNet-50
    "b_convnext_tiny": ("ConvNextForImageClassification", "ConvNextConfig", {}),   # ConvNeXt-T
    "b_regnety_016": ("RegNetForImageClassification", "RegNetConfig", {}),   # RegNetY (group conv + SE)
    "b_efficientnet_b0": ("EfficientNetForImageClassification", "EfficientNetConfig",
                          dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280,
                               drop_connect_rate=0.0, dropout_rate=0.0)),   # B0
    "b_mobilenetv2": ("MobileNetV2ForImageClassification", "MobileNetV2Config", {}),
}
for _n in ("b_resnet50", "b_convnext_tiny", "b_efficientnet_b0"):
    HF_STANDINS[_n + "_cl"] = HF_STANDINS[_n]


def _build(name: str, dev):
    """``BROAD_MODELS[name].build(dev, "small")``, or its transformers stand-in when timm is not importable."""
    import importlib.util
    from coil.bench.broad import BROAD_MODELS
    spec = BROAD_MODELS[name]
    if spec.source != "timm" or importlib.util.find_spec("timm") is not None:
        return spec.build(dev, "small"), ""
    if name not in HF_STANDINS:
        raise ModuleNotFoundError("timm is not installed and the model has no transformers stand-in")
    import torch
    import transformers
    from coil.bench.broad import _derandomize
    from coil.bench.models import BuiltModel, _image
    cls, conf_cls, over = HF_STANDINS[name]
    conf = getattr(transformers, conf_cls)(**over)
    _derandomize(conf)
    torch.manual_seed(0)
    m, x = getattr(transformers, cls)(conf).to(dev), _image(2, 64, dev)
    if name.endswith("_cl"):
        m, x = m.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    return BuiltModel(m, (x,), {}, cls), "transformers " + cls


def run_row(name: str, mode: str, backend: str, dynamic: bool, persistent_rnumel: int) -> dict:
    """One (model, mode, backend) row in this process; returns its result dict."""
    _emulate(backend, persistent_rnumel)
    import torch
    import coil
    from coil.bench import measure, suite

    torch.manual_seed(0)
    dev = torch.device("cpu")
    built, standin = _build(name, dev)
    if standin:
        COUNTS["standin"] = standin
    bench_mode = "train" if mode == "amp" else mode
    amp = mode == "amp"
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32

    def reference(args, kwargs):
        ref = suite._detach(suite._step_on_copy(built.module, args, kwargs, bench_mode, dev, torch.float64,
                                                autocast=False)())
        eager = suite._detach(suite._step_on_copy(built.module, args, kwargs, bench_mode, dev, autocast=amp)())
        return ref, eager

    m = suite._prepared_copy(built.module, bench_mode, dtype)
    compiled = coil.compile(m, dynamic=True if dynamic else None,
                            options={"cpu_backend": backend, "strict_codegen": True})
    params = suite._trainable(m)
    calls = [(built.args, built.kwargs)]
    if dynamic:
        b = next(t.shape[0] for t in list(built.args) + list(built.kwargs.values()) if isinstance(t, torch.Tensor))
        calls.append((_grow_batch(built.args, b), _grow_batch(built.kwargs, b)))
    worst = []
    for i, (args, kwargs) in enumerate(calls):
        ref, eager = reference(args, kwargs)
        step = suite.make_step(compiled, params, suite._cast_inputs(args, dtype), suite._cast_inputs(kwargs, dtype),
                               bench_mode, dev, autocast=amp)
        out = suite._detach(step())
        v = measure.compare(ref, eager, out, low_precision=amp)
        if DETAIL:
            _detail(ref, eager, out, ["loss"] + [n for n, q in m.named_parameters() if q.requires_grad]
                    if bench_mode == "train" else [f"out{j}" for j in range(len(ref))])
        worst.append(v.worst_ratio)
        if not v.ok:
            return {"status": "mismatch", "call": i, "reason": v.reason, "worst_ratio": v.worst_ratio, **COUNTS}
    return {"status": "ok", "worst_ratio": worst, **COUNTS}


DETAIL = False   # --detail: print each tensor whose error is over 3x eager's (name, errors, worst element)


def _detail(ref, eager, out, names) -> None:
    import torch
    from coil.bench import measure
    for n, r, e, c in zip(names, ref, eager, out):
        if not r.is_floating_point():
            continue
        r64, e64, c64 = (t.detach().double() for t in (r, e, c))
        e_err, c_err = measure.rmse(r64, e64), measure.rmse(r64, c64)
        if c_err > 3 * e_err:
            d = (c64 - r64).abs()
            i = int(d.argmax())
            print(f"DETAIL {n} shape={tuple(r.shape)} ref_rms={measure.rmse(r64, torch.zeros_like(r64)):.3g} "
                  f"eager_err={e_err:.3g} coil_err={c_err:.3g} max|coil-ref|={float(d.max()):.3g} at {i} "
                  f"(ref {float(r64.flatten()[i]):.4g}, eager {float(e64.flatten()[i]):.4g}, "
                  f"coil {float(c64.flatten()[i]):.4g}) max|eager-ref|={float((e64 - r64).abs().max()):.3g}",
                  flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="")
    p.add_argument("--order", default="")
    p.add_argument("--modes", default="bf16,train")
    p.add_argument("--backends", default="triton,cpp")
    p.add_argument("--dynamic", action="store_true")
    p.add_argument("--persistent-rnumel", type=int, default=0)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--out", default="/tmp/emu_sweep.jsonl")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--detail", action="store_true", help="with --child: print the tensors over 3x eager's error")
    a = p.parse_args()
    if a.child:   # model,mode,backend in this process
        global DETAIL
        DETAIL = a.detail
        name, mode, backend = a.child.split(",")
        try:
            res = run_row(name, mode, backend, a.dynamic, a.persistent_rnumel)
        except BaseException as e:   # noqa: BLE001 (reported as the row's error)
            import traceback
            traceback.print_exc()
            res = {"status": "error", "reason": f"{type(e).__name__}: {str(e)[:600]}"}
        print("ROW " + json.dumps(res), flush=True)
        return
    if a.models:
        names = a.models.split(",")
    elif a.order:
        names = [ln.split()[0] for ln in open(a.order) if ln.strip() and not ln.startswith("#")]
    else:
        from coil.bench.broad import BROAD
        names = BROAD
    for name in names:
        for mode in a.modes.split(","):
            for backend in a.backends.split(","):
                t0 = time.time()
                cmd = [sys.executable, __file__, "--child", f"{name},{mode},{backend}",
                       "--persistent-rnumel", str(a.persistent_rnumel)] + (["--dynamic"] if a.dynamic else [])
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("ROW ")), None)
                    res = json.loads(line[4:]) if line else {
                        "status": "error", "reason": f"rc {r.returncode}: {r.stderr[-600:]}"}
                    if res["status"] == "error":
                        res["tail"] = r.stderr[-3000:]
                except subprocess.TimeoutExpired:
                    res = {"status": "timeout", "reason": f"over {a.timeout} s"}
                res.update(model=name, mode=mode, backend=backend, dynamic=a.dynamic,
                           persistent_rnumel=a.persistent_rnumel, seconds=round(time.time() - t0, 1))
                short = {k: v for k, v in res.items() if k != "tail"}
                print(json.dumps(short), flush=True)
                with open(a.out, "a") as f:
                    f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
