// coil C++ kernel prelude: included (as text) at the top of every generated source.
//
// - fp16/bf16 are stored as 16-bit values and computed in float:
//   coil_f16 is _Float16 where the compiler has it (vectorized by F16C), else a bit
//   pattern; coil_bf16 is a bit pattern with round-to-nearest-even conversion.
// - coil_exp/log/tanh/erf/sigmoid are branch-free float versions the compiler can
//   vectorize (glibc only offers vector math under -ffast-math, which coil avoids to
//   keep IEEE semantics). Algorithms: Cephes expf/logf/tanhf polynomials (S. Moshier),
//   erf: Taylor series near 0, Abramowitz & Stegun 7.1.26 elsewhere (abs err < 2e-7),
//   for GELU's ndtr only (the erf op calls libm's double erf: eager's is within 1 ulp).
// - Reductions combine values with coil_max_prop_ / coil_min_prop_; NaN propagates in
//   max/min like torch.
// - coil_rand: Philox-4x32-10 (Salmon et al., SC'11) keyed by (seed, offset):
//   a counter-based generator, so every element's value depends only on its index.
// - Kernels report errors (indirect index out of bounds) through coil_error:
//   the first failing kernel writes a code and the offending index, the Python
//   wrapper raises IndexError.
// Only <cstdint> is included: <cmath>/<algorithm>/<limits> cost ~0.3 s of compile time
// per kernel; math goes through GCC/Clang builtins instead (namespace cm, coil_lim).
#include <cstdint>
#include <type_traits>

#define COIL_INLINE static inline __attribute__((always_inline))

