// reference.exact_dot.*: exact_matmul (X.1-X.2) and sliced_matmul (X.5) against plain MPFR at a
// precision where every sum is exact.
#include <doctest/doctest.h>
#include <mpfr.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "core/rng.hpp"
#include "gemm/ordered_gemm.hpp"
#include "helpers.hpp"
#include "reference/exact_dot.hpp"
#include "reference/mp.hpp"
#include "reference/slice_gemm.hpp"
#include "reference/sliced_product.hpp"

using namespace qkmla;

namespace {

// The exact dot product minus the expansion's exact sum, in MPFR with 4000 bits (products of
// doubles and sums of a few hundred of them within 2^+-1100 are exact there). Returns true iff 0.
bool exact_matches(const std::vector<double>& a, const std::vector<double>& b, int64_t n, int64_t k,
                   int64_t i, int64_t j, const ref::ExactProduct& C) {
  mpfr_t acc, prod;
  mpfr_inits2(4000, acc, prod, (mpfr_ptr) nullptr);
  mpfr_set_zero(acc, 1);
  for (int64_t l = 0; l < n; ++l) {
    mpfr_set_d(prod, a[size_t(i * n + l)], MPFR_RNDN);
    mpfr_mul_d(prod, prod, b[size_t(l * k + j)], MPFR_RNDN);
    mpfr_add(acc, acc, prod, MPFR_RNDN);
  }
  for (double t : C.entry(i, j)) mpfr_sub_d(acc, acc, t, MPFR_RNDN);
  const bool ok = mpfr_zero_p(acc);
  mpfr_clears(acc, prod, (mpfr_ptr) nullptr);
  return ok;
}

enum class Method { Extraction, Sliced };

ref::ExactProduct product(Method how, const std::vector<double>& a, const std::vector<double>& b,
                          int64_t m, int64_t n, int64_t k) {
  if (how == Method::Extraction) return ref::exact_matmul(a.data(), n, m, n, b.data(), k, k);
  const ref::Slicing plan =
      ref::plan_slicing(ref::row_spans(a.data(), n, m, n), ref::col_spans(b.data(), k, n, k), n);
  return ref::sliced_matmul(a.data(), n, m, ref::SlicedWeights(b.data(), k, n, k, plan));
}

void check_all(DType d, double spread, uint64_t seed, Method how = Method::Extraction) {
  CAPTURE(seed);
  CAPTURE(dtype_name(d));
  Rng rng(seed);
  // Ragged against the 8-column blocks; more rows than one 256-row slicing chunk.
  const int64_t m = how == Method::Sliced ? 300 : 9, n = 70, k = 37;
  std::vector<double> a(size_t(m * n)), b(size_t(n * k));
  // spread > 0: magnitudes 2^(-spread..spread) so that one dot needs several extraction levels.
  auto draw = [&] {
    return round_to(d, rng.normal() * std::ldexp(1.0, int(spread * (2 * rng.uniform() - 1))));
  };
  for (double& x : a) x = draw();
  for (double& x : b) x = draw();
  a[3] = 0;  // zeros and exact cancellation must come out right too
  b[5] = -b[6];
  if (how == Method::Sliced) {  // one row far wider than the rest: that chunk needs more slices
    a[size_t(280 * n + 1)] = std::ldexp(1.0, -40) * 3;
    a[size_t(280 * n + 2)] = std::ldexp(1.0, 5);
  }
  const ref::ExactProduct C = product(how, a, b, m, n, k);
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) bad += !exact_matches(a, b, n, k, i, j, C);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("reference.exact_dot.matches_mpfr_bf16") { check_all(DType::BF16, 0, test::seed(11)); }
TEST_CASE("reference.exact_dot.matches_mpfr_fp32") { check_all(DType::F32, 0, test::seed(12)); }
TEST_CASE("reference.exact_dot.matches_mpfr_fp64") { check_all(DType::F64, 0, test::seed(13)); }
TEST_CASE("reference.exact_dot.wide_exponent_spread") {
  // Exponents spread over +-60 (fp32) and +-150 (fp64) binades: more levels, and the scalar path.
  check_all(DType::F32, 60, test::seed(14));
  check_all(DType::F64, 150, test::seed(15));
}
TEST_CASE("reference.exact_dot.sliced_matches_mpfr") {
  check_all(DType::BF16, 0, test::seed(16), Method::Sliced);
  check_all(DType::F32, 0, test::seed(17), Method::Sliced);
  check_all(DType::F64, 0, test::seed(18), Method::Sliced);
  check_all(DType::F32, 60, test::seed(19), Method::Sliced);
}
namespace {

// Every slice an all-ones integer (2^beta - 1): each GEMM's partial sums come within a factor
// n / 2^ceil(log2 n) of 2^53 units, so one bit more per slice than X.5 allows would round.
// Returns the entries of the sliced product that are not exact.
int full_slices_inexact() {
  const int64_t m = 3, n = 70, k = 5;
  std::vector<double> a(size_t(m * n)), b(size_t(n * k));
  const double ones = 1.0 - std::ldexp(1.0, -53);  // 53 set bits
  for (size_t i = 0; i < a.size(); ++i) a[i] = ones * std::ldexp(1.0, -int(i / size_t(n)));
  for (size_t i = 0; i < b.size(); ++i) b[i] = ones * std::ldexp(1.0, int(i % size_t(k)));
  const ref::ExactProduct C = product(Method::Sliced, a, b, m, n, k);
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) bad += !exact_matches(a, b, n, k, i, j, C);
  return bad;
}

}  // namespace

