// gpu.math.*: the scalar arithmetic shared by the kernels and their CPU model
// (gpu/kernels/math.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "gpu/kernels/math.hpp"
#include "helpers.hpp"

using namespace qkmla;
using namespace qkmla::gpu;

namespace {

// Random floats over the whole exponent range (subnormals included), both signs.
float random_float(std::mt19937_64& g) {
  for (;;) {
    const float x = u2f(uint32_t(g()));
    if (std::isfinite(x)) return x;
  }
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

}  // namespace

TEST_CASE("gpu.math.storage_rounding_matches_round_to") {
  // The kernels' float -> bf16/fp16/e4m3 conversions are the project's one-step RNE rounding.
  const uint64_t s = test::seed(401);
  CAPTURE(s);
  std::mt19937_64 g(s);
  for (int n = 0; n < 300000; ++n) {
    float x = random_float(g);
    if (n % 3 == 1)
      x = std::ldexp(x, -int(std::ilogb(x)) + int(g() % 40) - 30);  // around 1: ties and e4m3 range
    CAPTURE(x);
    REQUIRE(same(bf16_to_float(float_to_bf16(x)), round_to(DType::BF16, x)));
    REQUIRE(same(half_to_float(float_to_half(x)), round_to(DType::F16, x)));
    REQUIRE(same(e4m3_to_float(float_to_e4m3(x)), round_to(DType::F8_E4M3, x)));
  }
  // Exact ties (half-way between two neighbours) go to the even neighbour.
  CHECK(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)) == 1.0f);
  CHECK(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  CHECK(half_to_float(float_to_half(1.0f + 0x1p-11f)) == 1.0f);
  CHECK(half_to_float(float_to_half(0x1p-25f)) == 0.0f);          // half the smallest subnormal
  CHECK(half_to_float(float_to_half(3 * 0x1p-25f)) == 0x1p-23f);  // 1.5 quanta -> 2 (even)
  CHECK(half_to_float(float_to_half(65520.0f)) == INFINITY);
  CHECK(e4m3_to_float(float_to_e4m3(1000.0f)) == 448.0f);  // saturation
  CHECK(e4m3_to_float(float_to_e4m3(-INFINITY)) == -448.0f);
  CHECK(std::isnan(e4m3_to_float(float_to_e4m3(NAN))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST_CASE("gpu.math.exp_log_within_2_ulp") {
  // qk_exp / qk_log replace expf / logf so that host and device agree; their accuracy is measured
  // here against double: <= 2 ulp of fp32 (proofs/gpu_kernels.md K.0).
  auto ulps = [](float got, double want) {
    const double u = std::ldexp(1.0, std::ilogb(float(want)) - 23);
    return std::fabs(double(got) - want) / u;
  };
  double worst_exp = 0, worst_log = 0;
  for (int n = 0; n <= 400000; ++n) {
    const float x = -87.33f * float(n) / 400000.0f;
    if (std::exp(double(x)) < 0x1p-126)
      continue;  // normal results only; smaller ones are flushed to 0
    worst_exp = std::max(worst_exp, ulps(qk_exp(x), std::exp(double(x))));
  }
  std::mt19937_64 g(test::seed(402));
  for (int n = 0; n < 400000; ++n) {
    const float x = std::ldexp(1.0f + float(g() % (1u << 23)) * 0x1p-23f, int(g() % 60) - 20);
    worst_log = std::max(worst_log, ulps(qk_log(x), std::log(double(x))));
  }
  MESSAGE("qk_exp worst " << worst_exp << " ulp, qk_log worst " << worst_log << " ulp");
  CHECK(worst_exp <= 2.0);
  CHECK(worst_log <= 2.0);
  CHECK(qk_exp(0.0f) == 1.0f);  // a single split's weight is exactly 1 (combine is then exact)
  CHECK(qk_log(1.0f) == 0.0f);
  CHECK(qk_exp(-INFINITY) == 0.0f);
  CHECK(qk_exp(-87.34f) == 0.0f);
  CHECK(qk_exp(-87.0f) > 0.0f);
  CHECK(std::isnan(qk_exp(NAN)));
  CHECK(std::isnan(qk_log(-1.0f)));
  CHECK(qk_log(0.0f) == -INFINITY);
}

TEST_CASE("gpu.math.tree32_is_the_warp_butterfly") {
  // The device reduces with v + shfl_xor(v, off); every lane must end with tree32's value.
  std::mt19937_64 g(test::seed(403));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int rep = 0; rep < 2000; ++rep) {
    float lanes[32], tree[32];
    for (int l = 0; l < 32; ++l) lanes[l] = tree[l] = nd(g) * std::ldexp(1.0f, int(g() % 40) - 20);
    for (int off = 16; off >= 1; off >>= 1) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ off];
      std::copy(next, next + 32, lanes);
    }
    const float t = tree32(tree);
    for (int l = 0; l < 32; ++l) REQUIRE(f2u(lanes[l]) == f2u(t));
  }
}

TEST_CASE("gpu.math.lane_partials_are_lane_partial_chains") {
  // The decode kernel scores two tokens per warp pass with lane_partials; the model scores one at a
  // time with lane_partial. Each of the N chains must be the single chain, bit for bit, for every
  // lane and every length (including lengths that leave lanes short).
  std::mt19937_64 g(4242);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + int(g() % 512);
    std::vector<float> q(512), k0(512), k1(512), k2(512);
    for (size_t j = 0; j < 512; ++j) {
      q[j] = float(int(g() % 2001) - 1000) / 9.0f;
      k0[j] = float(int(g() % 2001) - 1000) / 7.0f;
      k1[j] = random_float(g) * 1e-30f;
      k2[j] = float(int(g() % 2001) - 1000) / 3.0f;
    }
    const std::vector<float>* ks[3] = {&k0, &k1, &k2};
    for (int lane = 0; lane < 32; ++lane) {
      float s[3];
      lane_partials<16>([&](int j) { return q[size_t(j)]; },
                        [&](int u, int m) { return (*ks[u])[size_t(lane + 32 * m)]; }, n, lane, s);
      for (int u = 0; u < 3; ++u) {
        const float one =
            lane_partial<16>([&](int j) { return q[size_t(j)]; },
                             [&](int m) { return (*ks[u])[size_t(lane + 32 * m)]; }, n, lane);
        REQUIRE(f2u(s[u]) == f2u(one));
      }
    }
  }
}
