// Seeded scenario generator (conventions §8): values drawn in double, rounded once (RNE) to the
// profile's stored dtype. Cache rows past each sequence's length are NaN.
#pragma once
#include <string>
#include <vector>

#include "core/case.hpp"

namespace qkmla {

const std::vector<std::string>& scenario_names();
// cfg.scenario and cfg.seed select the distribution; cfg.profile the stored dtype.
Case generate_case(const MlaConfig& cfg);
// Rows of padding past max(seqlens) in the cache, and past T_max in the rope tables.
constexpr int kCachePadding = 2;

}  // namespace qkmla
