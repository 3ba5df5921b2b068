// Scalar arithmetic of the GPU kernels, compiled for host (the CPU model gpu.model.<profile>) and
// device (the kernels): one source of truth. C++17, no library beyond <cmath>.
//
// Invariants that make host and device agree bit for bit:
//  - only IEEE-754 basic operations (+ - * / sqrt) and fmaf, each correctly rounded on both sides:
//    the kernels are built with --fmad=false (no silent contraction; every fma is written as fmaf)
//    and without --use_fast_math (IEEE division and sqrt, no flush to zero); the host with
//    -ffp-contract=off;
//  - exp and log are the polynomials below, not the platform's expf/logf (whose last bits differ
//    between glibc and libdevice);
//  - every reduction has one written order (sequential, or the 32-lane tree of tree32).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define QK_HD __host__ __device__ __forceinline__
#else
#define QK_HD inline
#endif
#ifdef __CUDA_ARCH__
#define QK_UNROLL _Pragma("unroll")
#else
#define QK_UNROLL
#endif

namespace qkmla::gpu {

// One rounded product, sum or difference that no compiler contracts into an fma, whatever its
// flags (__fmul_rn and friends are never contracted; nvcc's --fmad=false is then a second line of
// defence, not the only one; the host build has -ffp-contract=off). tests/gpu/no_contraction.sh
// checks the PTX of --fmad=true and --fmad=false agree.
QK_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
QK_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
QK_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

QK_HD uint32_t f2u(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

QK_HD float u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

QK_HD float qk_inf() { return u2f(0x7f800000u); }
QK_HD float qk_nan() { return u2f(0x7fc00000u); }
QK_HD bool qk_isnan(float x) { return x != x; }

// ---- storage formats: float -> bits with round-to-nearest-even, bits -> float exactly ----

QK_HD uint16_t float_to_bf16(float x) {
  uint32_t u = f2u(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // ties to even; a carry into the exponent rounds up to inf
  return uint16_t(u >> 16);
}
QK_HD float bf16_to_float(uint16_t b) { return u2f(uint32_t(b) << 16); }

// Rounds the integer m (an exact quotient's numerator) right by `shift` bits, ties to even.
QK_HD uint32_t rne_shift(uint32_t m, int shift) {
  if (shift <= 0) return m;
  if (shift > 31) return 0;
  const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

QK_HD uint16_t float_to_half(float x) {
  const uint32_t u = f2u(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  const int e = int(a >> 23);
  if (e >= 113) {  // normal half: rebias the exponent, round the 13 dropped bits
    const uint32_t m = a - 0x38000000u;
    return uint16_t(sign | rne_shift(m, 13));
  }
  if (e == 0) return uint16_t(sign);  // float subnormals are far below half's quantum 2^-24
  // Subnormal half: quotient by the quantum 2^-24 is mant * 2^(e - 126).
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  return uint16_t(sign | rne_shift(mant, 126 - e));
}
QK_HD float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = mul_rn(float(m), 5.9604644775390625e-8f);  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
  return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

// OCP E4M3 (bias 7, max 448, no inf; S.1111.111 is NaN). Saturates at +-448 (conventions §3).
QK_HD uint8_t float_to_e4m3(float x) {
  const uint32_t u = f2u(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7fu);
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448 (and inf) saturate
  const int e = int(a >> 23);
  if (e >= 121) {  // normal e4m3 (>= 2^-6): rebias 127 -> 7, keep 3 mantissa bits
    const uint32_t q = rne_shift(a - (120u << 23), 20);
    return uint8_t(sign | (q > 0x7eu ? 0x7eu : q));
  }
  if (e == 0) return uint8_t(sign);
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;  // quantum 2^-9: mant * 2^(e - 150 + 9)
  return uint8_t(sign | rne_shift(mant, 141 - e));
}
QK_HD float e4m3_to_float(uint8_t c) {
  const uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
  float v;
  if ((c & 0x7fu) == 0x7fu) return qk_nan();
  if (e == 0)
    v = mul_rn(float(m), 0.001953125f);  // m * 2^-9
  else
    v = u2f(((e + 120u) << 23) | (m << 20));
  return (c & 0x80u) ? -v : v;
}

// ---- elementary functions ----

// exp(x) for x <= 88 (the kernels only call it with x <= 0: softmax and split weights).
// x < -87.33654 (a result below 2^-126, the smallest normal) returns 0: such a term is below 2^-126
// of the row's largest, which is 1, and cannot change an fp32 sum.
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor polynomial (truncation
// < 2^-27 relative), scaled by 2^n with one correctly rounded multiply. Error about 1 ulp.
QK_HD float qk_exp(float x) {
  if (qk_isnan(x)) return x;
  if (!(x >= -87.33654f)) return 0.0f;
  if (x > 88.0f) return qk_inf();
  const float n = rintf(mul_rn(x, 1.44269504f));
  float r = fmaf(n, -0.693145751953125f, x);  // ln2 high part: 16 bits, n * hi exact
  r = fmaf(n, -1.428606765330187e-06f, r);    // ln2 low part
  float p = 1.0f / 5040.0f;
  p = fmaf(p, r, 1.0f / 720.0f);
  p = fmaf(p, r, 1.0f / 120.0f);
  p = fmaf(p, r, 1.0f / 24.0f);
  p = fmaf(p, r, 1.0f / 6.0f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  return mul_rn(p, u2f(uint32_t(int(n) + 127) << 23));
}

// log(x) for x > 0 (the kernels call it with softmax sums >= 1). log(1) = 0 exactly.
// x = 2^e m with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(f), f = (m-1)/(m+1), odd series to f^9
// (truncation < 2^-28 relative); e ln2 added in two parts.
QK_HD float qk_log(float x) {
  if (qk_isnan(x) || x < 0.0f) return qk_nan();
  if (x == 0.0f) return -qk_inf();
  if (x == qk_inf()) return x;
  int bias = 0;
  if (x < 1.17549435e-38f)
    x = mul_rn(x, 8388608.0f), bias = -23;  // subnormal input: scale by 2^23 exactly
  const uint32_t u = f2u(x);
  int e = int(u >> 23) - 127 + bias;
  float m = u2f((u & 0x7fffffu) | 0x3f800000u);
  if (m > 1.41421356f) m = mul_rn(m, 0.5f), e += 1;
  const float f = (m - 1.0f) / (m + 1.0f), s = mul_rn(f, f);
  float p = 1.0f / 9.0f;
  p = fmaf(p, s, 1.0f / 7.0f);
  p = fmaf(p, s, 1.0f / 5.0f);
  p = fmaf(p, s, 1.0f / 3.0f);
  const float lm =
      fmaf(mul_rn(mul_rn(2.0f, f), s), p, mul_rn(2.0f, f));  // 2f + 2f s (1/3 + s/5 + ...)
  const float fe = float(e);
  return fmaf(fe, 0.693145751953125f, fmaf(fe, 1.428606765330187e-06f, lm));
}

// 1 / sqrt(ss / n + eps): IEEE sqrt and division (never the approximate rsqrt).
QK_HD float inv_rms(float ss, int n, float eps) { return 1.0f / sqrtf(ss / float(n) + eps); }

// Sequential fma sum of squares and dot product (the order every thread and the model use).
QK_HD float sum_sq(const float* z, int n) {
  float s = 0.0f;
  for (int j = 0; j < n; ++j) s = fmaf(z[j], z[j], s);
  return s;
}

// One lane's share of a dot product over n elements: j = lane + 32 m for m = 0, 1, ... (j < n), in
// that order. b(m) is the lane's m-th element of the second operand (the kernels hold it in a
// register array, the model reads memory); at most MaxPerLane elements per lane.
template <int MaxPerLane, class LoadA, class LoadB>
QK_HD float lane_partial(const LoadA& a, const LoadB& b, int n, int lane) {
  float s = 0.0f;
  QK_UNROLL
  for (int m = 0; m < MaxPerLane; ++m) {
    const int j = lane + 32 * m;
    if (j < n) s = fmaf(a(j), b(m), s);
  }
  return s;
}

// lane_partial for N dot products that share the operand a (one query row against N keys): each
// s[u] is lane_partial(a, b(u, .))'s chain, the same fmaf in the same order; one load of a(j)
// serves all N (the decode kernel's score pass over several tokens).
template <int MaxPerLane, int N, class LoadA, class LoadB>
QK_HD void lane_partials(const LoadA& a, const LoadB& b, int n, int lane, float (&s)[N]) {
  QK_UNROLL
  for (int u = 0; u < N; ++u) s[u] = 0.0f;
  QK_UNROLL
  for (int m = 0; m < MaxPerLane; ++m) {
    const int j = lane + 32 * m;
    if (j < n) {
      const float x = a(j);
      QK_UNROLL
      for (int u = 0; u < N; ++u) s[u] = fmaf(x, b(u, m), s[u]);
    }
  }
}

// The warp reduction order: round k adds lane l + off into lane l, off = 16, 8, 4, 2, 1. The
// device's xor butterfly (v + shfl_xor(v, off)) computes the same sums in every lane (fp addition
// is commutative), so lane 0 of the device holds exactly tree32's result.
QK_HD float tree32(float* v) {
  for (int off = 16; off >= 1; off >>= 1)
    for (int l = 0; l < off; ++l) v[l] = v[l] + v[l + off];
  return v[0];
}

// Rotation of pair (a, b) by (c, s): (a c - b s, a s + b c), each product rounded (no fma).
QK_HD void rotate_pair(float& a, float& b, float c, float s) {
  const float x = sub_rn(mul_rn(a, c), mul_rn(b, s)), y = add_rn(mul_rn(a, s), mul_rn(b, c));
  a = x;
  b = y;
}

QK_HD void rope_rotate(float* z, int d_r, bool interleaved, const float* cos_row,
                       const float* sin_row) {
  for (int j = 0; j < d_r / 2; ++j) {
    const int ia = interleaved ? 2 * j : j, ib = interleaved ? 2 * j + 1 : j + d_r / 2;
    rotate_pair(z[ia], z[ib], cos_row[j], sin_row[j]);
  }
}

}  // namespace qkmla::gpu
