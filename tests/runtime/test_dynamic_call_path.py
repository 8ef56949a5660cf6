"""The per-call path of a graph compiled with dynamic sizes (docs/dynamic_shapes.md,
"Per-call cost"): every size expression (guards, the wrapper's sizes and buffers,
the AOT epilogue's views, launch grids) was compiled to plain Python once, so a call
runs no sympy and no ShapeEnv code."""
import sys

import pytest
import torch
import torch._dynamo

import coil
from coil.backends.registry import coil_backend_entry
from coil.config import patch


def _modules_run(fn, *args) -> set:
    seen: set = set()

    def prof(frame, event, arg):
        if event == "call":
            seen.add(frame.f_globals.get("__name__", "?"))
    sys.setprofile(prof)
    try:
        for _ in range(3):
            fn(*args)
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("entry", ["coil", "torch"])
def test_dynamic_call_runs_no_sympy(backend, entry):
    def fn(x, y):
        return x * y + 1, x.t()[: x.shape[1] // 2]  # a kernel, and a view rebuilt per call

    torch._dynamo.reset()
    coil.reset()
    with patch(cpu_backend=backend):
        f = coil.compile(fn, dynamic=True) if entry == "coil" else \
            torch.compile(fn, backend=coil_backend_entry, dynamic=True)
        for n in (5, 9):
            f(torch.randn(n, 6), torch.randn(6))  # compiles, then picks a new launch bucket
        x, y = torch.randn(7, 6), torch.randn(6)
        seen = _modules_run(f, x, y)
        for got, exp in zip(f(x, y), fn(x, y)):
            torch.testing.assert_close(got, exp)
    assert "coil.runtime.triton_dynamic" in seen or backend == "cpp"  # the path was traced
    assert not {m for m in seen if m.startswith(("sympy", "torch.fx.experimental", "torch.utils._sympy"))}, seen
