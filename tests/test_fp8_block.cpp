// fp8_block128.*: FlashMLA's fp8 cache format as a profile (conventions §3 fp8-block128).
#include <doctest/doctest.h>

#include <cmath>

#include "core/generator.hpp"
#include "helpers.hpp"
#include "impl/profile_math.hpp"

using namespace qkmla;

TEST_CASE("fp8_block128.quantize.smallest_power_of_two_scale_per_block") {
  const uint64_t seed = test::seed(601);
  CAPTURE(seed);
  for (const char* scenario : {"normal", "outliers", "tiny_keys"}) {
    CAPTURE(scenario);
    MlaConfig c = test::tiny_config(Profile::FP8_B128, {0, 9, 20}, 1, NormMode::Blockwise, seed,
                                    "paper-g8");  // r = 512: four blocks per token
    c.scenario = scenario;
    const Case k = generate_case(c);
    MlaConfig cb = c;
    cb.profile = Profile::BF16;
    const Case bf = generate_case(cb);  // the bf16 cache it was quantized from
    const Tensor &codes = k.get("kv_c"), &scale = k.get("kv_c_scale"), &c16 = bf.get("kv_c");
    REQUIRE(scale.shape == std::vector<int64_t>{3, 22, 4});
    int64_t blocks = 0;
    for (int b = 0; b < c.batch; ++b)
      for (int64_t t = 0; t < c.seqlens[size_t(b)]; ++t)
        for (int j = 0; j < 4; ++j, ++blocks) {
          const double s = scale.at({b, t, j});
          int e = 0;
          CHECK(std::frexp(s, &e) == 0.5);  // a power of two
          double amax = 0;
          for (int l = 128 * j; l < 128 * (j + 1); ++l) {
            amax = std::max(amax, std::fabs(c16.at({b, t, l})));
            CHECK(std::fabs(codes.at({b, t, l})) <= 448);
            CHECK(k.latent().at({b, t, l}) == codes.at({b, t, l}) * s);  // exact
            CHECK(round_to(DType::F8_E4M3, c16.at({b, t, l}) / s) == codes.at({b, t, l}));
          }
          CHECK(amax / s <= 448);  // large enough, and the smallest such (or the 1e-4 clamp)
          CHECK((amax / (s / 2) > 448 || s / 2 < 1e-4));
        }
    CHECK(blocks == 4 * 29);
  }
}

// Every implementation reads the dequantized cache through latent_rows: per block, not per token
// (a per-token read of the [B, T_max, 4] scales made golden write NaN alpha_k at r = 512).
TEST_CASE("fp8_block128.impl.latent_rows_reads_each_blocks_scale") {
  const Case k = generate_case(test::tiny_config(Profile::FP8_B128, {5, 20}, 1, NormMode::Blockwise,
                                                 test::seed(602), "paper-g8"));
  for (int b = 0; b < 2; ++b) {
    const int64_t T = k.cfg.seqlens[size_t(b)];
    const std::vector<double> rows = impl::latent_rows<double>(k, b, T);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t l = 0; l < 512; ++l)
        CHECK(rows[size_t(t * 512 + l)] == k.latent().at({b, t, l}));
  }
}
