// reference.exact_sum.expansion_*: X.7, values times the exact products' expansions (squares,
// dots, scaled sums); reference.exact_sum.value_*: X.8, an exact sum taken out whole and multiplied
// by doubles. Against MPFR at 6000 bits, where these sums are exact, rounded once at P.
#include <doctest/doctest.h>
#include <mpfr.h>

#include <cmath>
#include <deque>
#include <limits>
#include <span>
#include <vector>

#include "core/rng.hpp"
#include "exact_sum_helpers.hpp"
#include "helpers.hpp"
#include "reference/exact_sum.hpp"
#include "reference/ref_common.hpp"

using namespace qkmla;
using test::check_same;
using test::draw;
using test::kExactBits;
using test::Mpfr;

namespace {

// An expansion of 1-4 doubles as exact products give (largest first, each below the last one's
// lowest bit), or arbitrary doubles (overlapping, any order), zeros and a subnormal mixed in.
std::vector<double> expansion(Rng& rng, int trial) {
  const int n = 1 + trial % 4;
  std::vector<double> t;
  double next = std::ldexp(rng.normal(), int(std::lround(60 * (2 * rng.uniform() - 1))));
  for (int i = 0; i < n; ++i) {
    t.push_back(next);
    int e = 0;
    std::frexp(next, &e);
    next =
        trial % 3 == 0 ? rng.normal() : std::ldexp(rng.normal(), e - 54 - int(rng.uniform() * 20));
  }
  if (trial % 5 == 1) t.push_back(0.0);  // trailing zeros, as inline terms carry
  if (trial % 7 == 2) t[0] = 0.0;
  if (trial % 11 == 3) t.back() = std::numeric_limits<double>::denorm_min() * 3;
  return t;
}

// exact += x * (sum of the terms), in 6000-bit MPFR.
void add_exact(mpfr_ptr exact, mpfr_srcptr x, std::span<const double> terms) {
  Mpfr e(kExactBits), p(kExactBits);
  mpfr_set_zero(e.v, 1);
  for (double d : terms) mpfr_add_d(e.v, e.v, d, MPFR_RNDN);
  mpfr_mul(p.v, x, e.v, MPFR_RNDN);
  mpfr_add(exact, exact, p.v, MPFR_RNDN);
}

}  // namespace

TEST_CASE("reference.exact_sum.expansion_squares") {
  const uint64_t seed = test::seed(75);
  CAPTURE(seed);
  Rng rng(seed);
  for (mpfr_prec_t P : {53, 114, 178}) {
    CAPTURE(P);
    for (int trial = 0; trial < 40; ++trial) {
      ref::ExactSum acc;
      Mpfr exact(kExactBits), e(kExactBits), sq(kExactBits);
      mpfr_set_zero(exact.v, 1);
      for (int j = 0; j < 1 + trial; ++j) {
        const std::vector<double> t = expansion(rng, trial + j);
        acc.add_square(t);
        mpfr_set_zero(e.v, 1);
        for (double d : t) mpfr_add_d(e.v, e.v, d, MPFR_RNDN);
        mpfr_sqr(sq.v, e.v, MPFR_RNDN);
        mpfr_add(exact.v, exact.v, sq.v, MPFR_RNDN);
      }
      check_same(acc, exact.v, P);
    }
  }
}

TEST_CASE("reference.exact_sum.expansion_dots_and_scaled_sums") {
  const uint64_t seed = test::seed(76);
  CAPTURE(seed);
  Rng rng(seed);
  // 2, 2, 3, 3, 4 limbs inline (P, P + 8-bit gains, the check, its gains, P + 53-bit gains at the
  // check) and 5 by the general path
  for (mpfr_prec_t P : {114, 122, 178, 186, 231, 300}) {
    CAPTURE(P);
    const ref::PrecisionScope scope(int(P));
    for (int trial = 0; trial < 30; ++trial) {
      const size_t n = 1 + size_t(trial) * 3;
      ref::MpVec a(n);
      std::vector<std::vector<double>> terms(n);
      std::vector<std::span<const double>> b(n);
      for (size_t j = 0; j < n; ++j) {
        draw(rng, a[j].backend().data(), 40);
        if (j % 9 == 4) a[j] = 0;  // a zero factor
        terms[j] = expansion(rng, trial + int(j));
        b[j] = terms[j];
      }
      ref::ExactSum dot;
      dot.add_dot(a, b);
      Mpfr exact(kExactBits);
      mpfr_set_zero(exact.v, 1);
      for (size_t j = 0; j < n; ++j) add_exact(exact.v, a[j].backend().data(), b[j]);
      check_same(dot, exact.v, P);

      std::vector<ref::ExactSum> sums(n);  // sums[j] += a_0 * b_j, then a_1 * b_j
      std::deque<Mpfr> want;
      for (size_t j = 0; j < n; ++j) mpfr_set_zero(want.emplace_back(kExactBits).v, 1);
      for (size_t step = 0; step < 2 && step < n; ++step) {
        ref::ExactSum::add_scaled(sums, a[step], b);
        for (size_t j = 0; j < n; ++j) add_exact(want[j].v, a[step].backend().data(), b[j]);
      }
      for (size_t j = 0; j < n; ++j) check_same(sums[j], want[j].v, P);
    }
  }
}