TEST_CASE("reference.exact_dot.sliced_full_slices") { CHECK(full_slices_inexact() == 0); }

// X.5's remainders: with fewer slices than the values need, the bits below them are multiplied
// exactly one by one; every entry must still be the exact dot product, for every split and cap
// (1 slice: nearly every value of an fp64 row has a remainder), in rows and columns alike.
TEST_CASE("reference.sliced_product.remainders_are_exact") {
  const uint64_t seed = test::seed(70052);
  CAPTURE(seed);
  Rng rng(seed);
  const int64_t m = 270, n = 40, k = 530;  // two row chunks, two column tiles
  for (DType d : {DType::F64, DType::BF16}) {
    CAPTURE(dtype_name(d));
    std::vector<double> a(size_t(m * n)), b(size_t(n * k));
    for (double& x : a) x = round_to(d, rng.normal());
    for (double& x : b) x = round_to(d, rng.normal() * std::ldexp(1.0, int(rng.below(9)) - 4));
    a[5] = 0, a[size_t(3 * n + 7)] = std::ldexp(-3.0, -60);  // a deep value in row 3
    b[size_t(9 * k + 2)] = std::ldexp(5.0, -70);             // and one in column 2
    for (const auto [beta_a, beta_b] : {std::pair{24, 23}, std::pair{10, 37}, std::pair{37, 10}})
      for (const int cap : {1, 2}) {
        CAPTURE(beta_a);
        CAPTURE(cap);
        ref::Slicing plan{beta_a, beta_b, cap, cap, 0.0, 0, 0};
        const ref::SlicedWeights W(b.data(), k, n, k, plan);
        size_t rests = 0;
        for (const auto& r : W.rest) rests += r.size();
        CHECK(rests > 0);  // the column with the deep value has one at least
        const ref::ExactProduct C = ref::sliced_matmul(a.data(), n, m, W);
        int bad = 0;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < k; j += (i == 3 || j == 2) ? 1 : 7)
            bad += !exact_matches(a, b, n, k, i, j, C);
        CHECK(bad == 0);
      }
  }
}

