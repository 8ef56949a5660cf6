"""Which outputs of a broad-suite row fail the accuracy rule, and under which coil options.

    python benchmarks/gpu_accuracy_diag.py --model b_convnext_tiny_cl --mode train \
        --variant default --variant conv_channels_last_training=0 [--inductor]

One float64 reference step and one eager step (the mode's precision; training under bf16
autocast on CUDA) as ``coil bench`` makes them, then one step of coil per ``--variant``
(``name=value,...`` coil options; ``default``: none) and of torch.compile with
``--inductor``. Per output (the loss, then each parameter's gradient by name): the
reference's rms, eager's rmse against the reference, each compiler's rmse as a multiple
of eager's, and whether it passes ``coil.bench.measure.compare``'s rule; the worst
``--top`` outputs per compiler are printed, and every failing one.
"""
from __future__ import annotations

import argparse
import sys

import torch


def _value(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v.lower(), v)


def _options(variant: str) -> dict:
    if variant == "default":
        return {}
    return {k: _value(v) for k, v in (kv.split("=", 1) for kv in variant.split(","))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", default="train")
    ap.add_argument("--variant", action="append", default=None)
    ap.add_argument("--inductor", action="store_true")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seeds", type=int, default=0,
                    help="instead: N fresh random inputs; per seed, the forward's output error "
                         "and its mean's error (the loss) for eager, coil and torch.compile")
    a = ap.parse_args()
    import coil
    from coil.bench import measure, suite
    from coil.bench.broad import BROAD_MODELS

    device = suite.resolve_device(a.device)
    built = BROAD_MODELS[a.model].build(device, "full" if device.type == "cuda" else "small")
    print(f"{a.model} ({built.config}), mode {a.mode}, {device}, torch {torch.__version__}")
    if a.seeds:
        return _seeds(built, a, device)
    ref, eager = suite._reference_outputs(built, a.mode, device)
    names = ["loss"] + [n for n, p in built.module.named_parameters() if p.requires_grad] \
        if a.mode == "train" else [f"output {i}" for i in range(len(ref))]
    low = a.mode == "train" and device.type == "cuda"
    runs = {}
    for variant in a.variant or ["default"]:
        coil.reset()
        m = suite._prepared_copy(built.module, a.mode, suite._mode_dtype(a.mode))
        f = coil.compile(m, options=_options(variant) or None)
        runs[f"coil {variant}"] = suite._detach(suite.make_step(
            f, suite._trainable(m), suite._cast_inputs(built.args, suite._mode_dtype(a.mode)),
            suite._cast_inputs(built.kwargs, suite._mode_dtype(a.mode)), a.mode, device)())
    if a.inductor:
        import torch._dynamo as dynamo
        dynamo.reset()
        m = suite._prepared_copy(built.module, a.mode, suite._mode_dtype(a.mode))
        runs["torch.compile"] = suite._detach(suite.make_step(
            torch.compile(m), suite._trainable(m), suite._cast_inputs(built.args, suite._mode_dtype(a.mode)),
            suite._cast_inputs(built.kwargs, suite._mode_dtype(a.mode)), a.mode, device)())
    for label, out in runs.items():
        verdict = measure.compare(ref, eager, out, low_precision=low)
        print(f"\n== {label}: {'pass' if verdict.ok else 'FAIL: ' + verdict.reason}")
        rows = []
        for i, (r, e, c) in enumerate(zip(ref, eager, out)):
            if not r.is_floating_point():
                continue
            one = measure.compare([r], [e], [c], low_precision=low)
            e_err, c_err = measure.rmse(r, e), measure.rmse(r, c)
            rows.append((c_err / max(e_err, 1e-30), i, measure.rmse(r, torch.zeros_like(r)), e_err, c_err, one.ok))
        rows.sort(reverse=True)
        print(f"   {'output':48s} {'ref rms':>10s} {'eager err':>10s} {'err':>10s} {'x eager':>8s}")
        for ratio, i, rms, e_err, c_err, ok in rows[:a.top] + [r for r in rows[a.top:] if not r[5]]:
            print(f"   {names[i][-48:]:48s} {rms:10.3g} {e_err:10.3g} {c_err:10.3g} {ratio:8.2f}"
                  f"{'' if ok else '  FAIL'}")
    sys.stdout.flush()


def _seeds(built, a, device) -> None:
    """Forward-only error statistics over ``a.seeds`` random inputs: the output's rmse
    against the float64 model and the error of its mean (the training loss), per
    compiler, so a loss that fails the rule can be told from rounding luck."""
    import coil
    from coil.bench import measure, suite
    from coil.bench.models import flatten_outputs, reduce_to_scalar_loss

    def copy(dtype):
        return suite._prepared_copy(built.module, a.mode, dtype)

    ref_m = copy(torch.float64)
    fns = {"eager": copy(torch.float32)}
    coil.reset()
    fns["coil"] = coil.compile(copy(torch.float32))
    if a.inductor:
        fns["torch.compile"] = torch.compile(copy(torch.float32))
    print(f"{'seed':>4s} " + " ".join(f"{k + ' out':>14s} {k + ' loss':>14s}" for k in fns))
    sums = {k: [0.0, 0.0] for k in fns}
    for seed in range(a.seeds):
        torch.manual_seed(seed)
        args = [torch.randn_like(t) * t.float().std() + t.float().mean()
                if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                for t in built.args]
        with torch.no_grad():
            r_out = flatten_outputs(ref_m(*suite._cast_inputs(args, torch.float64)))
        r_loss = reduce_to_scalar_loss(r_out)
        cells = []
        for k, f in fns.items():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                out = flatten_outputs(f(*args))
            loss = reduce_to_scalar_loss(out).detach().double()
            o_err = measure.rmse(r_out[0], out[0].detach())
            l_err = abs(float(loss - r_loss))
            sums[k][0] += o_err ** 2
            sums[k][1] += l_err ** 2
            cells.append(f"{o_err:14.3g} {l_err:14.3g}")
        print(f"{seed:4d} " + " ".join(cells))
    print(f"{'rms':>4s} " + " ".join(f"{(o / a.seeds) ** .5:14.3g} {(l / a.seeds) ** .5:14.3g}"
                                    for o, l in sums.values()))


if __name__ == "__main__":
    main()
