"""Float reductions whose scalar tail reads reversed elements (FINDINGS_6 item 1).

``x.flip(-1).sum()`` on a (rows, w) tensor with w < 8 (the C++ kernel's LANES) gives a
kernel whose lane loop never runs; all the work is the scalar tail, an in-order float
sum over ``p[-r0 + w*r1 + w - 1]``. g++ 12.2 (Debian 12.2.0-14) at -O3 (and -O2; its
loop vectorizer, not SLP: ``-fopt-info-vec`` says "loop vectorized using 16 byte
vectors") turns that loop nest into a wrong sum, with no error. A standalone copy::

    // g++ -O3 mini.cpp && ./a.out   -> got=87380 ref=65535 on g++ 12.2
    // (-O3 -fno-tree-loop-vectorize: got=65535)
    #include <cstdio>
    __attribute__((noinline)) float f(const float* p, long n) {
      float acc = 0;
      for (long r1 = 0; r1 < n; ++r1)
        for (long r0 = 0; r0 < 2; ++r0) acc = acc + p[-r0 + 2 * r1 + 1];
      return acc;
    }
    int main() {
      float p[34];
      for (int i = 0; i < 34; ++i) p[i] = i < 16 ? (float)(1 << i) : 0.0f;  // exact sums
      volatile long n = 17;
      printf("got=%g ref=65535\\n", f(p, n));
    }

The generated tail now has no in-order accumulator of its own: it is a partial lane
chunk (its element ``l`` adds into lane ``l``), so for a row shorter than LANES the
loop nest is a set of independent in-order lane sums, which g++ vectorizes correctly
(and 2-4x faster than the fold-left code it produced before). ``test_standalone_repro``
compiles the program above, and its lane-array form, with coil's compiler and flags.
"""
import ctypes

import pytest
import torch

import coil
from coil.runtime import cpp_build

# the standalone repro as a shared object: f_plain is the original loop, f_lanes the
# same sum with the tail accumulating into the lane array (what kernels now do)
_REPRO = r"""
#include <cstdint>
extern "C" float f_plain(const float* p, int64_t n) {
  float acc = 0;
  for (int64_t r1 = 0; r1 < n; ++r1)
    for (int64_t r0 = 0; r0 < 2; ++r0) acc = acc + p[-r0 + 2 * r1 + 1];
  return acc;
}
extern "C" float f_lanes(const float* p, int64_t n) {
  float lane[8];
  for (int l = 0; l < 8; ++l) lane[l] = 0;
  for (int64_t r1 = 0; r1 < n; ++r1)
    for (int64_t r0 = 0; r0 < 2; ++r0) lane[r0] = lane[r0] + p[-r0 + 2 * r1 + 1];
  float acc = 0;
  for (int l = 0; l < 8; ++l) acc = acc + lane[l];
  return acc;
}
"""


def _cpp(fn, x):
    coil.reset()
    return coil.compile(fn, options={"cpu_backend": "cpp"})(x)


def _close(out, ref):
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_standalone_repro():
    """The compiler at coil's flags on the standalone loop: the lane-array form is
    exact; the plain loop is wrong with this machine's g++ 12.2 (reported, not
    asserted: other compilers are right)."""
    try:
        lib = cpp_build.build(_REPRO)
    except cpp_build.CppBuildError as e:  # pragma: no cover - no compiler
        pytest.skip(str(e))
    p = torch.zeros(34)
    p[:16] = torch.tensor([float(1 << i) for i in range(16)])
    ptr = ctypes.c_void_p(p.data_ptr())
    for name in ("f_plain", "f_lanes"):
        getattr(lib, name).restype = ctypes.c_float
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_int64]
    assert lib.f_lanes(ptr, 17) == 65535.0
    plain = lib.f_plain(ptr, 17)
    print(f"{cpp_build.compiler()[1].splitlines()[0]}: plain loop gives {plain} (exact: 65535)")


def test_flip_sum_17x2():
    torch.manual_seed(0)
    x = torch.randn(17, 2)
    _close(_cpp(lambda x: x.flip(-1).sum(), x), x.sum())


@pytest.mark.parametrize("rows", [15, 16, 17, 24, 33, 40])
@pytest.mark.parametrize("width", [2, 3, 4, 5, 6, 7])
def test_flip_sum_widths_rows(width, rows):
    torch.manual_seed(width * 100 + rows)
    x = torch.randn(rows, width)
    _close(_cpp(lambda x: x.flip(-1).sum(), x), x.flip(-1).sum())


@pytest.mark.parametrize("width", [2, 5, 7, 9, 10, 13])
@pytest.mark.parametrize("op", ["mean", "var", "std", "prod", "amax", "argmax", "double_sum"])
def test_flip_reduction_variants(op, width):
    torch.manual_seed(width)
    x = torch.randn(33, width)
    if op == "prod":
        x = 1 + 0.01 * x  # keep the product O(1)
    fns = {
        "mean": lambda x: x.flip(-1).mean(),
        "var": lambda x: x.flip(-1).var(),
        "std": lambda x: x.flip(-1).std(),
        "prod": lambda x: x.flip(-1).prod(),
        "amax": lambda x: x.flip(-1).amax(),
        "argmax": lambda x: x.flip(-1).argmax(),
        "double_sum": lambda x: x.double().flip(-1).sum(),
    }
    fn = fns[op]
    _close(_cpp(fn, x), fn(x))


@pytest.mark.parametrize("shape", [(5, 8, 3, 5), (40, 3), (3, 20, 6)])
def test_flip_sum_nd(shape):
    torch.manual_seed(1)
    x = torch.randn(*shape)
    _close(_cpp(lambda x: x.flip(-1).sum(), x), x.sum())
    _close(_cpp(lambda x: (x.flip(-1) * 2 + 1).mean(), x), (x * 2 + 1).mean())


def test_tail_accumulates_into_lanes():
    """The scalar tail adds into the lane array; no in-order ``_tail`` accumulator."""
    from coil.codegen.cpp import kernel as K

    torch.manual_seed(0)
    seen = []
    orig = K.CppKernel.source

    def spy(self):
        src = orig(self)
        seen.append(src)
        return src

    K.CppKernel.source = spy
    try:
        for fn, x in [(lambda x: x.flip(-1).sum(), torch.randn(17, 2)),
                      (lambda x: x.sum(-1), torch.randn(4, 2047)),
                      (lambda x: x.argmax(-1), torch.randn(4, 13))]:
            coil.reset()
            out = coil.compile(fn, options={"cpu_backend": "cpp"})(x)
            torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-5)
    finally:
        K.CppKernel.source = orig
    assert len(seen) == 3
    for src in seen:
        assert "_tail" not in src
        assert "_lane[l] = " in src.split("int64_t r0 = ")[-1]
