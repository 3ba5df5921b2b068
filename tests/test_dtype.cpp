// dtype.*: rounding straight from double to each stored format, ties to even, subnormals,
// overflow; bit encodings.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/dtype.hpp"
#include "core/rng.hpp"
#include "helpers.hpp"
#include "impl/profile_math.hpp"

using namespace qkmla;

TEST_CASE("dtype.bf16.ties_to_even_from_double") {
  // 1 + 2^-8 is exactly halfway between bf16 1 and 1 + 2^-7: ties go to the even significand (1).
  CHECK(round_to(DType::BF16, 1.0 + 0x1p-8) == 1.0);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  CHECK(round_to(DType::BF16, 1.0 + 3 * 0x1p-8) == 1.0 + 0x1p-6);
  // Double rounding trap: x = 1 + 2^-8 + 2^-30 rounds up in one step, but via float it first
  // becomes 1 + 2^-8 (a tie) and then 1. We must round once.
  const double x = 1.0 + 0x1p-8 + 0x1p-30;
  CHECK(round_to(DType::BF16, x) == 1.0 + 0x1p-7);
  CHECK(round_to(DType::BF16, double(float(x))) == 1.0);  // what double rounding would give
  CHECK(round_to(DType::BF16, -(1.0 + 0x1p-8)) == -1.0);
}

TEST_CASE("dtype.fp16.ties_to_even_from_double") {
  CHECK(round_to(DType::F16, 1.0 + 0x1p-11) == 1.0);
  CHECK(round_to(DType::F16, 1.0 + 3 * 0x1p-11) == 1.0 + 0x1p-9);
  // 2048 + 1 is a tie between 2048 and 2050 (spacing 2): to even 2048; 2051 -> 2052.
  CHECK(round_to(DType::F16, 2049.0) == 2048.0);
  CHECK(round_to(DType::F16, 2051.0) == 2052.0);
  const double x = 1.0 + 0x1p-11 + 0x1p-40;  // just above the tie: one-step rounding goes up
  CHECK(round_to(DType::F16, x) == 1.0 + 0x1p-10);
}

TEST_CASE("dtype.subnormals") {
  // fp16 smallest subnormal 2^-24; half of it ties to even (0), three halves to 2^-23.
  CHECK(round_to(DType::F16, 0x1p-24) == 0x1p-24);
  CHECK(round_to(DType::F16, 0x1p-25) == 0.0);
  CHECK(round_to(DType::F16, 3 * 0x1p-25) == 0x1p-23);
  CHECK(round_to(DType::F16, 0x1p-25 + 0x1p-60) == 0x1p-24);
  CHECK(std::signbit(round_to(DType::F16, -0x1p-26)));  // -0 keeps its sign
  // bf16 subnormals share fp32's range: quantum 2^-133.
  CHECK(round_to(DType::BF16, 0x1p-133) == 0x1p-133);
  CHECK(round_to(DType::BF16, 0x1p-134) == 0.0);
  CHECK(round_to(DType::BF16, 1.5 * 0x1p-133) == 0x1p-132);
  CHECK(ulp_in(DType::F16, 0.0) == 0x1p-24);
  CHECK(ulp_in(DType::F16, 1.0) == 0x1p-10);
  CHECK(ulp_in(DType::BF16, 3.0) == 0x1p-6);
}

TEST_CASE("dtype.overflow_to_inf") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(round_to(DType::F16, 65504.0) == 65504.0);
  CHECK(round_to(DType::F16, 65519.99) == 65504.0);  // below max + half ulp
  CHECK(round_to(DType::F16, 65520.0) == inf);       // the tie rounds to even: overflow
  CHECK(round_to(DType::F16, -1e6) == -inf);
  const double bf_max = std::ldexp(255.0, 120);
  CHECK(round_to(DType::BF16, bf_max) == bf_max);
  CHECK(round_to(DType::BF16, bf_max + 0x1p119) == inf);  // exactly max + half ulp: tie, to even
  CHECK(round_to(DType::BF16, bf_max + 0x1p118) == bf_max);
  CHECK(round_to(DType::BF16, 1e300) == inf);
  CHECK(round_to(DType::F32, 1e300) == inf);
  // e4m3 saturates instead.
  CHECK(round_to(DType::F8_E4M3, 1000.0) == 448.0);
  CHECK(round_to(DType::F8_E4M3, -460.0) == -448.0);
  CHECK(std::isnan(round_to(DType::BF16, std::nan(""))));
}

