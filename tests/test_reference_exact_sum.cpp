// reference.exact_sum.*: the X.6 accumulator against MPFR at 6000 bits, where every sum of these
// terms is exact, rounded once to the precision under test: the same bits, or the test fails.
#include <doctest/doctest.h>
#include <mpfr.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.hpp"
#include "exact_sum_helpers.hpp"
#include "helpers.hpp"
#include "reference/exact_sum.hpp"

using namespace qkmla;
using test::check_same;
using test::draw;
using test::kExactBits;
using test::Mpfr;

namespace {

void random_sums(mpfr_prec_t P, int spread, uint64_t seed) {
  CAPTURE(seed);
  CAPTURE(P);
  Rng rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    CAPTURE(trial);
    ref::ExactSum acc;
    acc.clear();
    Mpfr exact(kExactBits), prod(kExactBits), a(P), b(P), other(P == 114 ? 178 : 114);
    mpfr_set_zero(exact.v, 1);
    const int n = 1 + int(rng.uniform() * 300);
    for (int i = 0; i < n; ++i) {
      draw(rng, a.v, spread);
      const double kind = rng.uniform();
      if (kind < 0.4) {  // P-bit times P-bit
        draw(rng, b.v, spread);
        acc.add_product(a.v, b.v);
        mpfr_mul(prod.v, a.v, b.v, MPFR_RNDN);
      } else if (kind < 0.45) {  // P-bit times a value of another precision
        draw(rng, other.v, spread);
        acc.add_product(a.v, other.v);
        mpfr_mul(prod.v, a.v, other.v, MPFR_RNDN);
      } else if (kind < 0.7) {  // P-bit times a double
        const double d = std::ldexp(rng.normal(), int(spread * (2 * rng.uniform() - 1)));
        acc.add_product(a.v, d);
        mpfr_mul_d(prod.v, a.v, d, MPFR_RNDN);
      } else if (kind < 0.85) {
        acc.add(a.v);
        mpfr_set(prod.v, a.v, MPFR_RNDN);
      } else {
        const double d = std::ldexp(rng.normal(), int(spread * (2 * rng.uniform() - 1)));
        acc.add(d);
        mpfr_set_d(prod.v, d, MPFR_RNDN);
      }
      mpfr_add(exact.v, exact.v, prod.v, MPFR_RNDN);  // exact at 6000 bits
      if (i == n / 2 && kind < 0.4) {                 // cancel a product exactly
        mpfr_neg(a.v, a.v, MPFR_RNDN);
        acc.add_product(a.v, b.v);
        mpfr_sub(exact.v, exact.v, prod.v, MPFR_RNDN);
      }
    }
    check_same(acc, exact.v, P);
  }
}

}  // namespace

TEST_CASE("reference.exact_sum.random_sums_round_once") {
  for (mpfr_prec_t P : {53, 114, 178, 300}) {
    random_sums(P, 4, test::seed(61));
    random_sums(P, 300, test::seed(62));
  }
}

TEST_CASE("reference.exact_sum.cancellation_leaves_the_small_terms") {
  for (mpfr_prec_t P : {114, 178}) {
    Mpfr big(P), exact(kExactBits);
    mpfr_set_d(big.v, 1.0, MPFR_RNDN);
    mpfr_nextabove(big.v);  // 1 + 2^(1-P): its low bit matters
    ref::ExactSum acc;
    acc.add(big.v);
    acc.add(std::ldexp(3.0, -900));
    mpfr_neg(big.v, big.v, MPFR_RNDN);
    acc.add(big.v);  // the large terms cancel: only 3 * 2^-900 is left
    mpfr_set_d(exact.v, std::ldexp(3.0, -900), MPFR_RNDN);
    check_same(acc, exact.v, P);
    ref::ExactSum zero;  // an exact zero, and the empty sum
    zero.add(1.5);
    zero.add(-1.5);
    Mpfr got(P);
    zero.round(got.v);
    CHECK(mpfr_zero_p(got.v));
    ref::ExactSum empty;
    empty.round(got.v);
    CHECK(mpfr_zero_p(got.v));
  }
}

