// The MMA probe's tiles and file format, shared by the probe (gpu/kernels/probe_mma.cu, host side)
// and the CPU fitter (gpu/model/mma_model.hpp). Plain C++17, no CUDA.
//
// A tile is one m16n8k16 product D = A B + C: A [16 x 16] and B [16 x 8] as bf16 or fp16 bit
// patterns (row-major, A[m][k], B[k][n]), C and D [16 x 8] fp32. The probe file is a sequence of
// tiles, each 1796 bytes, little-endian:
//   u8 kind (MmaKind), u8 class (TileClass), u16 zero, u16 A[256], u16 B[128], f32 C[128], f32
//   D[128]
// (wgmma m64n8k16 writes its four 16-row slices as four tiles). Each output element d[m][n] is one
// 16-term dot product plus c[m][n]: what gpu/model/mma_model.hpp models and fits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

namespace qkmla::gpu::mma {

enum class MmaKind : uint8_t { MmaBF16 = 0, MmaFP16 = 1, WgmmaBF16 = 2 };
enum class TileClass : uint8_t { Random = 0, Cancellation = 1, ExponentSpread = 2, Subnormal = 3 };
constexpr int kM = 16, kN = 8, kK = 16, kTileBytes = 4 + 2 * (kM * kK + kK * kN) + 4 * 2 * kM * kN;

struct Tile {
  MmaKind kind = MmaKind::MmaBF16;
  TileClass cls = TileClass::Random;
  uint16_t a[kM * kK], b[kK * kN];
  float c[kM * kN], d[kM * kN];
};

inline bool is_fp16(MmaKind k) { return k == MmaKind::MmaFP16; }

// The value of a bf16 or fp16 bit pattern (exact in fp32).
inline float decode(bool fp16, uint16_t h) {
  if (!fp16) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const int e = (h >> 10) & 31, m = h & 1023;
  const float v =
      e == 0 ? float(m) * 0x1p-24f : (1.0f + float(m) * 0x1p-10f) * std::ldexp(1.0f, e - 15);
  return (h & 0x8000) ? -v : v;
}

// A bit pattern from its fields: exponent field `e` (biased), mantissa `m` (masked).
inline uint16_t encode(bool fp16, bool neg, int e, uint32_t m) {
  return uint16_t((neg ? 0x8000u : 0u) |
                  (fp16 ? (uint32_t(e) << 10 | (m & 1023u)) : (uint32_t(e) << 7 | (m & 127u))));
}

// Random and adversarial inputs of one class (C too; D is left for the instruction or the model).
inline void make_tile(Tile& t, MmaKind kind, TileClass cls, std::mt19937_64& g) {
  t.kind = kind, t.cls = cls;
  const bool h = is_fp16(kind);
  const int bias = h ? 15 : 127, emax = h ? 30 : 254;
  auto coin = [&] { return (g() & 1) != 0; };
  auto range = [&](int lo, int hi) { return lo + int(g() % uint64_t(hi - lo + 1)); };
  auto normal = [&](int lo, int hi) {  // exponent field in [bias + lo, bias + hi], clamped
    const int e = std::max(1, std::min(emax, bias + range(lo, hi)));
    return encode(h, coin(), e, uint32_t(g()));
  };
  for (int i = 0; i < kM * kK; ++i) t.a[i] = normal(-3, 3);
  for (int i = 0; i < kK * kN; ++i) t.b[i] = normal(-3, 3);
  auto f32 = [&](int lo, int hi) {
    return std::ldexp(float(int(g() % (1u << 24))) * 0x1p-24f + 1.0f, range(lo, hi)) *
           (coin() ? -1 : 1);
  };
  for (int i = 0; i < kM * kN; ++i) t.c[i] = f32(-3, 3);
  switch (cls) {
    case TileClass::Random:
      break;
    case TileClass::Cancellation:  // a[m][k + 8] = -a[m][k], b[k + 8] = b[k]: big terms cancel
      for (int m = 0; m < kM; ++m)
        for (int k = 0; k < 8; ++k) t.a[m * kK + k + 8] = uint16_t(t.a[m * kK + k] ^ 0x8000u);
      for (int k = 0; k < 8; ++k)
        for (int n = 0; n < kN; ++n) t.b[(k + 8) * kN + n] = t.b[k * kN + n];
      for (int m = 0; m < kM; ++m) {  // a few small survivors, and a c that is small or cancels
        t.a[m * kK + range(0, 15)] = normal(-14, -6);
        t.c[m * kN + range(0, 7)] = f32(-20, -8);
      }
      break;
    case TileClass::ExponentSpread:
      for (int i = 0; i < kM * kK; ++i) t.a[i] = normal(h ? -14 : -40, h ? 15 : 20);
      for (int i = 0; i < kK * kN; ++i) t.b[i] = normal(h ? -8 : -20, h ? 8 : 10);
      for (int i = 0; i < kM * kN; ++i) t.c[i] = f32(-40, 30);
      break;
    case TileClass::Subnormal:  // input subnormals (exponent field 0) among small normals
      for (int i = 0; i < kM * kK; ++i)
        t.a[i] = coin() ? encode(h, coin(), 0, uint32_t(g()) | 1u) : normal(-3, 3);
      for (int i = 0; i < kK * kN; ++i)
        t.b[i] = coin() ? normal(h ? 8 : 60, h ? 14 : 100) : normal(-2, 2);
      for (int i = 0; i < kM * kN; ++i)
        t.c[i] = coin() ? f32(-140, -127) : f32(h ? -30 : -120, h ? -10 : -100);
      break;
  }
  for (float& x : t.d) x = 0;
}

}  // namespace qkmla::gpu::mma
