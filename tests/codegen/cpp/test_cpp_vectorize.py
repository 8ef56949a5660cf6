"""Loops with selects vectorize under the build's flags (docs/cpp_backend.md, "Selects are bit masks").

With GCC's loop if-conversion off (cpp_build.DEFAULT_FLAGS), a ternary in a loop stays a branch and the loop ran
scalar: from 2026-12-02 every kernel with exp, tanh, log, relu, where or a max reduction was 4-12x slower than eager
on the CPU. The prelude's ``coil_sel`` masks compile to a compare and an and-not/or; this checks GCC's own report
(``-fopt-info-vec``) on the prelude functions and on the selects the code generator emits, and that ``coil_sel``
picks exactly one operand (NaN payloads, signed zeros).
"""
import re
import shutil
import subprocess

import pytest
import torch

import coil
from coil.codegen.cpp.launch import prelude
from coil.runtime import cpp_build

BODIES = {
    "exp": "coil_exp(a[i])",
    "expm1": "coil_expm1(a[i])",
    "log": "coil_log(a[i])",
    "tanh": "coil_tanh(a[i])",
    "ndtr": "coil_ndtr(a[i])",
    "sin": "coil_sin(a[i])",
    "cos": "coil_cos(a[i])",
    "relu_select": "coil_sel<float>(a[i] < 0, (float)0, a[i])",
    "max_prop": "coil_max_prop_(a[i], 0.5f)",
    "bf16_round": "coil_round_bf16(a[i])",
}


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ for its vectorizer report")
@pytest.mark.parametrize("name", sorted(BODIES))
def test_prelude_loops_vectorize(name, tmp_path):
    src = tmp_path / "k.cpp"
    src.write_text(prelude() + f"""
extern "C" void k(const float* __restrict__ a, float* __restrict__ b, int64_t n) {{
  #pragma omp simd
  for (int64_t i = 0; i < n; ++i) b[i] = {BODIES[name]};
}}
""")
    flags = [f for f in cpp_build.compile_flags() if f != "-shared"]
    out = subprocess.run(["g++", *flags, "-c", "-fopt-info-vec-optimized", "-o", str(tmp_path / "k.o"), str(src)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    line = sum(1 for _ in prelude().splitlines()) + 4   # the loop's line
    assert f"k.cpp:{line}" in out.stderr and "loop vectorized" in out.stderr, out.stderr[-2000:]


def test_where_relu_max_pick_exact_operands():
    nan_payload = torch.tensor([0x7FC00123], dtype=torch.int32).view(torch.float32)
    x = torch.cat([torch.tensor([-0.0, 0.0, float("nan"), -float("inf"), 3.0, -2.0]), nan_payload])
    y = torch.tensor([1.0, -0.0, 2.0, float("nan"), -0.0, 5.0, 7.0])

    def f(x, y):
        return torch.where(x > y, x, y), torch.relu(x), torch.maximum(x, y), x.amax(), torch.where(y < 1, -0.0, x)

    got, ref = coil.compile(f)(x, y), f(x, y)
    for g, r in zip(got, ref):  # bit for bit (the sign of zero) where not NaN; NaN where eager's is NaN
        assert g.shape == r.shape and torch.equal(g.isnan(), r.isnan()), (g, r)
        assert torch.equal(g[~g.isnan()].view(torch.int32), r[~r.isnan()].view(torch.int32)), (g, r)


def _cat_pad_cases():
    import torch.nn.functional as F

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1) * 2.0 + x
    return [(rotate_half, lambda n: (torch.randn(3, 5, n),)),
            (lambda a, b, c: torch.cat([a, b * 2, c.abs()], -1), lambda n: (torch.randn(4, n), torch.randn(4, 1),
                                                                          torch.randn(4, n + 3))),
            (lambda x: F.pad(x, (3, 2)) + 1, lambda n: (torch.randn(6, n),)),
            (lambda x: F.pad(x, (-1, 4), value=2.5), lambda n: (torch.randn(6, n + 2),)),
            (lambda x: F.pad(x, (1, 1, 2, 0)), lambda n: (torch.randn(2, 5, n),)),
            (lambda a, b: torch.cat([a, b]) * 3, lambda n: (torch.randn(n), torch.randn(n + 5))),
            (lambda x: torch.cat([x.flip(-1), x], -1), lambda n: (torch.randn(5, n),)),
            (lambda x, y: torch.stack([x, y], -1).sum(-1), lambda n: (torch.randn(4, n), torch.randn(4, n)))]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("case", range(8))
def test_cat_and_pad_inner_loop_pieces(case, dynamic):
    """``cat``/``pad`` along the inner dim: the inner loop is cut where their masks change (CppKernel._segments),
    each piece with the masks' values written in; every size, piece edges outside the loop included."""
    f, make = _cat_pad_cases()[case]
    coil.reset()
    c = coil.compile(f, dynamic=dynamic)
    with coil.config.patch(strict_codegen=True):   # no silent fall back to the FX interpreter
        for n in (1, 2, 7, 64, 130):
            args = make(n)
            assert torch.equal(c(*args), f(*args)), n


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ for its vectorizer report")
def test_cat_inner_loop_pieces_vectorize(tmp_path):
    """A masked block (``if (mask) {load}``) kept the loop scalar: RoPE's ``rotate_half`` ran at 0.4 of its speed."""
    import sympy

    from coil.codegen.cpp.kernel import CppKernel
    from coil.ir.symbols import XINDEX as X, Mod
    from coil.ir.virtualized import ops, set_ops_handler

    class Plan:
        numel, rnumel, removed_names = sympy.Integer(64 * 100), sympy.Integer(1), []
        nodes = [type("N", (), {"in_loop": True, "loop_id": 0, "run": lambda self, h: body(h)})()]

        def buffer(self, n):
            return type("B", (), {"get_dtype": lambda self: torch.float32})()

    def body(h):
        with set_ops_handler(h):
            i = ops.index_expr(Mod(X, 64), torch.int64)
            lo = ops.lt(i, ops.constant(32, torch.int64))
            a = ops.masked(lo, lambda: ops.neg(ops.load("x", X + 32)), 0.0)
            b = ops.masked(ops.ge(i, ops.constant(32, torch.int64)), lambda: ops.sqrt(ops.load("x", X - 32)), 0.0)
            ops.store("out", X, ops.where(lo, a, b))

    src = tmp_path / "k.cpp"
    src.write_text(prelude() + CppKernel(Plan(), "k", 1).source())
    flags = [f for f in cpp_build.compile_flags() if f != "-shared"]
    out = subprocess.run(["g++", *flags, "-c", "-fopt-info-vec-optimized", "-o", str(tmp_path / "k.o"), str(src)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    start = len(prelude().splitlines())
    vectorized = [int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", out.stderr)]
    assert len([n for n in vectorized if n > start]) == 2, out.stderr[-2000:]   # both pieces
