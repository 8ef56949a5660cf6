"""GPU diagnostics for the lent machine: where coil's training rows go wrong and where its
bf16 inference time goes, in one process.

    python benchmarks/gpu_diag.py grads small_gpt hf_llama   # per-gradient error vs fp64
    python benchmarks/gpu_diag.py profile hf_gpt2            # top CUDA kernels per compiler
    python benchmarks/gpu_diag.py profile-train hf_gpt2      # the same for a training step

``grads``: builds the model, runs one autocast-bf16 training step with eager, with coil's
``aot_eager`` backend (capture + AOT, no codegen) and with the full ``coil`` backend, and
prints for each the loss and, per gradient, max|g - g_fp64| divided by eager's own error
(so a ratio near 1 means "as accurate as eager"). The worst tensors are listed; a full
traceback is printed for a failing backend.

``profile``: times ``bf16`` inference with ``torch.profiler`` for eager, coil and
torch.compile and prints the 25 most expensive CUDA kernels of each (µs per step), and
the number of kernel launches per step.

``host``: bf16 inference wall and host time per step for coil and torch.compile, and
coil's cProfile (own time per function) — where the launch overhead goes.
``hostab``: the same host times for torch.compile and coil variants, timed in shared
rounds in one process (an A/B that the host CPU's drift cannot skew).
"""
from __future__ import annotations

import copy
import sys
import traceback

import torch

from coil.bench.models import default_size, flatten_outputs, reduce_to_scalar_loss, select_models


def _cast(obj, dtype):
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast(v, dtype) for k, v in obj.items()}
    return obj


def _compile(m, how):
    if how == "eager":
        return m
    if how == "inductor":
        return torch.compile(m)
    import coil
    return coil.compile(m, backend=how)


def _train_step(fn, module, args, kwargs, autocast):
    for p in module.parameters():
        p.grad = None
    dev_type = next(module.parameters()).device.type
    with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=autocast):
        loss = reduce_to_scalar_loss(fn(*args, **kwargs))
    loss.backward()
    return loss.detach().double(), {n: (p.grad.double() if p.grad is not None else None)
                                    for n, p in module.named_parameters()}


def grads(name: str) -> None:
    import os
    dev = torch.device(os.environ.get("DIAG_DEVICE", "cuda"))  # DIAG_DEVICE=cpu: CPU autocast
    spec = select_models([name])[0]
    built = spec.build(dev, default_size(dev))
    base = built.module.train()
    ref_m = copy.deepcopy(base).double()
    ref_loss, ref_g = _train_step(ref_m, ref_m, _cast(built.args, torch.float64),
                                  _cast(built.kwargs, torch.float64), False)
    results = {}
    for how in ("eager", "aot_eager", "coil"):
        import coil
        coil.reset()
        m = copy.deepcopy(base)
        try:
            fn = _compile(m, how)
            out = [_train_step(fn, m, built.args, built.kwargs, True) for _ in range(2)]
            results[how] = out[-1]
            d = (out[0][0] - out[1][0]).abs().item()
            print(f"[{name}] {how}: loss {out[-1][0].item():.6f} (ref {ref_loss.item():.6f}); "
                  f"call1 vs call2 loss diff {d:.3g}")
        except Exception:
            print(f"[{name}] {how}: FAILED\n{traceback.format_exc()[-6000:]}")
    if "eager" not in results:
        return
    e_loss, e_g = results["eager"]
    for how in ("aot_eager", "coil"):
        if how not in results:
            continue
        loss, g = results[how]
        rows = []
        for k, r in ref_g.items():
            if r is None:
                continue
            if g.get(k) is None:
                rows.append((float("inf"), k, "missing grad"))
                continue
            ee = (e_g[k] - r).abs().max().item() + 1e-12
            ce = (g[k] - r).abs().max().item()
            rows.append((ce / ee, k, f"err {ce:.3g} eager_err {ee:.3g} |ref|max {r.abs().max().item():.3g}"))
        rows.sort(reverse=True)
        print(f"[{name}] {how}: worst gradient error ratios (coil err / eager err):")
        for ratio, k, txt in rows[:12]:
            print(f"    {ratio:10.2f}  {k}: {txt}")


