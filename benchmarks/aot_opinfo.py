"""OpInfo backward conformance through coil's AOT autograd (aot_eager).

    python benchmarks/aot_opinfo.py [--ops add,mul] [--out results.md]

For every op in ``torch.testing._internal.common_methods_invocations.op_db`` that
supports autograd and float32: take its first sample input (CPU, float32,
requires_grad), compile ``op(sample)`` with ``aot_compile(..., run_graph)``, run
forward and backward with a random cotangent, and compare values and input
gradients with eager (``torch.testing.assert_close`` defaults for float32), with
``coil.config.fallback_random=True`` so random ops draw eager's numbers.

Each op ends in one of: ``pass``, ``skip`` (no sample / eager backward fails /
no differentiable output), ``compile_error``, ``run_error``, ``value_mismatch``,
``grad_mismatch``. The Markdown summary lists every non-pass with its first
error line; docs/aot.md records the causes.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch
import torch.utils._pytree as pytree

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from coil.aot import aot_compile  # noqa: E402
from coil.aot.backend import run_graph  # noqa: E402


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:160] if msg else ''}"


def check_op(op) -> tuple[str, str]:
    """Run one OpInfo; returns (status, detail)."""
    try:
        samples = op.sample_inputs("cpu", torch.float32, requires_grad=True)
        sample = next(iter(samples))
    except StopIteration:
        return "skip", "no sample"
    except Exception as e:  # noqa: BLE001
        return "skip", "sample_inputs failed: " + _first_line(e)
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    pos = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def fn(*tensors):
        vals = list(leaves)
        for i, t in zip(pos, tensors):
            vals[i] = t
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        return op(inp, *args, **kwargs)

    def fresh():
        out = []
        for i in pos:
            t = leaves[i].detach().clone()
            t.requires_grad_(leaves[i].requires_grad)
            out.append(t)
        return out

    # eager reference
    try:
        torch.manual_seed(0)
        ref_in = fresh()
        ref_out = pytree.tree_leaves(fn(*ref_in))
        diff = [o for o in ref_out if isinstance(o, torch.Tensor) and o.requires_grad]
        wrt = [t for t in ref_in if t.requires_grad]
        if not diff or not wrt:
            return "skip", "no differentiable output"
        gen = torch.Generator().manual_seed(1)
        cot = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in diff]
        ref_grads = torch.autograd.grad(diff, wrt, cot, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        return "skip", "eager backward fails: " + _first_line(e)

    try:
        from coil.config import patch

        # random ops: compare bit for bit with eager, so call the ATen RNG ops
        with patch(fallback_random=True):
            compiled = aot_compile(fn, fresh(), run_graph)
    except Exception as e:  # noqa: BLE001
        return "compile_error", _first_line(e)
    try:
        torch.manual_seed(0)
        test_in = fresh()
        test_out = pytree.tree_leaves(compiled(*test_in))
        tdiff = [o for o in test_out if isinstance(o, torch.Tensor) and o.requires_grad]
        twrt = [t for t in test_in if t.requires_grad]
        if len(tdiff) != len(diff):
            return "grad_mismatch", f"{len(tdiff)} differentiable outputs, eager has {len(diff)}"
        test_grads = torch.autograd.grad(tdiff, twrt, cot, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        return "run_error", _first_line(e)
    try:
        for a, b in zip(test_out, ref_out):
            if isinstance(b, torch.Tensor):
                torch.testing.assert_close(a, b, equal_nan=True)
    except Exception as e:  # noqa: BLE001
        return "value_mismatch", _first_line(e)
    try:
        for a, b in zip(test_grads, ref_grads):
            if b is None:
                if a is not None and a.abs().sum() != 0:
                    return "grad_mismatch", "eager grad is None, compiled is nonzero"
                continue
            if a is None:
                a = torch.zeros_like(b)
            torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-4, atol=1e-5)
    except Exception as e:  # noqa: BLE001
        return "grad_mismatch", _first_line(e)
    return "pass", ""


def select_ops():
    """OpInfos that support autograd and float32 on CPU."""
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if op.supports_autograd and torch.float32 in op.supported_dtypes("cpu")]


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def run_isolated(ids: list, results: dict) -> None:
    """Run ops in a child process, one JSON line per op; an op that kills the
    process (a C++ abort) is recorded as ``crash`` and the rest continue."""
    import json
    import subprocess

    todo = list(ids)
    while todo:
        proc = subprocess.run([sys.executable, __file__, "--worker", "--ops", ",".join(todo)],
                              capture_output=True, text=True)
        done = []
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                results[rec["op"]] = (rec["status"], rec["detail"])
                print(f"{rec['op']:<40} {rec['status']:<15} {rec['detail']}", flush=True)
                done.append(rec["op"])
        todo = [t for t in todo if t not in set(done)]
        if todo and proc.returncode != 0:
            crashed = todo.pop(0)
            tail = (proc.stderr.strip().splitlines() or [""])
            detail = next((ln for ln in tail if "what()" in ln or "Error" in ln), tail[-1])[:160]
            results[crashed] = ("crash", detail.strip())
            print(f"{crashed:<40} crash           {detail.strip()}", flush=True)
        elif todo:
            for t in todo:
                results[t] = ("harness_error", "not run")
            todo = []


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="", help="comma-separated op ids (default: all)")
    ap.add_argument("--out", default="", help="write the Markdown summary here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import json
    import warnings

    warnings.filterwarnings("ignore")
    wanted = set(args.ops.split(",")) if args.ops else None
    ops = [op for op in select_ops() if wanted is None or op_id(op) in wanted or op.name in wanted]
    if args.worker:
        for op in ops:
            try:
                status, detail = check_op(op)
            except Exception:  # noqa: BLE001
                status, detail = "harness_error", traceback.format_exc().splitlines()[-1]
            print(json.dumps({"op": op_id(op), "status": status, "detail": detail}), flush=True)
        return {}
    results: dict = {}
    run_isolated([op_id(op) for op in ops], results)
    counts: dict = {}
    for status, _ in results.values():
        counts[status] = counts.get(status, 0) + 1
    lines = [f"# OpInfo backward through aot_eager (first sample, float32, CPU), torch {torch.__version__}",
             "", "| status | ops |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(counts.items())]
    lines += ["", "| op | status | detail |", "|---|---|---|"]
    lines += [f"| {k} | {s} | {d.replace('|', '/')} |" for k, (s, d) in sorted(results.items())
              if s not in ("pass",)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return results


if __name__ == "__main__":
    main()