// The plan weighs remainders against slices: on data whose spans are set by a few deep values it
// costs no more than slicing every value whole, and counts the remainders it leaves.
TEST_CASE("reference.sliced_product.plan_weighs_remainders") {
  const uint64_t seed = test::seed(70053);
  CAPTURE(seed);
  Rng rng(seed);
  const int64_t m = 1024, n = 512, k = 512;
  std::vector<double> a(size_t(m * n)), b(size_t(n * k));
  for (double& x : a) x = round_to(DType::BF16, rng.normal());
  for (double& x : b) x = round_to(DType::BF16, rng.normal());
  for (int64_t i = 0; i < m; i += 64)
    a[size_t(i * n + 1)] = std::ldexp(1.0, -40);  // 16 deep values
  const ref::Spans as = ref::row_spans(a.data(), n, m, n), bs = ref::col_spans(b.data(), k, n, k);
  const ref::Slicing with = ref::plan_slicing(as, bs, n),
                     whole = ref::plan_slicing(as.per_line, bs.per_line, n);
  CHECK(whole.remainder_a + whole.remainder_b == 0);
  CHECK(whole.width() >= 2);      // the deep values need a second slice of every chunk's rows
  CHECK(with.width() == 1);       // one slice each; the deep values' bits are remainders
  CHECK(with.remainder_a >= 16);  // the planted ones, and the rare tiny normal values
  CHECK(with.remainder_a + with.remainder_b < m * n / 1000);
  CHECK(with.gemms_per_chunk < whole.gemms_per_chunk);
  // No rows (a case without tokens): B is still sliced whole, not left in remainders.
  const ref::Slicing none = ref::plan_slicing(ref::Spans{}, bs, n);
  CHECK(none.remainder_b == 0);
}
TEST_CASE("reference.exact_dot.exponents_from_bits") {
  // trailing_exponent and top_exponent read the bits; libm's frexp and ilogb define them: random
  // magnitudes over the whole range, subnormals, powers of two and both signs.
  const uint64_t s = test::seed(25);
  CAPTURE(s);
  Rng rng(s);
  std::vector<double> xs = {1.0,
                            -1.0,
                            0.75,
                            std::ldexp(1.0, -1074),
                            std::ldexp(3.0, -1074),
                            std::ldexp(1.0, -1022),
                            std::ldexp(1.0, 1023),
                            -0x1.fffffffffffffp+1023,
                            std::ldexp(0x1.8p0, -1060)};
  for (int i = 0; i < 20000; ++i) {
    const double m = (rng.uniform() + 0.5) * (rng.below(2) ? 1 : -1);
    const double x = std::ldexp(std::trunc(m * std::ldexp(1.0, int(rng.below(54)))),
                                int(rng.below(2100)) - 1100);
    if (x != 0 && std::isfinite(x)) xs.push_back(x);
  }
  int bad = 0;
  for (double x : xs) {
    int e;
    const double frac = std::frexp(std::fabs(x), &e);
    const int trailing = e - 53 + __builtin_ctzll(uint64_t(std::ldexp(frac, 53)));
    bad += ref::trailing_exponent(x) != trailing || ref::top_exponent(x) != std::ilogb(x) + 1;
  }
  CHECK(bad == 0);
}
TEST_CASE("reference.slice_gemm.every_target_sums_exactly") {
  // Integer matrices whose every partial sum stays below 2^53: any summation order gives the exact
  // sums. Sizes leave remainders in rows (13), panel columns (45 of a 50-wide B) and inner blocks
  // (300), on every instruction set this CPU has, and slice_gemm must return the naive sums' bits.
  const uint64_t s = test::seed(24);
  CAPTURE(s);
  Rng rng(s);
  const int64_t m = 13, n = 300, kc = 45, ldb = 50;
  std::vector<double> a(size_t(m * n)), b(size_t(n * ldb));
  for (double& x : a) x = std::ldexp(double(int64_t(rng.below(1 << 21)) - (1 << 20)), -30);
  for (double& x : b) x = std::ldexp(double(int64_t(rng.below(1 << 23)) - (1 << 22)), 7);
  std::vector<double> want(size_t(m * kc), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < kc; ++j)
      for (int64_t p = 0; p < n; ++p)
        want[size_t(i * kc + j)] += a[size_t(i * n + p)] * b[size_t(p * ldb + j)];
  int targets = 0;
  gemm::for_each_simd_target([&](const std::string& target) {
    CAPTURE(target);
    ++targets;
    std::vector<double> got(size_t(m * kc), -1.0);
    ref::slice_gemm(a.data(), n, b.data(), ldb, got.data(), kc, m, n, kc);
    CHECK(got == want);
    CHECK(full_slices_inexact() == 0);  // and X.5 at the edge of its budget, on this target
  });
  CHECK(targets >= 1);
  MESSAGE("slice_gemm targets checked: " << targets
                                         << ", dispatched: " << ref::slice_gemm_target());
}
TEST_CASE("reference.exact_dot.sliced_bits_per_slice") {
  // X.5's budget: beta_a + beta_b + ceil(log2 n) = 53 for every inner dimension, so a GEMM's
  // partial sums stay below 2^53 units.
  const std::vector<int> a = {30, 20}, b = {10, 14};
  for (int64_t n : {1, 2, 3, 512, 513, 4096}) {
    CAPTURE(n);
    const ref::Slicing s = ref::plan_slicing(a, b, n);
    const int log_n = n == 1 ? 0 : 64 - __builtin_clzll(uint64_t(n - 1));
    CHECK(s.beta_a + s.beta_b + log_n == 53);
    CHECK(s.slices_a * s.beta_a >= 30);
    CHECK(s.slices_b * s.beta_b >= 14);
  }
}
TEST_CASE("reference.exact_dot.rejects_out_of_range") {
  std::vector<double> a = {0x1p-500, 1.0}, b = {1.0, 1.0};
  CHECK_THROWS_AS(ref::exact_matmul(a.data(), 2, 1, 2, b.data(), 1, 1), std::domain_error);
}