TEST_CASE("reference.exact_sum.ties_round_to_even") {
  const mpfr_prec_t P = 114;  // ulp(1) = 2^-113
  Mpfr exact(kExactBits);
  for (int odd : {1, 3, -1, -3}) {  // 1 + odd * 2^-114: halfway between two P-bit values
    CAPTURE(odd);
    ref::ExactSum acc;
    acc.add(1.0);
    acc.add(std::ldexp(double(odd), -114));
    mpfr_set_d(exact.v, 1.0, MPFR_RNDN);
    Mpfr t(kExactBits);
    mpfr_set_d(t.v, std::ldexp(double(odd), -114), MPFR_RNDN);
    mpfr_add(exact.v, exact.v, t.v, MPFR_RNDN);
    check_same(acc, exact.v, P);
  }
}

TEST_CASE("reference.exact_sum.non_finite_terms") {
  const double inf = std::numeric_limits<double>::infinity();
  Mpfr got(114);
  ref::ExactSum a;
  a.add(1.0);
  a.add(inf);
  a.round(got.v);
  CHECK(mpfr_inf_p(got.v));
  a.add(-inf);
  a.round(got.v);
  CHECK(mpfr_nan_p(got.v));
  ref::ExactSum b;
  Mpfr zero(114);
  mpfr_set_zero(zero.v, 1);
  b.add_product(zero.v, inf);  // 0 * inf
  b.round(got.v);
  CHECK(mpfr_nan_p(got.v));
}

TEST_CASE("reference.exact_sum.squares_of_one_operand") {
  const uint64_t seed = test::seed(63);
  CAPTURE(seed);
  Rng rng(seed);
  for (mpfr_prec_t P : {114, 178}) {
    for (int trial = 0; trial < 40; ++trial) {
      ref::ExactSum acc;
      Mpfr exact(kExactBits), sq(kExactBits), z(P);
      mpfr_set_zero(exact.v, 1);
      for (int j = 0; j < 128; ++j) {
        draw(rng, z.v, 20);
        acc.add_product(z.v, z.v);  // both operands one value: mpn_mul on aliased sources
        mpfr_sqr(sq.v, z.v, MPFR_RNDN);
        mpfr_add(exact.v, exact.v, sq.v, MPFR_RNDN);
      }
      check_same(acc, exact.v, P);
    }
  }
}

TEST_CASE("reference.exact_sum.window_drops_terms_32000_bits_down") {
  // Plain MLA with outliers gives p_t near exp(-1e8): the window keeps 2^15 bits below the
  // largest term and drops what lies further down (8 KB per accumulator, not megabytes).
  const mpfr_prec_t P = 114;
  Mpfr one(P), tiny(P), got(P);
  mpfr_set_ui(one.v, 1, MPFR_RNDN);
  mpfr_set_ui_2exp(tiny.v, 3, -100000, MPFR_RNDN);
  ref::ExactSum near;  // 2^-30000 is kept: the sum is exact
  near.add(one.v);
  mpfr_set_ui_2exp(got.v, 3, -30000, MPFR_RNDN);
  near.add(got.v);
  mpfr_neg(one.v, one.v, MPFR_RNDN);
  near.add(one.v);
  near.round(got.v);
  CHECK_FALSE(near.dropped());
  CHECK(mpfr_cmp_ui_2exp(got.v, 3, -30000) == 0);
  ref::ExactSum far;  // a tiny term first, then a large one: the tiny one's digits go
  far.add(tiny.v);
  CHECK_FALSE(far.dropped());
  far.add(one.v);
  CHECK(far.dropped());
  far.round(got.v);
  CHECK(mpfr_cmp_si(got.v, -1) == 0);
  ref::ExactSum after;  // a large term first: the tiny one is dropped on arrival
  after.add(one.v);
  after.add(tiny.v);
  CHECK(after.dropped());
  after.clear();
  CHECK_FALSE(after.dropped());
}

TEST_CASE("reference.exact_sum.window_moves_wholly_above_the_old_one") {
  Mpfr small(114), big(114), got(114);
  mpfr_set_ui_2exp(small.v, 5, -50000, MPFR_RNDN);
  mpfr_set_ui_2exp(big.v, 7, 50000, MPFR_RNDN);
  ref::ExactSum acc;
  acc.add(small.v);
  acc.add(small.v);
  acc.add(big.v);  // every earlier digit lies below the new floor
  acc.round(got.v);
  CHECK(acc.dropped());
  CHECK(mpfr_cmp_ui_2exp(got.v, 7, 50000) == 0);
}
