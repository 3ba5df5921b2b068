// Helpers of the X.6 / X.7 accumulator tests: an owned mpfr_t, random P-bit values, and the
// comparison of an accumulator's one rounding with an exact MPFR sum rounded at P.
#pragma once
#include <doctest/doctest.h>
#include <mpfr.h>

#include <cmath>

#include "core/rng.hpp"
#include "reference/exact_sum.hpp"

namespace qkmla::test {

struct Mpfr {  // an owned mpfr_t
  mpfr_t v;
  explicit Mpfr(mpfr_prec_t bits) { mpfr_init2(v, bits); }
  ~Mpfr() { mpfr_clear(v); }
  Mpfr(const Mpfr&) = delete;
  Mpfr& operator=(const Mpfr&) = delete;
};

constexpr mpfr_prec_t kExactBits = 6000;  // terms within 2^+-1200 with <= 360-bit significands

// A random P-bit value: a full significand, sign and binade within 2^+-spread.
inline void draw(Rng& rng, mpfr_ptr x, int spread) {
  mpfr_set_d(x, rng.normal(), MPFR_RNDN);
  for (int i = 0; i < 4; ++i) {  // fill the significand beyond the first double
    Mpfr t(mpfr_get_prec(x));
    mpfr_set_d(t.v, rng.normal(), MPFR_RNDN);
    mpfr_mul_2si(t.v, t.v, -53 * (i + 1), MPFR_RNDN);
    mpfr_add(x, x, t.v, MPFR_RNDN);
  }
  mpfr_mul_2si(x, x, long(std::lround(spread * (2 * rng.uniform() - 1))), MPFR_RNDN);
}

// The accumulator's sum and the exact sum rounded at P agree bit for bit.
inline void check_same(const ref::ExactSum& acc, mpfr_srcptr exact, mpfr_prec_t P) {
  Mpfr got(P), want(P);
  acc.round(got.v);
  mpfr_set(want.v, exact, MPFR_RNDN);
  const bool same = mpfr_equal_p(got.v, want.v) || (mpfr_nan_p(got.v) && mpfr_nan_p(want.v));
  if (!same)
    MESSAGE("got " << mpfr_get_d(got.v, MPFR_RNDN) << ", want " << mpfr_get_d(want.v, MPFR_RNDN));
  CHECK(same);
}

}  // namespace qkmla::test
