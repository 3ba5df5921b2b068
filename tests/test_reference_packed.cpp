// reference.mp.packed_*: PackedMpVec holds values exactly (significand, exponent, kind), whether
// appended or set in place, over MPFR's whole default exponent range.
#include <doctest/doctest.h>
#include <mpfr.h>

#include <limits>

#include "core/rng.hpp"
#include "exact_sum_helpers.hpp"
#include "helpers.hpp"
#include "reference/mp.hpp"
#include "reference/ref_common.hpp"

using namespace qkmla;

TEST_CASE("reference.mp.packed_values_round_trip") {
  const uint64_t seed = test::seed(77);
  CAPTURE(seed);
  Rng rng(seed);
  for (int bits : {53, 114, 178}) {
    CAPTURE(bits);
    const ref::PrecisionScope scope(bits);
    ref::MpVec v(40);
    for (ref::Mp& x : v) test::draw(rng, x.backend().data(), 3000);
    v[1] = 0;
    v[2] = -0.0;
    v[3] = std::numeric_limits<double>::infinity();
    v[4] = -std::numeric_limits<double>::infinity();
    v[5] = std::numeric_limits<double>::quiet_NaN();
    mpfr_set_ui_2exp(v[6].backend().data(), 3, mpfr_get_emax() - 2, MPFR_RNDN);  // largest exponent
    mpfr_set_si_2exp(v[7].backend().data(), -1, mpfr_get_emin() - 1, MPFR_RNDN);  // smallest
    ref::PackedMpVec appended, in_place;
    in_place.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      appended.push_back(v[i]);
      in_place.set(v.size() - 1 - i, v[i]);  // in reverse order
    }
    REQUIRE(appended.size() == v.size());
    ref::Mp a, b;
    for (size_t i = 0; i < v.size(); ++i) {
      CAPTURE(i);
      appended.get(i, a);
      in_place.get(v.size() - 1 - i, b);
      const mpfr_srcptr want = v[i].backend().data();
      for (mpfr_srcptr got : {a.backend().data(), b.backend().data()}) {
        const bool same = mpfr_nan_p(want)
                              ? mpfr_nan_p(got) != 0
                              : mpfr_equal_p(got, want) && mpfr_signbit(got) == mpfr_signbit(want);
        CHECK(same);
      }
    }
  }
}
