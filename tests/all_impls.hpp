// The outputs every closed-form and feature test compares: both reference forms and the CPU
// implementations. Apart from helpers.hpp: it needs the multiprecision reference (MPFR), which
// the GPU test binary does not link.
#pragma once
#include "helpers.hpp"
#include "reference/mp.hpp"
#include "reference/reference.hpp"

namespace qkmla::test {

// Both reference forms at 113 bits (ref.explicit, then ref.absorbed) and every cpu.*
// implementation.
inline std::vector<Outputs> all_impls(const Case& k) {
  std::vector<Outputs> v;
  const ref::Dots d = ref::exact_dots(k);
  ref::PrecisionScope scope(113);
  v.push_back(ref::ref_explicit(k, d, true));
  v.push_back(ref::ref_absorbed(k, d));
  for (Outputs& o : run_impls(k, cpu_ids(k.cfg))) v.push_back(std::move(o));
  return v;
}

}  // namespace qkmla::test