def _bf16_model(name: str):
    """``(module, args, kwargs)`` of bench model ``name`` on CUDA for bf16 inference
    (module in eval mode cast to bf16, floating inputs cast to bf16)."""
    dev = torch.device("cuda")
    built = select_models([name])[0].build(dev, default_size(dev))
    return (built.module.eval().to(torch.bfloat16), _cast(built.args, torch.bfloat16),
            _cast(built.kwargs, torch.bfloat16))


def _wall_ms(step, warmup: int, steps: int) -> float:
    """Wall ms per call of ``step`` over ``steps`` calls after ``warmup`` untimed ones,
    with a CUDA synchronize before and after."""
    import time
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def profile(name: str, train: bool = False) -> None:
    """Top CUDA kernels per step for eager, coil and torch.compile.

    ``train=False``: bf16 inference (model cast to bf16, no_grad). ``train=True``: one
    training step (forward under autocast bf16, backward) like ``coil bench --mode train``.
    Prints, per compiler: CUDA kernel time per step (µs), launches per step, wall time per
    step (ms, host clock after synchronize), and the 25 most expensive kernels.
    """
    from torch.profiler import ProfilerActivity, profile as prof

    if train:
        dev = torch.device("cuda")
        built = select_models([name])[0].build(dev, default_size(dev))
        base, args, kwargs = built.module.train(), built.args, built.kwargs
    else:
        base, args, kwargs = _bf16_model(name)
    tag = "train" if train else "bf16"
    import os
    for how in os.environ.get("DIAG_COMPILERS", "eager coil inductor").split():
        import coil
        coil.reset()
        torch._dynamo.reset()
        m = copy.deepcopy(base)
        fn = _compile(m, how)

        def step():
            if train:
                _train_step(fn, m, args, kwargs, True)
            else:
                with torch.no_grad():
                    flatten_outputs(fn(*args, **kwargs))

        steps = 10
        wall = _wall_ms(step, 3, steps)
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        evs = [e for e in p.key_averages() if e.device_type.name == "CUDA" or
               getattr(e, "self_device_time_total", 0) > 0]
        key = "self_device_time_total" if hasattr(evs[0], "self_device_time_total") else "self_cuda_time_total"
        evs.sort(key=lambda e: -getattr(e, key))
        total = sum(getattr(e, key) for e in evs) / steps
        launches = sum(e.count for e in evs) / steps
        print(f"\n[{name} {tag}] {how}: {total:.0f} µs CUDA per step, {launches:.0f} kernels per step, "
              f"wall {wall:.2f} ms per step")
        for e in evs[:30]:
            print(f"    {getattr(e, key) / steps:9.1f} µs  x{e.count // steps:<4d} {e.key[:150]}")


def host(name: str) -> None:
    """Where the host time of a bf16 inference step goes, per compiler.

    Prints, per compiler in ``DIAG_COMPILERS``: wall ms per step (synchronized), host ms
    per step (the Python call alone, queued behind an idle GPU: what the CPU spends
    launching) and, for coil, the 30 functions with the most own time under cProfile
    (tottime per step, µs), so the cost per launch, per extern call, per allocation and
    of guards can be read off."""
    import cProfile
    import io
    import os
    import pstats
    import time

    base, args, kwargs = _bf16_model(name)
    for how in os.environ.get("DIAG_COMPILERS", "coil inductor").split():
        import coil
        coil.reset()
        torch._dynamo.reset()
        m = copy.deepcopy(base)
        fn = _compile(m, how)

        def step():
            with torch.no_grad():
                return fn(*args, **kwargs)

        steps = 30
        wall = _wall_ms(step, 5, steps)
        hosts = []
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            hosts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        hosts.sort()
        print(f"\n[{name} host] {how}: wall {wall:.2f} ms per step, host {hosts[len(hosts) // 2] * 1e3:.2f} ms "
              f"per step (median; min {hosts[0] * 1e3:.2f})")
        if how == "inductor":
            continue
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        pr.disable()
        buf = io.StringIO()
        st = pstats.Stats(pr, stream=buf)
        st.sort_stats("tottime").print_stats(30)
        for line in buf.getvalue().splitlines():
            print("    " + line)


