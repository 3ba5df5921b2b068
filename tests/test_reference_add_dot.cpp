// reference.exact_sum.add_dot_*, add_scaled_*: the loops' 2- and 3-limb path gives the bits of the
// term-by-term sum (add_product, itself checked against MPFR in test_reference_exact_sum.cpp).
#include <doctest/doctest.h>
#include <mpfr.h>

#include <cmath>

#include "core/rng.hpp"
#include "helpers.hpp"
#include "reference/exact_sum.hpp"
#include "reference/ref_common.hpp"

using namespace qkmla;

namespace {

// A random value with a full significand at x's precision, binade within 2^+-spread.
void draw(Rng& rng, mpfr_ptr x, int spread) {
  mpfr_set_d(x, rng.normal(), MPFR_RNDN);
  mpfr_t t;
  mpfr_init2(t, mpfr_get_prec(x));
  for (int i = 1; i < 4; ++i) {
    mpfr_set_d(t, rng.normal(), MPFR_RNDN);
    mpfr_mul_2si(t, t, -53 * i, MPFR_RNDN);
    mpfr_add(x, x, t, MPFR_RNDN);
  }
  mpfr_clear(t);
  mpfr_mul_2si(x, x, long(std::lround(spread * (2 * rng.uniform() - 1))), MPFR_RNDN);
}

// Both accumulators round to the same value at the current precision.
void check_same_sum(const ref::ExactSum& got, const ref::ExactSum& want) {
  ref::Mp x, y;
  got.round(x.backend().data());
  want.round(y.backend().data());
  CHECK(x == y);
}

}  // namespace

TEST_CASE("reference.exact_sum.add_dot_is_the_term_by_term_sum") {
  const uint64_t seed = test::seed(72);
  CAPTURE(seed);
  Rng rng(seed);
  for (int bits : {114, 178, 300}) {
    CAPTURE(bits);
    const ref::PrecisionScope scope(bits);
    for (int trial = 0; trial < 50; ++trial) {
      ref::MpVec a(size_t(1 + trial * 3)), b(a.size());
      for (size_t j = 0; j < a.size(); ++j) {
        draw(rng, a[j].backend().data(), 30);
        draw(rng, b[j].backend().data(), 30);
        if (j % 7 == 3) b[j] = 0;  // zeros take the general path
      }
      ref::ExactSum dot, terms;
      dot.add_dot(a, b);
      for (size_t j = 0; j < a.size(); ++j)
        terms.add_product(a[j].backend().data(), b[j].backend().data());
      check_same_sum(dot, terms);
    }
  }
}

TEST_CASE("reference.exact_sum.add_scaled_is_the_term_by_term_sum") {
  const uint64_t seed = test::seed(73);
  CAPTURE(seed);
  Rng rng(seed);
  for (int bits : {114, 178, 300}) {
    CAPTURE(bits);
    const ref::PrecisionScope scope(bits);
    ref::MpVec b(37);
    std::vector<ref::ExactSum> scaled(b.size()), terms(b.size());
    for (int step = 0; step < 20; ++step) {  // sums[j] += a * b_j, twenty a's
      ref::Mp a;
      draw(rng, a.backend().data(), 30);
      if (step == 7) a = 0;
      for (size_t j = 0; j < b.size(); ++j) draw(rng, b[j].backend().data(), 30);
      ref::ExactSum::add_scaled(scaled, a, b);
      for (size_t j = 0; j < b.size(); ++j)
        terms[j].add_product(a.backend().data(), b[j].backend().data());
    }
    for (size_t j = 0; j < b.size(); ++j) check_same_sum(scaled[j], terms[j]);
  }
}
