"""Guarded loads in a reduction whose static rows are shorter than LANES (fuzz seed 92 #2381).

``torch.cat([a, a], 0)`` of an int64 ``a`` of shape (2, 2), summed and exp'd in one
kernel: the row (2 elements) is all scalar tail, a constant-bound loop g++ unrolls into
the loop over rows, which it then SLP-vectorizes with the cat's guarded loads as masked
loads. g++ 12.2 (Debian 12.2.0-14) at -O3 with AVX-512 gives every vector of an
SLP group of masked loads the mask of the first vector (the vectorizer dump shows the
second copy's mask computed and unused): the second half of the cat read as 0 (exp 1.0),
and the sum was garbage on (100, 2). Such kernels are compiled with
``__attribute__((optimize("no-tree-loop-if-convert")))``: their guards stay branches
(a pad's guard on ``r0`` folds once the row is unrolled, so pads are unchanged).
``_REPRO`` below is a standalone copy: ``f_plain`` gives 8 6 4 8 0 0 0 0 at -O3 here
(right at -O2), ``f_fixed`` (the attribute) 8 6 4 8 8 6 4 8.
"""
import ctypes

import pytest
import torch

import coil
from coil.codegen.cpp import kernel as K
from coil.runtime import cpp_build

_BODY = r"""(const int64_t* __restrict__ p, float* __restrict__ o) {
  for (int64_t r1 = 0; r1 < 4; ++r1)
    for (int64_t l = 0; l < 2; ++l) {
      int64_t t = r1 < 2 ? p[l + 2 * r1] : p[l + 2 * r1 - 4];
      float x = (float)t, y = x * 2;
      y = x > 88 ? 5.0f : y;
      o[l + 2 * r1] = x < -103 ? 0.0f : y;
    }
}
"""
_REPRO = ("#include <cstdint>\nextern \"C\" void f_plain" + _BODY + "extern \"C\" "
          "__attribute__((optimize(\"no-tree-loop-if-convert\"))) void f_fixed" + _BODY)


def test_standalone_repro():
    """The attributed loop is right at coil's flags; the plain one is wrong with this
    machine's g++ 12.2 (reported, not asserted: other compilers and CPUs are right)."""
    try:
        lib = cpp_build.build(_REPRO)
    except cpp_build.CppBuildError as e:  # pragma: no cover - no compiler
        pytest.skip(str(e))
    p = torch.tensor([4, 3, 2, 4, 0, 0, 0, 0])  # the wrong mask loads p[4:8]
    ref = (p[:4].repeat(2) * 2).float()
    for name in ("f_fixed", "f_plain"):
        o = torch.full((8,), -1.0)
        getattr(lib, name)(ctypes.c_void_p(p.data_ptr()), ctypes.c_void_p(o.data_ptr()))
        if name == "f_fixed":
            assert torch.equal(o, ref), o
    print(f"{cpp_build.compiler()[1].splitlines()[0]}: plain loop gives {o.tolist()}")


def _cat_then(op):
    def fn(a):
        v = torch.cat([a, a], 0)
        return torch.exp(v), op(v)
    return fn


@pytest.mark.parametrize("shape", [(2, 2), (3, 2), (100, 2)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("op", ["sum", "amax"])
def test_cat_exp_and_reduction(op, dtype, shape):
    """Each of these gave wrong values before (exp of the cat's second half 1.0, or a
    wrong sum/amax) on g++ 12.2 -O3 with AVX-512."""
    a = (torch.arange(shape[0] * shape[1]).reshape(shape) % 7 - 3).to(dtype)
    fn = _cat_then(getattr(torch, op))
    coil.reset()
    out = coil.compile(fn, options={"cpu_backend": "cpp"})(a)
    for o, r in zip(out, fn(a)):
        torch.testing.assert_close(o, r)


def test_attribute_only_on_guarded_short_rows():
    """The attribute goes on a reduction kernel with guarded loads in a static row shorter
    than LANES, and on nothing else (pointwise cat, rows without guards, long rows)."""
    seen = {}
    orig = K.CppKernel.source

    def spy(self):
        src = orig(self)
        seen[self.name] = src
        return src

    cases = [(_cat_then(torch.sum), torch.randn(6, 3), True),
             (lambda a: torch.cat([a, a], 0) * 2, torch.randn(6, 3), False),
             (lambda a: a.sum(1), torch.randn(6, 3), False),
             (lambda a: torch.cat([a, a], 0).sum(1), torch.randn(6, 1030), False)]
    K.CppKernel.source = spy
    try:
        for fn, x, want in cases:
            seen.clear()
            coil.reset()
            out = coil.compile(fn, options={"cpu_backend": "cpp"})(x)
            torch.testing.assert_close(out, fn(x))
            assert seen
            assert any("no-tree-loop-if-convert" in s for s in seen.values()) == want, seen
    finally:
        K.CppKernel.source = orig