def hostab(name: str) -> None:
    """A/B of host time per bf16 inference step in one process, timed in rounds so that
    the host CPU's drift hits every variant alike: torch.compile and coil variants named
    by ``DIAG_VARIANTS`` (e.g. "inductor coil coil_nocl coil_clw
    coil_nopad", coil with one option changed each; see ``known``). Prints per variant
    the median wall ms (synchronized) and host ms (the Python call alone) over 40
    rounds. For ResNet-50 also the host µs per
    ``torch.convolution`` call, NCHW vs channels-last, on a 3x3 bf16 layer."""
    import statistics
    import time
    import coil
    from coil.config import config

    dev = torch.device("cuda")
    base, args, kwargs = _bf16_model(name)
    known = {"inductor": {}, "coil": {}, "coil_nocl": {"conv_channels_last": False},
             "coil_clw": {"conv_channels_last_weights": False},
             "coil_nopad": {"pad_matmul_outputs": False}}
    import os
    variants = {t: known[t] for t in os.environ.get(
        "DIAG_VARIANTS", "inductor coil coil_nocl").split()}
    fns = {}
    for tag, opts in variants.items():
        m = copy.deepcopy(base)
        f = eval("lambda *a, **k: m(*a, **k)", {"m": m})  # a code object of its own
        fn = torch.compile(f) if tag == "inductor" else coil.compile(f)
        old = {k: getattr(config, k) for k in opts}
        for k, v in opts.items():
            setattr(config, k, v)
        try:
            with torch.no_grad():
                for _ in range(3):
                    fn(*args, **kwargs)
        finally:
            for k, v in old.items():
                setattr(config, k, v)
        torch.cuda.synchronize()
        fns[tag] = fn
    wall = {t: [] for t in fns}
    host = {t: [] for t in fns}
    with torch.no_grad():
        for _ in range(40):
            for t, fn in fns.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(*args, **kwargs)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                host[t].append(t1 - t0)
                wall[t].append(t2 - t0)
    for t in fns:
        print(f"[{name} hostab] {t}: wall {statistics.median(wall[t]) * 1e3:.2f} ms, "
              f"host {statistics.median(host[t]) * 1e3:.2f} ms (median of 40 rounds)")
    if "resnet" in name:
        x = torch.randn(32, 256, 14, 14, device=dev, dtype=torch.bfloat16)
        w = torch.randn(256, 256, 3, 3, device=dev, dtype=torch.bfloat16)
        for tag, xx, ww in (("nchw", x, w),
                            ("channels_last", x.to(memory_format=torch.channels_last),
                             w.to(memory_format=torch.channels_last))):
            with torch.no_grad():
                for _ in range(20):
                    torch.convolution(xx, ww, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(200):
                    torch.convolution(xx, ww, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
            print(f"[conv host] {tag}: host {(t1 - t0) / 200 * 1e6:.1f} µs per call, "
                  f"wall {(t2 - t0) / 200 * 1e6:.1f} µs per call")


def main(argv: list[str]) -> None:
    what, names = argv[0], argv[1:]
    for n in names:
        {"grads": grads, "profile": profile, "host": host, "hostab": hostab,
         "profile-train": lambda n: profile(n, train=True)}[what](n)


if __name__ == "__main__":
    main(sys.argv[1:])