// S.5: a product of some columns of B, given the summary of all of B, gives every entry the
// terms (not only the exact value) the whole product gives it; without the summary the plan, and
// so the terms, may differ. B's columns span 2^-60..2^60, some narrow (bf16), some wide (fp64).
TEST_CASE("reference.exact_dot.column_blocks_with_whole_summary_equal_whole") {
  const uint64_t seed = test::seed(1301);
  CAPTURE(seed);
  Rng rng(seed);
  const int64_t m = 6, n = 40, k = 29;
  std::vector<double> a(size_t(m * n)), b(size_t(n * k));
  for (double& x : a) x = rng.normal() * std::ldexp(1.0, int(20 * rng.uniform()) - 10);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t l = 0; l < n; ++l) {
      const double x = rng.normal() * std::ldexp(1.0, int(j * 37 % 121) - 60);
      b[size_t(l * k + j)] = j % 3 == 0 ? round_to(DType::BF16, x) : x;
    }
  const ref::ExactProduct whole = ref::exact_matmul(a.data(), n, m, n, b.data(), k, k);
  ref::WholeB summary;
  summary.add(b.data(), n, k, k);
  int differ_with = 0, differ_without = 0;
  for (int64_t j0 = 0; j0 < k; j0 += 5) {
    const int64_t w = std::min<int64_t>(5, k - j0);
    const ref::ExactProduct with =
        ref::exact_matmul(a.data(), n, m, n, b.data() + j0, k, w, &summary);
    const ref::ExactProduct without = ref::exact_matmul(a.data(), n, m, n, b.data() + j0, k, w);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < w; ++j) {
        const auto t = whole.entry(i, j0 + j), u = with.entry(i, j), v = without.entry(i, j);
        differ_with += !std::equal(t.begin(), t.end(), u.begin(), u.end());
        differ_without += !std::equal(t.begin(), t.end(), v.begin(), v.end());
      }
  }
  CHECK(differ_with == 0);
  CHECK(differ_without > 0);  // the summary is what makes the blocks agree
  // A block whose entries are not part of the summarized B is refused.
  std::vector<double> wide = {0.1, 0.3};
  ref::WholeB narrow_only;
  narrow_only.add(b.data(), 1, k, 1);  // b[0]: a bf16 value
  CHECK_THROWS_AS(ref::exact_matmul(a.data(), n, 1, 1, wide.data(), 1, 1, &narrow_only),
                  std::logic_error);
}

// add_d and mul_d must round exactly as mpfr_add_d and mpfr_mul_d: destinations at P, at the check
// precision and at 64 bits, operands of other precisions, doubles over the whole exponent range
// (subnormals included) and zeros of both signs; the values' bits and zeros' signs compared.
TEST_CASE("reference.mp.add_d_and_mul_d_round_as_mpfr") {
  const uint64_t s = test::seed(1402);
  CAPTURE(s);
  Rng rng(s);
  auto draw = [&] {
    switch (rng.below(8)) {
      case 0:
        return 0.0;
      case 1:
        return -0.0;
      case 2:
        return std::ldexp(rng.normal(), -1074 + int(rng.below(60)));  // subnormal or tiny
      default:
        return std::ldexp(rng.normal(), int(rng.below(400)) - 200);
    }
  };
  int inexact = 0;
  for (mpfr_prec_t prec : {64, 114, 178}) {
    mpfr_t x, want, got, src;
    mpfr_inits2(prec, x, want, got, (mpfr_ptr) nullptr);
    mpfr_init2(src, prec == 114 ? 178 : 114);  // mul_d's source at another precision
    for (int i = 0; i < 3000; ++i) {
      CAPTURE(prec);
      CAPTURE(i);
      mpfr_set_d(x, draw(), MPFR_RNDN);
      mpfr_mul_d(x, x, 1.0 + std::ldexp(rng.normal(), -30), MPFR_RNDN);  // bits below a double's
      const double d = draw();
      inexact += mpfr_add_d(want, x, d, MPFR_RNDN) != 0;  // the ternary value: rounded
      mpfr_set(got, x, MPFR_RNDN);
      ref::add_d(got, d);
      CHECK((mpfr_equal_p(got, want) && mpfr_signbit(got) == mpfr_signbit(want)));
      mpfr_set(src, x, MPFR_RNDN);
      mpfr_mul_d(want, src, d, MPFR_RNDN);
      ref::mul_d(got, src, d);
      CHECK((mpfr_equal_p(got, want) && mpfr_signbit(got) == mpfr_signbit(want)));
    }
    mpfr_clears(x, want, got, src, (mpfr_ptr) nullptr);
  }
  CHECK(inexact > 100);  // many sums round: the cases can tell one rounding from another
}

