// qkmla converge: the registry's multiprecision forms (Use kConverge) evaluated at a ladder of
// working precisions against ref.explicit at 4x the largest; equivalent forms gain one bit of
// agreement per bit of precision (slope -1), a mutant plateaus.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"

namespace qkmla {

struct ConvergeSeries {
  std::string impl, scenario;  // each mutant runs in the scenario that exposes it
  bool mutant = false;
  std::vector<std::pair<int, double>> points;  // (bits, worst normwise relative difference)
  double slope = 0, tail_slope = 0;  // least-squares log2(difference) per bit: all, last 4
};

struct ConvergeResult {
  MlaConfig base;
  std::vector<int> bits;  // ascending
  int reference_bits = 0;
  std::vector<ConvergeSeries> series;
};

ConvergeResult run_converge(const MlaConfig& base, std::vector<int> bits);

}  // namespace qkmla
