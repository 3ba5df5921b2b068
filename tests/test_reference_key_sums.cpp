// reference.explicit.key_sums_*: S.6, the check run takes the P run's precision-free exact sums
// (each key's sum of squares; plain MLA's content sums) rounded at its own precision, and gives
// the bits of a check run that formed them itself: whole (the truth's waves) and streamed (the
// pair), every norm, data whose keys have one-term (bf16) and multi-term (fp64) expansions.
#include <doctest/doctest.h>

#include <stdexcept>

#include "helpers.hpp"
#include "outputs_helpers.hpp"
#include "reference/mp.hpp"
#include "reference/reference.hpp"

using namespace qkmla;
using test::check_identical;

TEST_CASE("reference.explicit.key_sums_give_the_check_its_own_bits") {
  const uint64_t s = test::seed(1213);
  CAPTURE(s);
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified, NormMode::None})
    for (Profile profile : {Profile::BF16, Profile::FP64}) {
      CAPTURE(int(norm));
      CAPTURE(int(profile));
      const Case k = generate_case(test::tiny_config(profile, {300, 0, 129}, 3, norm, s));
      const ref::Dots whole = ref::exact_dots(k);
      Outputs p, check, p_gave, check_took;
      const ref::KeptKeySums sums = ref::new_key_sums(177);
      {
        const ref::PrecisionScope scope(113);
        p = ref::ref_explicit(k, whole, true);
        p_gave = ref::ref_explicit(k, whole, true, 2, {nullptr, sums.get(), nullptr});
      }
      {
        const ref::PrecisionScope scope(177);
        check = ref::ref_explicit(k, whole, false, 2);
        check_took = ref::ref_explicit(k, whole, false, 1, {nullptr, nullptr, sums.get()});
      }
      check_identical(p, p_gave);
      check_identical(check, check_took);
      const auto [pp, pc] = ref::ref_explicit_pair(k, ref::Dots(k, {64, 4}), true, 113, 177, 2);
      check_identical(p, pp);
      check_identical(check, pc);
    }
}

TEST_CASE("reference.explicit.key_sums_refuse_another_precision") {
  const Case k = generate_case(test::tiny_config(Profile::BF16, {40}, 1));
  const ref::Dots whole = ref::exact_dots(k);
  const ref::KeptKeySums sums = ref::new_key_sums(177);
  {
    const ref::PrecisionScope scope(113);
    ref::ref_explicit(k, whole, false, 1, {nullptr, sums.get(), nullptr});
  }
  const ref::PrecisionScope scope(241);  // not the precision the sums were rounded at
  CHECK_THROWS_AS(ref::ref_explicit(k, whole, false, 1, {nullptr, nullptr, sums.get()}),
                  std::logic_error);
}
