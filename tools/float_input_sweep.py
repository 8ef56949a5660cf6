"""A Python float that changes between calls, on every OpInfo op with autograd: ``g(inputs, s) = sum(op(...) * s)``
compiled by coil (``fallback_random``), called with s = 0.5, 0.7, 0.9 (from the second value on, ``s`` is a graph input
and training graphs take the tensorized forward, docs/aot.md "Scalar reads"); outputs and gradients against eager's
(rtol 1e-3). Float32, the first two samples of each op in ``op_db[LO:HI]``.

    OMP_NUM_THREADS=1 PYTHONPATH=. python tools/float_input_sweep.py 0 350     # and 350 720; ~10-40 min on one core

Prints the counts and one ``BAD (op, sample, s, kind, message)`` line per op that differs (kind: MISMATCH, coil_raise,
missing_error)."""
import sys, traceback, warnings, torch, coil
warnings.filterwarnings("ignore")
from torch.testing._internal.common_methods_invocations import op_db
lo, hi = int(sys.argv[1]), int(sys.argv[2])
res = {"ok": 0, "skip": 0, "both_raise": 0}
bad = []
for op in op_db[lo:hi]:
    if not op.supports_autograd:
        res["skip"] += 1; continue
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:2]
    except Exception:
        res["skip"] += 1; continue
    for si, sample in enumerate(samples):
        leaves = [t for t in [sample.input, *sample.args] if isinstance(t, torch.Tensor) and t.requires_grad]
        if not leaves:
            continue
        def g(inp, args, s, _op=op, _kw=sample.kwargs):
            out = _op(inp, *args, **_kw)
            outs = out if isinstance(out, (tuple, list)) else [out]
            return sum((o.float() * s).sum() for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point())
        coil.reset()
        cg = coil.compile(g, options={"fallback_random": True})
        for s in (0.5, 0.7, 0.9):
            verdict = None
            try:
                torch.manual_seed(0); e = g(sample.input, sample.args, s)
                if not (isinstance(e, torch.Tensor) and e.requires_grad): verdict = "skip"; break
                ge = torch.autograd.grad(e, leaves, allow_unused=True)
            except Exception:
                verdict = "eager_raise"
            try:
                torch.manual_seed(0); c = cg(sample.input, sample.args, s)
                gc = torch.autograd.grad(c, leaves, allow_unused=True)
            except Exception as ex:
                if verdict == "eager_raise": verdict = "both_raise"; break
                bad.append((op.name, si, s, "coil_raise", str(ex).split("\n")[0][:200])); verdict = "bad"; break
            if verdict == "eager_raise":
                bad.append((op.name, si, s, "missing_error", "")); break
            try:
                torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-4, equal_nan=True)
                for a, b in zip(gc, ge):
                    if (a is None) != (b is None):
                        raise AssertionError(f"grad None mismatch {a is None} {b is None}")
                    if a is not None:
                        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, equal_nan=True)
            except AssertionError as ex:
                bad.append((op.name, si, s, "MISMATCH", str(ex).split("\n")[0][:200] + " | " + " ".join(str(ex).split("\n")[1:3])[:200])); verdict = "bad"; break
        if verdict in (None,):
            res["ok"] += 1
        elif verdict in ("skip", "both_raise"):
            res[verdict] += 1
print(res)
for b in bad:
    print("BAD", b)
