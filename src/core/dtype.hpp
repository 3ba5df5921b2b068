// Storage formats and the one rounding function every implementation uses to store a value.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace qkmla {

// U8: raw bytes of a packed layout (FlashMLA's fp8 cache, docs/layouts.md), values 0-255.
enum class DType { F64, F32, F16, BF16, F8_E4M3, I32, U8 };

// A binary floating-point format: `precision` significand bits (implicit bit included),
// normal exponents in [emin, emax]; max_finite is the largest finite value.
struct FloatFormat {
  int precision;
  int emin;
  int emax;
  double max_finite;
  bool has_inf;  // false for e4m3 (saturating conversions in this project)
};

FloatFormat format_of(DType d);
std::string dtype_name(DType d);              // safetensors spelling: "F64", "BF16", ...
DType dtype_from_name(const std::string& s);  // throws std::invalid_argument
int dtype_size(DType d);                      // bytes per element

// Round x (any double) to the nearest value of format d, ties to even, in one step
// (never through an intermediate format). Overflow gives +-inf, or +-max for e4m3 (saturation).
// NaN stays NaN. I32 rounds to nearest integer (ties to even) without range checks.
double round_to(DType d, double x);

// round_to(BF16, x) for a float x that is not NaN, inline (a kernel model stores every key and
// score this way): one RNE step on the bits, the carry into the upper half (inf stays inf, the
// largest finite values round up to inf as round_to's slow path does).
inline float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// Unit in the last place of y in format d (at zero and in the subnormal range: the subnormal
// quantum). NaN for non-finite y.
double ulp_in(DType d, double y);

// Unit roundoff u = 2^-precision of the format.
double unit_roundoff(DType d);

// Bit encodings of values already representable in d (checked: throws std::domain_error otherwise).
uint16_t encode16(DType d, double v);  // F16 or BF16
double decode16(DType d, uint16_t bits);
uint8_t encode_e4m3(double v);
double decode_e4m3(uint8_t bits);

}  // namespace qkmla
