"""A Python float that changes between calls, on every OpInfo op with autograd: ``g(inputs, s) = sum(op(...) * s)``
compiled by coil (``fallback_random``), called with s = 0.5, 0.7, 0.9 (from the second value on, ``s`` is a graph input
and training graphs take the tensorized forward, docs/aot.md "Scalar reads"); outputs and gradients against eager's
(rtol 1e-3, atol 1e-4; 2e-2 for 16-bit dtypes). The first two samples of each op in ``op_db[LO:HI]``, float32 or the
DTYPE given.

    OMP_NUM_THREADS=1 PYTHONPATH=. python tools/float_input_sweep.py 0 350 [bfloat16]   # and 350 720; ~10 min each

``INT=1`` takes s = 2, 3, 4 (a SymInt input); ``NO_GRAD=1`` compares values only, under ``no_grad`` (the inference
graph); ``DYNAMIC=1`` compiles with ``dynamic=True`` (symbolic sizes, and the float symbolic from the first call).
Prints the counts and one ``BAD (op, sample, s, kind, message)`` line per sample that differs (kind: MISMATCH,
coil_raise, missing_error)."""
import contextlib
import os
import sys
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

import coil

warnings.filterwarnings("ignore")
NO_GRAD = bool(os.environ.get("NO_GRAD"))   # values only, under no_grad: the inference graph's tensorized floats


def _loss(op, kwargs):
    def g(inp, args, s):
        out = op(inp, *args, **kwargs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        return sum((o.float() * s).sum() for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point())
    return g


def _check(op, si, sample, leaves, dtype, bad) -> str:
    """One sample at three float values: ok, skip, both_raise or bad (appended to ``bad``)."""
    g = _loss(op, sample.kwargs)
    coil.reset()
    cg = coil.compile(g, options={"fallback_random": True}, dynamic=True if os.environ.get("DYNAMIC") else None)
    tol = dict(rtol=1e-3, atol=1e-4) if dtype in (torch.float32, torch.float64) else dict(rtol=2e-2, atol=2e-2)
    for s in (2, 3, 4) if os.environ.get("INT") else (0.5, 0.7, 0.9):
        eager_raised = False
        try:
            torch.manual_seed(0)
            e = g(sample.input, sample.args, s)
            if not (isinstance(e, torch.Tensor) and (e.requires_grad or NO_GRAD)):
                return "skip"
            ge = torch.autograd.grad(e, leaves, allow_unused=True) if not NO_GRAD else ()
        except Exception:  # noqa: BLE001
            eager_raised = True
        try:
            torch.manual_seed(0)
            c = cg(sample.input, sample.args, s)
            gc = torch.autograd.grad(c, leaves, allow_unused=True) if not NO_GRAD else ()
        except Exception as ex:  # noqa: BLE001
            if eager_raised:
                return "both_raise"
            bad.append((op.name, si, s, "coil_raise", str(ex).split("\n")[0][:200]))
            return "bad"
        if eager_raised:
            bad.append((op.name, si, s, "missing_error", ""))
            return "bad"
        try:
            torch.testing.assert_close(c, e, equal_nan=True, **tol)
            for a, b in zip(gc, ge):
                if (a is None) != (b is None):
                    raise AssertionError(f"gradient None on one side only (coil {a is None}, eager {b is None})")
                if a is not None:
                    torch.testing.assert_close(a, b, equal_nan=True, **tol)
        except AssertionError as ex:
            lines = str(ex).split("\n")
            bad.append((op.name, si, s, "MISMATCH", lines[0][:200] + " | " + " ".join(lines[1:3])[:200]))
            return "bad"
    return "ok"


def main() -> None:
    lo, hi = int(sys.argv[1]), int(sys.argv[2])
    dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.float32
    res = {"ok": 0, "skip": 0, "both_raise": 0, "bad": 0}
    bad: list = []
    for op in op_db[lo:hi]:
        try:
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=True))[:2] if op.supports_autograd else []
        except Exception:  # noqa: BLE001
            samples = []
        if not samples:
            res["skip"] += 1
        for si, sample in enumerate(samples):
            leaves = [t for t in [sample.input, *sample.args] if isinstance(t, torch.Tensor) and t.requires_grad]
            if leaves:
                with torch.no_grad() if NO_GRAD else contextlib.nullcontext():
                    res[_check(op, si, sample, leaves, dtype, bad)] += 1
    print(res)
    for b in bad:
        print("BAD", b)


if __name__ == "__main__":
    main()
