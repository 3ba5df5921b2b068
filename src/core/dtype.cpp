#include "core/dtype.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace qkmla {

FloatFormat format_of(DType d) {
  switch (d) {
    case DType::F64:
      return {53, -1022, 1023, std::numeric_limits<double>::max(), true};
    case DType::F32:
      return {24, -126, 127, double(std::numeric_limits<float>::max()), true};
    case DType::F16:
      return {11, -14, 15, 65504.0, true};
    case DType::BF16:
      return {8, -126, 127, std::ldexp(255.0, 120), true};
    case DType::F8_E4M3:
      return {4, -6, 8, 448.0, false};
    case DType::I32:
    case DType::U8:
      break;
  }
  throw std::invalid_argument("format_of: an integer type is not a floating-point format");
}

std::string dtype_name(DType d) {
  switch (d) {
    case DType::F64:
      return "F64";
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::F8_E4M3:
      return "F8_E4M3";
    case DType::I32:
      return "I32";
    case DType::U8:
      return "U8";
  }
  return "?";
}

DType dtype_from_name(const std::string& s) {
  for (DType d :
       {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::I32, DType::U8})
    if (dtype_name(d) == s) return d;
  throw std::invalid_argument("unsupported dtype '" + s +
                              "' (supported: F64, F32, F16, BF16, F8_E4M3, I32, U8)");
}

int dtype_size(DType d) {
  switch (d) {
    case DType::F64:
      return 8;
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::F16:
    case DType::BF16:
      return 2;
    case DType::F8_E4M3:
    case DType::U8:
      return 1;
  }
  return 0;
}

double round_to(DType d, double x) {
  if (d == DType::F64 || std::isnan(x)) return x;
  if (d == DType::I32) return std::nearbyint(x);
  if (d == DType::U8) return std::clamp(std::nearbyint(x), 0.0, 255.0);
  if (d == DType::F32) return double(static_cast<float>(x));  // hardware RNE, one step
  const float xf = static_cast<float>(x);
  if (double(xf) == x && (d == DType::BF16 || d == DType::F16)) {
    // x is a float: one RNE step from its bits (bf16: carry into the upper half; fp16: Eigen's
    // float->half, which rounds to nearest even). The slow path below gives the same result.
    if (d == DType::F16) return float(Eigen::half(xf));
    return round_bf16(xf);
  }
  const FloatFormat f = format_of(d);
  if (std::isinf(x)) return f.has_inf ? x : std::copysign(f.max_finite, x);
  if (x == 0.0) return x;
  // Quantum exponent of x in the target format; scaling by a power of two is exact here.
  const int q = std::max(std::ilogb(x), f.emin) - (f.precision - 1);
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);  // nearbyint: RNE mode
  if (std::fabs(r) > f.max_finite)
    return f.has_inf ? std::copysign(std::numeric_limits<double>::infinity(), x)
                     : std::copysign(f.max_finite, x);
  return r;
}

double ulp_in(DType d, double y) {
  if (!std::isfinite(y)) return std::numeric_limits<double>::quiet_NaN();
  const FloatFormat f = format_of(d);
  const int e = (y == 0.0) ? f.emin : std::max(std::ilogb(y), f.emin);
  return std::ldexp(1.0, e - (f.precision - 1));
}

double unit_roundoff(DType d) { return std::ldexp(1.0, -format_of(d).precision); }

static void require_exact(DType d, double v) {
  if (!std::isnan(v) && round_to(d, v) != v)
    throw std::domain_error("value " + std::to_string(v) + " is not representable in " +
                            dtype_name(d));
}

uint16_t encode16(DType d, double v) {
  require_exact(d, v);
  const float f = static_cast<float>(v);  // exact: F16 and BF16 values are floats
  if (d == DType::BF16) {
    if (std::isnan(f)) return 0x7FC0;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t(u >> 16);
  }
  if (d == DType::F16) return Eigen::numext::bit_cast<uint16_t>(Eigen::half(f));
  throw std::invalid_argument("encode16: dtype must be F16 or BF16");
}

double decode16(DType d, uint16_t bits) {
  if (d == DType::BF16) {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  if (d == DType::F16) return float(Eigen::numext::bit_cast<Eigen::half>(bits));
  throw std::invalid_argument("decode16: dtype must be F16 or BF16");
}

// e4m3 (the "fn" variant): bias 7, no infinities, S.1111.111 is NaN, max 448.
uint8_t encode_e4m3(double v) {
  if (std::isnan(v)) return 0x7F;
  require_exact(DType::F8_E4M3, v);
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(v);
  if (a == 0.0) return sign;
  const int e = std::max(std::ilogb(a), -6);
  const int mant = int(std::ldexp(a, 3 - e));  // 8..15 for normals, 1..7 for subnormals
  if (mant < 8) return uint8_t(sign | mant);
  return uint8_t(sign | ((e + 7) << 3) | (mant - 8));
}

double decode_e4m3(uint8_t bits) {
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const int exp = (bits >> 3) & 0xF, mant = bits & 7;
  if (exp == 0xF && mant == 7) return std::numeric_limits<double>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(mant, -9);
  return sign * std::ldexp(8 + mant, exp - 10);
}

}  // namespace qkmla