// X.8: value() is the exact sum itself, at the fewest bits that hold it: sums of P-bit values and
// doubles over +-300 binades, exact cancellations (to zero, and down to a term far below the
// rest), a single term, non-finite terms.
TEST_CASE("reference.exact_sum.value_is_the_exact_sum") {
  const uint64_t seed = test::seed(78);
  CAPTURE(seed);
  Rng rng(seed);
  for (mpfr_prec_t P : {53, 114, 178, 300}) {
    CAPTURE(P);
    for (int trial = 0; trial < 60; ++trial) {
      CAPTURE(trial);
      ref::ExactSum acc;
      Mpfr exact(kExactBits), x(P);
      mpfr_set_zero(exact.v, 1);
      const int n = trial % 10 == 0 ? 1 : 2 + trial;
      for (int j = 0; j < n; ++j) {
        draw(rng, x.v, 300);
        acc.add(x.v);
        mpfr_add(exact.v, exact.v, x.v, MPFR_RNDN);
        const double d = std::ldexp(rng.normal(), int(std::lround(200 * (2 * rng.uniform() - 1))));
        acc.add(d);
        mpfr_add_d(exact.v, exact.v, d, MPFR_RNDN);
      }
      if (trial % 4 == 1) {  // cancel everything but a term far below it, or everything
        Mpfr r(kExactBits);
        acc.value(r.v);
        mpfr_neg(r.v, r.v, MPFR_RNDN);
        acc.add(r.v);
        mpfr_add(exact.v, exact.v, r.v, MPFR_RNDN);
        if (trial % 8 == 1) {
          acc.add(std::ldexp(3.0, -700));
          mpfr_add_d(exact.v, exact.v, std::ldexp(3.0, -700), MPFR_RNDN);
        }
      }
      Mpfr got(2);
      acc.value(got.v);
      CHECK(mpfr_cmp(got.v, exact.v) == 0);
      if (!mpfr_zero_p(exact.v)) CHECK(mpfr_get_prec(got.v) == mpfr_min_prec(exact.v));
    }
  }
  ref::ExactSum inf;
  inf.add(1.0);
  inf.add(std::numeric_limits<double>::infinity());
  Mpfr got(200);
  inf.value(got.v);
  CHECK((mpfr_inf_p(got.v) && mpfr_sgn(got.v) > 0));
}

// X.8: sums[j] += a * w_j for an exact sum's value a (1 to 9 limbs: the inline 2-4-limb paths and
// the general one) and doubles w_j (zeros, subnormals, signs mixed), rounded once at P.
TEST_CASE("reference.exact_sum.value_scaled_by_doubles") {
  const uint64_t seed = test::seed(79);
  CAPTURE(seed);
  Rng rng(seed);
  for (int trial = 0; trial < 80; ++trial) {
    CAPTURE(trial);
    ref::ExactSum src;
    Mpfr x(64 * (1 + trial % 6));
    for (int j = 0; j < 1 + trial % 5; ++j) {
      draw(rng, x.v, 10 * (trial % 9));
      src.add(x.v);
    }
    Mpfr a(2);
    src.value(a.v);
    const size_t n = 1 + size_t(trial) % 17;
    std::vector<double> w(n);
    for (size_t j = 0; j < n; ++j)
      w[j] = j % 7 == 3 ? 0.0
             : j % 11 == 5
                 ? std::numeric_limits<double>::denorm_min() * 5
                 : std::ldexp(rng.normal(), int(std::lround(300 * (2 * rng.uniform() - 1))));
    std::vector<ref::ExactSum> sums(n);
    std::deque<Mpfr> want;
    for (size_t j = 0; j < n; ++j) {
      sums[j].add(w[j] * 0.5);  // something there already
      mpfr_set_d(want.emplace_back(kExactBits).v, w[j] * 0.5, MPFR_RNDN);
    }
    ref::ExactSum::add_scaled(sums, a.v, w);
    for (size_t j = 0; j < n; ++j) {
      add_exact(want[j].v, a.v, std::span<const double>(&w[j], 1));
      for (mpfr_prec_t P : {114, 178}) check_same(sums[j], want[j].v, P);
    }
  }
}
