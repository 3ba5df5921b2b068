// Differences between two multiprecision results captured with all their exact remainders
// (set_deep_capture), evaluated exactly enough for any precision up to a few thousand bits.
#pragma once
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"

namespace qkmla::ref {

// Worst normwise relative difference over rows (out: per d_v-vector; lse: relative to
// max(|lse|, 1)), like agreeing_bits, but from the full expansions.
double deep_rel_diff(const Case& k, const Outputs& a, const Outputs& truth,
                     const std::vector<std::string>& tensors);

}  // namespace qkmla::ref
