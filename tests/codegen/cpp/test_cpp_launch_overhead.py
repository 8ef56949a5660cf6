"""Per-call cost of launching a C++ kernel from Python vs an eager op (docs/cpp_backend.md,
"The wrapper: Python, measured"). Run ``pytest -s -m slow`` on this file to print the
numbers; the non-slow test only guards against a launch path gone badly wrong."""
import time

import pytest
import sympy
import torch

pytest.importorskip("coil.codegen.backend")

from coil.codegen.cpp.kernel import CppKernel  # noqa: E402
from coil.codegen.cpp.launch import CppLauncher, prelude  # noqa: E402
from coil.ir.symbols import XINDEX as X  # noqa: E402
from coil.ir.virtualized import ops, set_ops_handler  # noqa: E402


class _B:
    def get_dtype(self):
        return torch.float32


class _N:
    in_loop, loop_id = True, 0

    def run(self, h):
        with set_ops_handler(h):
            ops.store("o", X, ops.add(ops.load("a", X), ops.load("b", X)))


class _P:
    numel, rnumel, nodes, removed_names = sympy.Integer(64), sympy.Integer(1), [_N()], []

    def buffer(self, n):
        return _B()


def _per_call_us(fn, n):
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def _measure(n):
    k = CppKernel(_P(), "launch_overhead_add", 1)
    src = k.source()
    launch = CppLauncher(prelude() + src, k.name, len(k.arg_names()), k.has_checks).wait()
    a, b, o = torch.randn(64), torch.randn(64), torch.empty(64)
    t = {"a": a, "b": b, "o": o}
    args = [t[x] for x in k.arg_names()]
    launch(*args)
    torch.testing.assert_close(o, a + b)
    return {"launch": _per_call_us(lambda: launch(*args), n),
            "eager_add_out": _per_call_us(lambda: torch.add(a, b, out=o), n),
            "empty": _per_call_us(lambda: torch.empty(64), n)}


def test_launch_is_cheap():
    r = _measure(2000)
    assert r["launch"] < 50, r


@pytest.mark.slow
def test_print_launch_overhead():
    print({k: round(v, 2) for k, v in _measure(200000).items()})
