"""Loops with selects vectorize under the build's flags (docs/cpp_backend.md, "Selects are bit masks").

With GCC's loop if-conversion off (cpp_build.DEFAULT_FLAGS), a ternary in a loop stays a branch and the loop ran
scalar: from 2026-12-02 every kernel with exp, tanh, log, relu, where or a max reduction was 4-12x slower than eager
on the CPU. The prelude's ``coil_sel`` masks compile to a compare and an and-not/or; this checks GCC's own report
(``-fopt-info-vec``) on the prelude functions and on the selects the code generator emits, and that ``coil_sel``
picks exactly one operand (NaN payloads, signed zeros).
"""
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