TEST_CASE("dtype.encodings_roundtrip") {
  for (double v : {0.0, 1.0, -2.5, 0x1p-24, 65504.0, 0.333251953125})
    CHECK(decode16(DType::F16, encode16(DType::F16, v)) == v);
  for (double v : {0.0, 1.0, -2.5, 0x1p-133, 1.5, 3.3895313892515355e38})
    CHECK(decode16(DType::BF16, encode16(DType::BF16, v)) == v);
  CHECK(encode16(DType::BF16, 1.0) == 0x3F80);
  CHECK(encode16(DType::F16, 1.0) == 0x3C00);
  for (int code = 0; code < 256; ++code) {
    const double v = decode_e4m3(uint8_t(code));
    if (std::isnan(v)) continue;
    if (v == 0 && code == 0x80) continue;  // -0 encodes as 0x80, decodes as -0
    CHECK(encode_e4m3(v) == code);
  }
  CHECK(decode_e4m3(0x7E) == 448.0);
  CHECK(decode_e4m3(0x01) == 0x1p-9);
  CHECK_THROWS_AS(encode16(DType::BF16, 1.0 + 0x1p-20), std::domain_error);
}

TEST_CASE("dtype.fast_path_matches_slow_path") {
  // Values that are floats take a bit-level path; values that are not, the generic one. Both
  // must agree: compare every float near ties, subnormals and overflow against x + tiny offsets
  // that are not floats but round identically (they sit strictly inside the same interval).
  Rng rng(test::seed(61));
  for (int n = 0; n < 200000; ++n) {
    const int e = int(rng.below(300)) - 150;
    const float f = float(std::ldexp(rng.normal(), e));
    for (DType d : {DType::BF16, DType::F16}) {
      const double r = round_to(d, double(f));
      const double up = std::nextafter(double(f), INFINITY),
                   down = std::nextafter(double(f), -INFINITY);
      // a tie at f would go different ways at f +- 1 ulp(double); otherwise all three agree
      const double ru = round_to(d, up), rd = round_to(d, down);
      CHECK((r == ru || r == rd));
    }
  }
}

// A float's bf16 and fp32 stores are inline in impl::store (every kernel model's keys, scores and
// P go through it): the same bits as round_to, on exact ties of both parities, the largest
// finite values (which round to inf), infinities, subnormals and random floats.
TEST_CASE("dtype.store_inline_matches_round_to") {
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           INFINITY,
                           -INFINITY,
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::denorm_min(),
                           1e-40f};
  for (uint32_t hi : {0x3F80u, 0x3F81u, 0x7F7Fu, 0x0001u, 0xBF80u, 0xBF81u})
    for (uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u, 0x0000u, 0xFFFFu}) {
      const uint32_t u = hi << 16 | lo;
      float f;
      std::memcpy(&f, &u, 4);
      xs.push_back(f);
    }
  Rng rng(test::seed(62));
  for (int n = 0; n < 100000; ++n)
    xs.push_back(float(std::ldexp(rng.normal(), int(rng.below(280)) - 140)));
  int differ = 0;
  for (float f : xs) {
    const float a = impl::store(DType::BF16, f), b = float(round_to(DType::BF16, double(f)));
    const float c = impl::store(DType::F32, f), e = float(round_to(DType::F32, double(f)));
    differ += std::memcmp(&a, &b, 4) != 0 || std::memcmp(&c, &e, 4) != 0;
  }
  CHECK(differ == 0);
  CHECK(std::isnan(impl::store(DType::BF16, std::numeric_limits<float>::quiet_NaN())));
}