// set_double must give mpfr_set_d's bits: precisions 53 (one limb, bits below the precision),
// 64, 114, 178 and 300, destinations holding zero, NaN or another value before, and doubles over
// the whole range (zeros of both signs, subnormals, the largest, inf, NaN); the sign compared too.
TEST_CASE("reference.mp.set_double_equals_mpfr_set_d") {
  const uint64_t s = test::seed(1403);
  CAPTURE(s);
  Rng rng(s);
  const double special[] = {0.0,
                            -0.0,
                            1.0,
                            -1.0,
                            0x1p-1022,
                            0x1p-1074,
                            -0x1.8p-1060,
                            0x1.fffffffffffffp1023,
                            -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN()};
  int checked = 0;
  for (mpfr_prec_t prec : {53, 64, 114, 178, 300}) {
    mpfr_t got, want;
    mpfr_inits2(prec, got, want, (mpfr_ptr) nullptr);
    for (int i = 0; i < 4000; ++i) {
      CAPTURE(prec);
      CAPTURE(i);
      const double d = i < 10 ? special[i] : std::ldexp(rng.normal(), int(rng.below(2100)) - 1050);
      if (i % 3 == 0) mpfr_set_nan(got);  // whatever the destination held before
      if (i % 3 == 1) mpfr_set_zero(got, -1);
      mpfr_set_d(want, d, MPFR_RNDN);
      ref::set_double(got, d);
      const bool same = (mpfr_nan_p(got) && mpfr_nan_p(want)) ||
                        (mpfr_equal_p(got, want) && mpfr_signbit(got) == mpfr_signbit(want));
      CHECK(same);
      checked += same;
    }
    mpfr_clears(got, want, (mpfr_ptr) nullptr);
  }
  CHECK(checked == 5 * 4000);
}

// col_spans reads B row by row; a column's span must equal row_spans of the transpose, with
// zeros, subnormals and an all-zero column among the values.
TEST_CASE("reference.sliced_product.col_spans_equal_transposed_row_spans") {
  const uint64_t seed = test::seed(70051);
  CAPTURE(seed);
  Rng rng(seed);
  const int64_t n = 37, k = 11;
  std::vector<double> B(size_t(n * k)), Bt(size_t(n * k));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const double u = rng.normal();
      double v = j == 3 ? 0.0 : std::ldexp(u, int(std::fabs(u) * 40) - 20);
      if ((i + j) % 7 == 0) v = 0;
      if (j == 5 && i == 2) v = 4.9e-324 * 6;  // a subnormal
      B[size_t(i * k + j)] = v, Bt[size_t(j * n + i)] = v;
    }
  const ref::Spans cols = ref::col_spans(B.data(), k, n, k),
                   rows = ref::row_spans(Bt.data(), n, k, n);
  CHECK(cols.per_line == rows.per_line);
  CHECK(cols.depths == rows.depths);
  CHECK(cols.per_line[3] == 0);
  CHECK(cols.per_line[5] > 1000);
  int64_t counted = 0;  // every nonzero value once, no deeper than its line's span
  for (int64_t x : cols.depths) counted += x;
  CHECK(counted == int64_t(std::count_if(B.begin(), B.end(), [](double v) { return v != 0; })));
  CHECK(int(cols.depths.size()) - 1 ==
        *std::max_element(cols.per_line.begin(), cols.per_line.end()));
}
