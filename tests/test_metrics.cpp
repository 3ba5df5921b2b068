// metrics.*: the comparator's definitions (conventions §5) on hand-computed cases.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "metrics/compare.hpp"
#include "metrics/structure.hpp"

using namespace qkmla;

TEST_CASE("metrics.compare.definitions") {
  Tensor y(DType::F64, {4}), x(DType::F32, {4});
  y.data = {1.0, -2.0, 0.5, 4.0};
  x.data = {1.0, -2.25, 0.5, 4.0};
  const Metrics m = compare(x, y, DType::BF16, {});
  CHECK(m.max_abs == 0.25);
  CHECK(m.worst.index == std::vector<int64_t>{1});
  CHECK(m.worst.value == -2.25);
  CHECK(m.worst.ref == -2.0);
  CHECK(m.max_ulp == doctest::Approx(0.25 / 0x1p-6));  // bf16 ulp at 2 is 2^-6
  const double y2 = 1 + 4 + 0.25 + 16, x2 = 1 + 2.25 * 2.25 + 0.25 + 16;
  CHECK(m.rel_l2 == doctest::Approx(0.25 / std::sqrt(y2)));
  const double dot = 1 + 4.5 + 0.25 + 16;
  CHECK(m.cos_diff == doctest::Approx(1 - 2 * dot / (x2 + y2)));
  CHECK(m.nonfinite_mismatch == 0);
  CHECK(m.compared == 4);
}

TEST_CASE("metrics.compare.nonfinite_and_masks") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  Tensor y(DType::F64, {6}), x(DType::F64, {6});
  y.data = {-inf, inf, nan, 1.0, 2.0, nan};
  x.data = {-inf, -inf, nan, nan, 2.0, 5.0};
  Metrics m = compare(x, y, DType::F64, {});
  CHECK(m.nonfinite_mismatch == 3);  // inf sign, NaN vs 1, 5 vs NaN
  CHECK(m.compared == 1);
  m = compare(x, y, DType::F64, {true, true, true, true, true, false});  // last slot unspecified
  CHECK(m.nonfinite_mismatch == 2);
}

// The structure statistics on hand-computed tensors: [B=2, S_q=1, H=2, w=2] and lse [2, 1, 2].
TEST_CASE("metrics.structure.definitions") {
  Tensor y(DType::F64, {2, 1, 2, 2}), x(DType::F32, {2, 1, 2, 2});
  y.data = {1, 0, 0, 1, 2, 0, 0, 2};
  x = y;
  x.data[3] = 1.1;  // head 1 of sequence 0: +10 % on its one non-zero value
  Structure s = structure_of(x, y, {});
  CHECK(s.worst_row == doctest::Approx(0.1));                  // row (0, 0, 1)
  CHECK(s.worst_head == doctest::Approx(0.1 / std::sqrt(5)));  // head 1: 0.1 over |y| = sqrt(5)
  CHECK(s.worst_seq == doctest::Approx(0.1 / std::sqrt(2)));
  CHECK(s.bias == doctest::Approx(0.1 / 10));        // <e, y> / <y, y> = 0.1 / 10
  CHECK(s.row_bias == doctest::Approx(0.1 / 2));     // rows' projections: 0, .1, 0, 0
  CHECK(std::isnan(s.seq_shift));                    // lse only
  CHECK(s.bias_noise == doctest::Approx(0.1 / 10));  // one row's <e, y> = 0.1, over <y, y>
  // rows' sqrt(sum e^2 y^2) / <y, y>: 0, 0.1, 0, 0; their RMS
  CHECK(s.row_bias_noise == doctest::Approx(0.1 / 2));
  // Errors that cancel in a row's projection: its draw is 0, its noise level is not (row
  // (0, 0, 0): e = (0.1, -0.1) against y = (1, 1)).
  y.data[1] = 1;
  x.data = y.data;
  x.data[0] = 1.1, x.data[1] = 0.9;
  s = structure_of(x, y, {});
  CHECK(s.row_bias == doctest::Approx(0.0).epsilon(1e-12));
  CHECK(s.row_bias_noise == doctest::Approx(std::sqrt(0.02) / 2 / 2));  // sqrt(.01 + .01) / 2
  y.data[1] = 0;
  x.data = y.data;  // a 1 % scale everywhere: every projection is -0.01
  for (double& v : x.data) v *= 0.99;
  s = structure_of(x, y, {});
  CHECK(s.bias == doctest::Approx(0.01));
  CHECK(s.row_bias == doctest::Approx(0.01));
  // rows' <e, y>: -0.01, -0.01, -0.04, -0.04 (<y, y> 1, 1, 4, 4), as independent draws
  CHECK(s.bias_noise == doctest::Approx(std::sqrt(0.0034) / 10));
  CHECK(s.row_bias_noise == doctest::Approx(0.01));  // every row: 0.01 sqrt(sum y^4) / sum y^2
  // lse: one row wrong by 0.5 at |lse| = 0.1: measured against max(|y|, 1), so 0.5.
  Tensor ly(DType::F64, {2, 1, 2}), lx(DType::F32, {2, 1, 2});
  ly.data = {0.1, 3.0, -INFINITY, 8.0};
  lx.data = {0.6, 3.0, -INFINITY, 8.0};
  s = structure_of(lx, ly, {});
  CHECK(s.worst_row == doctest::Approx(0.5));
  CHECK(std::isnan(s.row_bias));
  CHECK(std::isnan(s.bias));  // lse's values share an offset (log T): no projection statistic
  // seq_shift: sequence 0's errors 0.5 and 0 (mean 0.25); sequence 1's finite row is exact.
  CHECK(s.seq_shift == doctest::Approx(0.25));
  lx.data[0] = 0.1, lx.data[1] = 2.5, lx.data[3] = 8.25;  // -0.5 in sequence 0, +0.25 in 1
  CHECK(structure_of(lx, ly, {}).seq_shift == doctest::Approx(0.25));
  lx.data = {0.6, 3.0, -INFINITY, 8.0};
  // A one-token row (floor 0) is measured relatively: 0.5 at 0.1 is 5.
  s = structure_of(lx, ly, {}, {0.0, 1.0, 1.0, 1.0});
  CHECK(s.worst_row == doctest::Approx(5.0));
  // seq_shift: sequence 0's one-token row is a projection entry, 0.5 x 0.1 / 0.1^2 = 5; its other
  // row is exact. Entries: (mean, projection) per sequence; the mean's scale is its rows' RMS.
  REQUIRE(s.seq_mean.size() == 4);
  CHECK(s.seq_mean[1] == doctest::Approx(5.0));
  CHECK(s.seq_noise[1] == doctest::Approx(5.0));  // one value: its noise level is itself
  CHECK(s.seq_mean[0] == 0.0);
  CHECK(s.seq_scale[0] == doctest::Approx(3.0));
  // a projection's scale: max(1, 1 / RMS of its y), what an absolute error of 1 moves it by
  CHECK(s.seq_scale[1] == doctest::Approx(10.0));
  CHECK(s.seq_shift == doctest::Approx(5.0));
  // Two one-token values, errors 0.5 and 0 at 0.1 and 3: one unit, 0.5 / sqrt(9.01).
  s = structure_of(lx, ly, {}, {0.0, 0.0, 1.0, 1.0});
  CHECK(s.worst_row == doctest::Approx(0.5 / std::sqrt(9.01)));
}