namespace cm {
#define COIL_M1(n) COIL_INLINE float n(float x) { return __builtin_##n##f(x); } \
                   COIL_INLINE double n(double x) { return __builtin_##n(x); }
#define COIL_M2(n) COIL_INLINE float n(float x, float y) { return __builtin_##n##f(x, y); } \
                   COIL_INLINE double n(double x, double y) { return __builtin_##n(x, y); }
// atan/atanh results pass an empty asm: with -fno-math-errno GCC 12 folds sin(atan(x)) into x / sqrt(x*x + 1) (NaN
// gave 1, cos(atan(NaN)) 0, cos(atan(inf)) 0 for 6.1e-17; sinh/cosh of atanh alike; fuzz s1033 #729). libm calls
// either way (the loop does not vectorize around them), so the barrier costs nothing.
#if defined(__x86_64__) || defined(__i386__)
#define COIL_OPAQUE(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define COIL_OPAQUE(v) __asm__("" : "+w"(v))
#else
#define COIL_OPAQUE(v) __asm__("" : "+m"(v))
#endif
#define COIL_M1_OPAQUE(n) COIL_INLINE float n(float x) { float r = __builtin_##n##f(x); COIL_OPAQUE(r); return r; } \
                          COIL_INLINE double n(double x) { double r = __builtin_##n(x); COIL_OPAQUE(r); return r; }
COIL_M1(exp) COIL_M1(exp2) COIL_M1(expm1) COIL_M1(log) COIL_M1(log2) COIL_M1(log10)
COIL_M1(log1p) COIL_M1(sqrt) COIL_M1(sin) COIL_M1(cos) COIL_M1(tan) COIL_M1(asin)
COIL_M1(acos) COIL_M1_OPAQUE(atan) COIL_M1(sinh) COIL_M1(cosh) COIL_M1(tanh) COIL_M1(asinh)
COIL_M1(acosh) COIL_M1_OPAQUE(atanh) COIL_M1(erf) COIL_M1(erfc) COIL_M1(lgamma) COIL_M1(floor)
COIL_M1(ceil) COIL_M1(trunc) COIL_M1(nearbyint) COIL_M1(fabs) COIL_M1(rint)
COIL_M2(fmod) COIL_M2(pow) COIL_M2(atan2) COIL_M2(hypot) COIL_M2(copysign) COIL_M2(nextafter)
COIL_INLINE float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
COIL_INLINE double fma(double a, double b, double c) { return __builtin_fma(a, b, c); }
COIL_INLINE bool isinf(float x) { return __builtin_isinf(x); }
COIL_INLINE bool isinf(double x) { return __builtin_isinf(x); }
COIL_INLINE bool signbit(float x) { return __builtin_signbit(x); }
COIL_INLINE bool signbit(double x) { return __builtin_signbit(x); }
#undef COIL_M1
#undef COIL_M1_OPAQUE
#undef COIL_OPAQUE
#undef COIL_M2
}  // namespace cm

template <typename T> struct coil_lim;
template <> struct coil_lim<float> {
  static constexpr float inf() { return __builtin_inff(); }
  static constexpr float nan() { return __builtin_nanf(""); }
  static constexpr float lowest() { return -__FLT_MAX__; }
  static constexpr float max() { return __FLT_MAX__; }
};
template <> struct coil_lim<double> {
  static constexpr double inf() { return __builtin_inf(); }
  static constexpr double nan() { return __builtin_nan(""); }
  static constexpr double lowest() { return -__DBL_MAX__; }
  static constexpr double max() { return __DBL_MAX__; }
};
#define COIL_ILIM(T, LO, HI) template <> struct coil_lim<T> { \
  static constexpr T lowest() { return LO; } static constexpr T max() { return HI; } };
COIL_ILIM(bool, false, true) COIL_ILIM(int8_t, INT8_MIN, INT8_MAX)
COIL_ILIM(uint8_t, 0, UINT8_MAX) COIL_ILIM(int16_t, INT16_MIN, INT16_MAX)
COIL_ILIM(uint16_t, 0, UINT16_MAX) COIL_ILIM(int32_t, INT32_MIN, INT32_MAX)
COIL_ILIM(uint32_t, 0, UINT32_MAX) COIL_ILIM(int64_t, INT64_MIN, INT64_MAX)
COIL_ILIM(uint64_t, 0, UINT64_MAX)
#undef COIL_ILIM
COIL_INLINE int64_t coil_imin(int64_t a, int64_t b) { return a < b ? a : b; }
COIL_INLINE int64_t coil_imax(int64_t a, int64_t b) { return a > b ? a : b; }

// coil_sel(c, a, b): c ? a : b for two values already computed, as bit masks. A ternary stays a branch in loops (the
// build turns GCC's loop if-conversion off: cpp_build.py; and an ordered float compare may trap, which GCC does not
// if-convert either), so a loop with one did not vectorize: exp, tanh, relu and where ran scalar, 4-12x slower than
// eager. The masks vectorize as a compare and an and-not/or (vcmpltps, vpandn). Exactly a or b, NaN payloads too.
template <typename T> COIL_INLINE T coil_sel(bool c, T a, T b) {
  if constexpr (std::is_same<T, float>::value || std::is_same<T, double>::value) {
    typedef typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type U;
    U m = (U)0 - (U)c, ua, ub;
    __builtin_memcpy(&ua, &a, sizeof(T)); __builtin_memcpy(&ub, &b, sizeof(T));
    ua = (ua & m) | (ub & ~m);
    T r; __builtin_memcpy(&r, &ua, sizeof(T)); return r;
  } else if constexpr (std::is_integral<T>::value && !std::is_same<T, bool>::value) {
    typedef typename std::make_unsigned<T>::type U;
    U m = (U)0 - (U)c;
    return (T)(((U)a & m) | ((U)b & (U)~m));
  } else {
    return c ? a : b;
  }
}

typedef uint16_t coil_bf16;
// IEEE half as a bit pattern, converted with integer operations (round to nearest even).
COIL_INLINE float coil_f16b_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    float f = (float)man * 5.9604644775390625e-8f;  // subnormal: man * 2^-24
    __builtin_memcpy(&bits, &f, 4); bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float out; __builtin_memcpy(&out, &bits, 4); return out;
}
COIL_INLINE uint16_t coil_float_to_f16b(float f) {
  uint32_t x; __builtin_memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000; uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
  if (ax < 0x38800000u) {  // subnormal half
    float a; __builtin_memcpy(&a, &ax, 4);
    return (uint16_t)(sign | (uint32_t)cm::nearbyint(a * 16777216.0f));
  }
  uint32_t r = ax + 0xfff + ((ax >> 13) & 1) - (112u << 23);
  return (uint16_t)(sign | (r >> 13));
}
#if defined(__FLT16_MAX__)
typedef _Float16 coil_f16;
COIL_INLINE float coil_f16_to_float(coil_f16 v) { return (float)v; }
COIL_INLINE coil_f16 coil_float_to_f16(float v) { return (coil_f16)v; }
#else
typedef uint16_t coil_f16;
COIL_INLINE float coil_f16_to_float(coil_f16 h) { return coil_f16b_to_float(h); }
COIL_INLINE coil_f16 coil_float_to_f16(float f) { return coil_float_to_f16b(f); }
#endif
// A float rounded to the nearest half, through the bit pattern: g++ 12.2 -O3 -march=native (AVX512-FP16) drops the
// round trip (float)(_Float16)v in an SLP-vectorized row tail (trial 70 finding 1).
COIL_INLINE float coil_round_f16(float v) { return coil_f16b_to_float(coil_float_to_f16b(v)); }

COIL_INLINE float coil_bf16_to_float(coil_bf16 v) {
  uint32_t bits = ((uint32_t)v) << 16; float f; __builtin_memcpy(&f, &bits, 4); return f;
}
// f rounded to bf16, as float (32-bit lanes throughout: vectorizes with what surrounds it)
COIL_INLINE float coil_round_bf16(float f) {
  uint32_t u; __builtin_memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float r; __builtin_memcpy(&r, &u, 4);
  return coil_sel(f != f, f, r);
}
COIL_INLINE coil_bf16 coil_float_to_bf16(float f) {
  float r = coil_round_bf16(f); uint32_t u; __builtin_memcpy(&u, &r, 4);
  return (coil_bf16)coil_sel(f != f, 0x7fc0u, u >> 16);
}

// ---- vectorizable float math ------------------------------------------------
COIL_INLINE float coil_bits_f(int32_t i) { float f; __builtin_memcpy(&f, &i, 4); return f; }
COIL_INLINE int32_t coil_f_bits(float f) { int32_t i; __builtin_memcpy(&i, &f, 4); return i; }

COIL_INLINE float coil_exp(float x) {
  // x below -104 (e.g. -inf from a masked softmax) computes exp(0) and is replaced by 0
  // below: clamping it to -104 made the scale multiply produce a denormal, and
  // denormal results take a microcode assist (~100 cycles per vector on x86).
  float xc = coil_sel(x < -104.0f, 0.0f, coil_sel(x > 89.0f, 89.0f, x));
  float n = __builtin_rintf(xc * 1.44269504088896341f);
  float r = cm::fma(n, -0.693359375f, xc);
  r = cm::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500E-4f;
  p = cm::fma(p, r, 1.3981999507E-3f);
  p = cm::fma(p, r, 8.3334519073E-3f);
  p = cm::fma(p, r, 4.1665795894E-2f);
  p = cm::fma(p, r, 1.6666665459E-1f);
  p = cm::fma(p, r, 5.0000001201E-1f);
  float y = cm::fma(p * r, r, r) + 1.0f;
  int32_t ni = (int32_t)n;
  int32_t n1 = ni >> 1, n2 = ni - n1;
  y = y * coil_bits_f((n1 + 127) << 23) * coil_bits_f((n2 + 127) << 23);
  y = coil_sel(x > 88.72283935546875f, __builtin_inff(), y);
  y = coil_sel(x < -103.97208f, 0.0f, y);
  return coil_sel(x != x, x, y);
}

// expm1 in double, rounded once (within 0.5002 ulp; the float Taylor-or-exp(x)-1 split was 8 ulp off near
// |x| = 0.1): x = n ln2 + r, |r| <= ln2/2, expm1(r) by Taylor to r^9, then 2^n expm1(r) + (2^n - 1). 2^n is
// built from rint's bits (no float -> int conversion: AVX2 has none to int64); x is clamped so n fits.
COIL_INLINE float coil_expm1(float x) {
  double xd = coil_sel(x < -110.0f, -110.0f, coil_sel(x > 90.0f, 90.0f, x));
  double n = __builtin_rint(xd * 1.4426950408889634), p = 1.0 / 362880;
  double r = __builtin_fma(n, -6.93147180369123816490e-01, xd);
  r = __builtin_fma(n, -1.90821492927058770002e-10, r);
  p = __builtin_fma(p, r, 1.0 / 40320);
  p = __builtin_fma(p, r, 1.0 / 5040); p = __builtin_fma(p, r, 1.0 / 720); p = __builtin_fma(p, r, 1.0 / 120);
  p = __builtin_fma(p, r, 1.0 / 24); p = __builtin_fma(p, r, 1.0 / 6); p = __builtin_fma(p, r, 0.5);
  int64_t nb; double nm = n + 6755399441055744.0 + 1023.0;  // 1.5 * 2^52: n + 1023 in the low bits
  __builtin_memcpy(&nb, &nm, 8); nb <<= 52;
  double s; __builtin_memcpy(&s, &nb, 8);
  float y = (float)__builtin_fma(s, __builtin_fma(p * r, r, r), s - 1.0);
  return coil_sel((x != x) | (x == 0.0f), x, y);  // NaN, and -0 (r is +0 there)
}

COIL_INLINE float coil_log(float x) {
  float xs = coil_sel(x < 1.17549435e-38f, x * 8388608.0f, x);  // scale subnormals by 2^23
  float eadj = coil_sel(x < 1.17549435e-38f, -23.0f, 0.0f);
  int32_t bits = coil_f_bits(xs);
  float e = (float)(((bits >> 23) & 0xff) - 126) + eadj;
  float m = coil_bits_f((bits & 0x007fffff) | 0x3f000000);
  bool small = m < 0.707106781186547524f;
  e = coil_sel(small, e - 1.0f, e);
  m = coil_sel(small, m + m - 1.0f, m - 1.0f);
  float z = m * m;
  float y = 7.0376836292E-2f;
  y = cm::fma(y, m, -1.1514610310E-1f);
  y = cm::fma(y, m, 1.1676998740E-1f);
  y = cm::fma(y, m, -1.2420140846E-1f);
  y = cm::fma(y, m, 1.4249322787E-1f);
  y = cm::fma(y, m, -1.6668057665E-1f);
  y = cm::fma(y, m, 2.0000714765E-1f);
  y = cm::fma(y, m, -2.4999993993E-1f);
  y = cm::fma(y, m, 3.3333331174E-1f);
  y = y * m * z;
  y = cm::fma(e, -2.12194440e-4f, y);
  y = cm::fma(z, -0.5f, y);
  float r = m + y;
  r = cm::fma(e, 0.693359375f, r);
  r = coil_sel(x == 0.0f, -__builtin_inff(), r);
  r = coil_sel(x < 0.0f, __builtin_nanf(""), r);
  r = coil_sel(x == __builtin_inff(), x, r);
  return coil_sel(x != x, x, r);
}

COIL_INLINE float coil_tanh(float x) {
  float ax = cm::fabs(x);
  float z = x * x;
  float p = -5.70498872745E-3f;
  p = cm::fma(p, z, 2.06390887954E-2f);
  p = cm::fma(p, z, -5.37397155531E-2f);
  p = cm::fma(p, z, 1.33314422036E-1f);
  p = cm::fma(p, z, -3.33332819422E-1f);
  float small = cm::fma(p * z, x, x);
  // |x| >= 9.01084041595459f: exactly +-1, like eager (measured: torch 2.13 CPU fp32 tanh is
  // 1.0f from 9.01084041595459f on, 0.99999994f below; the formula alone reaches 1.0f
  // only at ~9.01091). The clamp only keeps exp finite; it no longer sets the result.
  float t = coil_exp(2.0f * coil_sel(ax > 9.5f, 9.5f, ax));
  float big = 1.0f - 2.0f / (t + 1.0f);
  big = coil_sel(ax >= 9.01084041595459f, 1.0f, big);
  big = cm::copysign(big, x);
  float r = coil_sel(ax < 0.625f, small, big);
  // NaN and +-0 are their own tanh (the polynomial gives +0 for -0: fma(-0, -0, -0))
  return coil_sel((x != x) | (x == 0.0f), x, r);
}

// sin/cos: r = x - j*pi/2, |r| <= pi/4, quadrant q = j mod 4, then Cephes sinf/cosf
// polynomials on r. |x| < 2^20: j = rint(x * 2/pi) and r in double, pi/2 split in three
// parts (fdlibm's pio2_1/2/2t) subtracted with fma (exact products). Larger |x|: Payne-
// Hanek reduction: the 24-bit mantissa times the 96 bits of 2/pi that matter at its
// exponent, a 64-bit fixed-point fraction of a turn (coil_reduce_big). ~1 ulp for every
// finite x, as eager; inf/NaN give NaN. Both reductions are computed and one selected:
// branch-free, so RoPE-style kernels vectorize (libm's sinf is a scalar call: 10x slower);
// the table gathers and 64-bit products make sin+cos ~3x the cost of the small-range
// reduction alone (1.9 vs 0.55 ns an element, AVX-512; 3.1 vs 1.0 on AVX2).
// 2/pi in hexadecimal: entry k >= 3 holds its bits 8(k-3) .. 8(k-3)+31 after the point.
static const uint32_t coil_two_over_pi[24] = {
    0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529,
    0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd,
    0xf534ddc0, 0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43,
    0x993c4390, 0x3c439041};
// |x| >= 2: x / (2 pi) mod 1 as a signed 64-bit fixed-point fraction of a turn (the
// quadrant's two bits removed into *q), returned as radians
COIL_INLINE double coil_reduce_big(float x, int32_t* q) {
  uint32_t xi = (uint32_t)coil_f_bits(x);
  int32_t k = (int32_t)((xi >> 26) & 15);
  uint32_t m = ((xi & 0x7fffffu) | 0x800000u) << ((xi >> 23) & 7);
  uint64_t hi = (uint64_t)(uint32_t)(m * coil_two_over_pi[k]), mid = (uint64_t)m * coil_two_over_pi[k + 4],
           lo = (uint64_t)m * coil_two_over_pi[k + 8];
  uint64_t f = ((lo >> 32) | (hi << 32)) + mid;
  uint64_t n = (f + (1ull << 61)) >> 62;  // the nearest quadrant (mod 4)
  *q = (int32_t)n;
  uint64_t g = f - (n << 62);  // signed; as two 32-bit halves (AVX2 converts int32 only)
  double d = (double)(int32_t)(uint32_t)(g >> 32) * 4294967296.0 + (double)(int32_t)((uint32_t)g >> 1) * 2.0;
  return d * 3.4061215800865545e-19;  // * pi / 2^63
}
COIL_INLINE void coil_sincos_r(float x, float* sr, float* cr, int32_t* q) {
  bool big = cm::fabs(x) >= 1048576.0f;
  double xd = coil_sel(big, 0.0, (double)x);
  double j = __builtin_rint(xd * 0.63661977236758134308);
  double rd = __builtin_fma(j, -1.57079632673412561417e+00, xd);
  rd = __builtin_fma(j, -6.07710050650619224932e-11, rd);
  rd = __builtin_fma(j, -2.02226624879595063154e-21, rd);
  int32_t qb; double rb = coil_reduce_big(x, &qb);
  rb = coil_sel(x < 0.0f, -rb, rb);
  // Taylor in double (error < 1e-13 for |r| <= pi/4), rounded once: correctly rounded (s90 #2138)
  double r = coil_sel(big, rb, rd), z = r * r, sp = -1.0 / 6227020800, cp = 1.0 / 87178291200;
  sp = __builtin_fma(sp, z, 1.0 / 39916800); cp = __builtin_fma(cp, z, -1.0 / 479001600);
  sp = __builtin_fma(sp, z, -1.0 / 362880); cp = __builtin_fma(cp, z, 1.0 / 3628800);
  sp = __builtin_fma(sp, z, 1.0 / 5040); cp = __builtin_fma(cp, z, -1.0 / 40320);
  sp = __builtin_fma(sp, z, -1.0 / 120); cp = __builtin_fma(cp, z, 1.0 / 720);
  sp = __builtin_fma(sp, z, 1.0 / 6); cp = __builtin_fma(cp, z, -1.0 / 24);
  *sr = (float)__builtin_fma(-sp * z, r, r);
  *cr = (float)__builtin_fma(-cp * z, z, __builtin_fma(-0.5, z, 1.0));
  // j mod 4 in double: AVX2 has no vector double -> int64 conversion
  // (floor as rint and a select: GCC 12 does not vectorize __builtin_floor of a double)
  double t4 = j * 0.25, f4 = __builtin_rint(t4);
  f4 = coil_sel(f4 > t4, f4 - 1.0, f4);
  int32_t qs = (int32_t)(j - 4.0 * f4);
  qb = coil_sel(x < 0.0f, -qb, qb);
  *q = coil_sel(big, qb & 3, qs);
}
COIL_INLINE float coil_sin(float x) {
  float s, c; int32_t q; coil_sincos_r(x, &s, &c, &q);
  float v = coil_sel((q & 1) != 0, c, s);
  v = coil_sel((q & 2) != 0, -v, v);
  v = coil_sel(x == 0.0f, x, v);  // sin(-0) = -0
  return coil_sel(x - x == 0.0f, v, __builtin_nanf(""));  // inf, NaN
}
COIL_INLINE float coil_cos(float x) {
  float s, c; int32_t q; coil_sincos_r(x, &s, &c, &q);
  float v = coil_sel((q & 1) != 0, s, c);
  v = coil_sel(((q + 1) & 2) != 0, -v, v);
  return coil_sel(x - x == 0.0f, v, __builtin_nanf(""));
}

COIL_INLINE float coil_sigmoid(float x) { return 1.0f / (1.0f + coil_exp(-x)); }

COIL_INLINE float coil_erf(float x) {
  float ax = cm::fabs(x);
  float z = x * x;
  // Taylor: 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)), n <= 6
  float s = 1.0f / 9360.0f;
  s = cm::fma(s, z, -1.0f / 1320.0f);
  s = cm::fma(s, z, 1.0f / 216.0f);
  s = cm::fma(s, z, -1.0f / 42.0f);
  s = cm::fma(s, z, 1.0f / 10.0f);
  s = cm::fma(s, z, -1.0f / 3.0f);
  s = cm::fma(s, z, 1.0f);
  float small = 1.1283791670955126f * x * s;
  // A&S 7.1.26
  float t = 1.0f / cm::fma(0.3275911f, ax, 1.0f);
  float q = 1.061405429f;
  q = cm::fma(q, t, -1.453152027f);
  q = cm::fma(q, t, 1.421413741f);
  q = cm::fma(q, t, -0.284496736f);
  q = cm::fma(q, t, 0.254829592f);
  float big = 1.0f - q * t * coil_exp(-z);
  big = cm::copysign(big, x);
  float r = coil_sel(ax < 0.5f, small, big);
  return coil_sel(x != x, x, r);
}

// the standard normal CDF (exact GELU is x * coil_ndtr(x)): the erf form eager's CPU
// kernels use
COIL_INLINE float coil_ndtr(float x) { return 0.5f * (1.0f + coil_erf(x * 0.70710678118654752f)); }
COIL_INLINE double coil_ndtr(double x) { return 0.5 * (1.0 + cm::erf(x * 0.70710678118654752)); }

// ---- reductions -------------------------------------------------------------
// Shifts as eager's: a count < 0 or >= the width gives 0 (left) or the sign fill (right);
// C++'s shift by such a count is undefined (x86's scalar shl takes it mod 64).
template <typename T, typename S> COIL_INLINE T coil_shl(T a, S b) {
  typedef typename std::make_unsigned<T>::type U;
  return (b < 0 || b >= (S)(sizeof(T) * 8)) ? T(0) : T(U(a) << b);
}
template <typename T, typename S> COIL_INLINE T coil_shr(T a, S b) {
  if (b < 0 || b >= (S)(sizeof(T) * 8)) return std::is_signed<T>::value ? T(a >> (sizeof(T) * 8 - 1)) : T(0);
  return T(a >> b);
}
template <typename T> COIL_INLINE T coil_max(T a, T b) { return coil_sel((a != a) | (a > b), a, b); }
template <typename T> COIL_INLINE T coil_min(T a, T b) { return coil_sel((a != a) | (a < b), a, b); }
// accumulate b into a, NaN propagating (the reduction update)
template <typename T> COIL_INLINE T coil_max_prop_(T a, T b) { return coil_sel((b != b) | (b > a), b, a); }
template <typename T> COIL_INLINE T coil_min_prop_(T a, T b) { return coil_sel((b != b) | (b < a), b, a); }

// argmax/argmin: ties keep the smaller index; NaN wins (like torch).
// (v, i) beats the best (bv, bi) so far: NaN first, then the larger (smaller) value, ties to the lower index; bitwise
// on bools, without branches, so the lane loop vectorizes
template <typename T> COIL_INLINE bool coil_argmax_better(T v, int64_t i, T bv, int64_t bi) {
  bool bn = bv != bv, vn = v != v, first = i < bi;
  return (bn & vn & first) | (!bn & (vn | (v > bv) | ((v == bv) & first)));
}
template <typename T> COIL_INLINE bool coil_argmin_better(T v, int64_t i, T bv, int64_t bi) {
  bool bn = bv != bv, vn = v != v, first = i < bi;
  return (bn & vn & first) | (!bn & (vn | (v < bv) | ((v == bv) & first)));
}

// ---- integer helpers (Python floor semantics) ---------------------------------
// x86 idiv traps (SIGFPE, killing the process) on b == 0 and on INT_MIN / -1, so the
// divisor is replaced by 1 there (branch-free selects; with a constant b everything folds
// away and the division by a constant still vectorizes):
// - b == -1: the quotient is -a wrapped (computed in uint64_t: no signed overflow), the
//   remainder 0, like eager (two's-complement wrap: INT64_MIN // -1 == INT64_MIN).
// - b == 0: quotient and remainder 0. Eager raises ZeroDivisionError; a kernel cannot
//   raise, so the value is defined instead of crashing (Triton gives 0 too).
template <typename T> COIL_INLINE bool coil_idiv_special(T b) {
  return b == (T)0 || ((T)-1 < (T)0 && b == (T)-1);  // -1 only for signed T
}
template <typename T> COIL_INLINE T coil_wrap_neg(T a) { return (T)((uint64_t)0 - (uint64_t)a); }
template <typename T> COIL_INLINE T coil_floordiv(T a, T b) {
  bool sp = coil_idiv_special(b);
  T d = sp ? (T)1 : b;
  T q = a / d; T r = a % d;
  q = (r != 0 && ((r < 0) != (d < 0))) ? q - 1 : q;
  return sp ? (b == (T)0 ? (T)0 : coil_wrap_neg(a)) : q;
}
template <typename T> COIL_INLINE T coil_truncdiv(T a, T b) {  // C++ a / b, made safe
  bool sp = coil_idiv_special(b);
  T q = a / (sp ? (T)1 : b);
  return sp ? (b == (T)0 ? (T)0 : coil_wrap_neg(a)) : q;
}
template <typename T> COIL_INLINE T coil_mod(T a, T b) {  // torch.remainder
  bool sp = coil_idiv_special(b);
  T d = sp ? (T)1 : b;
  T r = a % d;
  r = (r != 0 && ((r < 0) != (d < 0))) ? r + d : r;
  return sp ? (T)0 : r;
}
template <typename T> COIL_INLINE T coil_fmod_int(T a, T b) {  // torch.fmod: C++ a % b, made safe
  bool sp = coil_idiv_special(b);
  T r = a % (sp ? (T)1 : b);
  return sp ? (T)0 : r;
}
COIL_INLINE float coil_fmod_py(float a, float b) {  // torch.remainder for floats
  float r = cm::fmod(a, b);
  return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
COIL_INLINE double coil_fmod_py(double a, double b) {
  double r = cm::fmod(a, b);
  return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}

// ---- random numbers: Philox-4x32-10 ------------------------------------------
COIL_INLINE uint32_t coil_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = (uint64_t)a * (uint64_t)b; *hi = (uint32_t)(p >> 32); return (uint32_t)p;
}
// One 32-bit random word for (seed, offset): counter = offset, key = seed.
COIL_INLINE uint32_t coil_philox(uint64_t seed, uint64_t offset) {
  uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)(offset >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int i = 0; i < 10; ++i) {
    uint32_t hi0, hi1;
    uint32_t lo0 = coil_mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = coil_mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return c0;
}
// uniform in [0, 1)
COIL_INLINE float coil_rand(uint64_t seed, uint64_t offset) {
  return (float)(coil_philox(seed, offset) >> 8) * (1.0f / 16777216.0f);
}
// standard normal by Box-Muller on two words
COIL_INLINE float coil_randn(uint64_t seed, uint64_t offset) {
  uint32_t a = coil_philox(seed, offset * 2), b = coil_philox(seed, offset * 2 + 1);
  float u1 = ((float)(a >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  float u2 = (float)(b >> 8) * (1.0f / 16777216.0f);
  return cm::sqrt(-2.0f * cm::log(u1)) * cm::cos(6.283185307179586f * u2);
}

// ---- errors ---------------------------------------------------------------------
// err[0]: 0 = ok, 1 = index out of bounds; err[1]: the index; err[2]: the size;
// err[3]: which check (numbered by codegen).
COIL_INLINE void coil_report_oob(int64_t* err, int64_t idx, int64_t size, int64_t site) {
  int64_t expected = 0;
  if (__atomic_compare_exchange_n(&err[0], &expected, (int64_t)1, false, __ATOMIC_SEQ_CST,
                                  __ATOMIC_SEQ_CST)) {
    err[1] = idx; err[2] = size; err[3] = site;
  }
}

// An index read from a tensor: negative values wrap (Python semantics); out of range
// records the error (first one wins) and returns 0, so the kernel never reads outside
// the buffer and the launcher raises IndexError after the call.
COIL_INLINE int64_t coil_ind_wrap(int64_t i, int64_t size) { return i < 0 ? i + size : i; }
COIL_INLINE int64_t coil_ind_checked(int64_t i, int64_t size, int wrap, int64_t* err, int64_t site) {
  int64_t j = (wrap && i < 0) ? i + size : i;
  if (__builtin_expect(j < 0 || j >= size, 0)) { coil_report_oob(err, i, size, site); return 0; }
  return j;
}

// ---- misc ------------------------------------------------------------------------
// signbit through the bit pattern: GCC 12 crashes (ICE "unrecognizable insn") when it
// vectorizes __builtin_signbit next to bf16 loads.
COIL_INLINE bool coil_signbit(float x) { int32_t i; __builtin_memcpy(&i, &x, 4); return i < 0; }
COIL_INLINE bool coil_signbit(double x) { int64_t i; __builtin_memcpy(&i, &x, 8); return i < 0; }
template <typename T> COIL_INLINE T coil_ipow(T a, T b) {
  if (b < 0) return (a == 1) ? 1 : ((a == -1) ? ((b & 1) ? -1 : 1) : 0);
  T r = 1;
  while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
  return r;
}
// float -> signed int / uint8 as eager computes it on x86 (cvtt*2si): NaN and values out
// of range give INT64_MIN (64-bit targets) or INT32_MIN, narrower types keep the low bits
// of the int32 result (so NaN gives 0). A plain static_cast is undefined there, and GCC
// folds a constant NaN to 0.
template <typename To, typename From> COIL_INLINE To coil_ftoi(From x) {
  if (sizeof(To) == 8 || (sizeof(From) == 8 && std::is_same<To, uint8_t>::value))  // (eager: double -> uint8 via int64)
    return (x >= (From)-9223372036854775808.0 && x < (From)9223372036854775808.0)
        ? (To)(int64_t)x : (To)INT64_MIN;
  return (To)((x >= (From)-2147483648.0 && x < (From)2147483648.0) ? (int32_t)x : INT32_MIN);
}
// erfinv: M. Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011),
// single precision version, then one Newton step for accuracy.
template <typename T> COIL_INLINE T coil_erfinv_giles(T w) {  // erfinv(x) / x, w = -log(1 - x^2)
  T p;
  if (w < T(5)) {
    w = w - T(2.5);
    p = T(2.81022636e-08); p = T(3.43273939e-07) + p * w; p = T(-3.5233877e-06) + p * w;
    p = T(-4.39150654e-06) + p * w; p = T(0.00021858087) + p * w; p = T(-0.00125372503) + p * w;
    p = T(-0.00417768164) + p * w; p = T(0.246640727) + p * w; p = T(1.50140941) + p * w;
  } else {
    w = cm::sqrt(w) - T(3);
    p = T(-0.000200214257); p = T(0.000100950558) + p * w; p = T(0.00134934322) + p * w;
    p = T(-0.00367342844) + p * w; p = T(0.00573950773) + p * w; p = T(-0.0076224613) + p * w;
    p = T(0.00943887047) + p * w; p = T(1.00167406) + p * w; p = T(2.83297682) + p * w;
  }
  return p;
}
COIL_INLINE float coil_erfinv(float x) {
  float y = coil_erfinv_giles(-cm::log((1.0f - x) * (1.0f + x))) * x;
  if (cm::fabs(x) < 1.0f) {
    double yd = y, err = cm::erf(yd) - (double)x;
    yd -= err / (1.1283791670955126 * cm::exp(-yd * yd));
    y = (float)yd;
  }
  return cm::fabs(x) == 1.0f ? cm::copysign(__builtin_inff(), x) : y;
}
// double: Giles's single-precision polynomials evaluated in double, then four Newton steps on
// erf(y) = |x| (for |x| >= 0.5 on log(erfc(y)) = log1p(-|x|), which neither cancels near 1 nor
// converges slowly in the tail, to 1 - 2^-53); float32 accuracy before (1.8e-3 off at 0.999999).
COIL_INLINE double coil_erfinv(double x) {
  double a = cm::fabs(x);
  if (a >= 1.0) return a == 1.0 ? cm::copysign(__builtin_inf(), x) : __builtin_nan("");
  double y = coil_erfinv_giles(-cm::log((1.0 - a) * (1.0 + a))) * a;
  for (int i = 0; i < 4; i++) {
    double d = 1.1283791670955126 * cm::exp(-y * y);  // erf'(y)
    if (a < 0.5) {
      y -= (cm::erf(y) - a) / d;
    } else {  // on log(erfc(y)), nearly quadratic in the tail: converges from Giles's estimate there
      double e = cm::erfc(y);
      y += (cm::log(e) - cm::log1p(-a)) * e / d;
    }
  }
  return cm::copysign(y, x);
}
