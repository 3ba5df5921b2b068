// The gate rule (conventions §6) and its budgets: data, each with a source, overridable from TOML.
#pragma once
#include <string>
#include <vector>

#include "core/impl_id.hpp"
#include "metrics/compare.hpp"

namespace qkmla {

struct Budget {
  std::string impl;      // implementation id pattern: exact, or a prefix ending in '*'
  std::string preset;    // preset name or "*"
  std::string scenario;  // scenario name or "*"
  std::string profile;   // profile name or "*"
  std::string tensor;    // tensor name or "*"
  std::string metric;    // max_abs | max_ulp | rel_l2 | cos_diff | baseline_ratio
  double max = 0;
  std::string
      source;  // a proof step in proofs/, conventions section, or a measured baseline + commit
};

struct GateRule {
  double baseline_k = 2.0;  // conventions §6 default; the budget table sets the measured one
  std::string baseline_k_source = "conventions §6";
  // An audit's structure projections (bias, row_bias) against the correct samples' largest.
  double projection_k = 4.0;
  std::string projection_k_source = "conventions §5";
  std::vector<Budget> budgets;
  // A declared design from the file's [design] table (core/design.hpp syntax, "" when none): an
  // audit given the file judges strictly against it, as with --design.
  std::string design;
};

// The built-in table: src/harness/budgets.toml, compiled in (proofs/budgets.md explains it).
GateRule default_rule();
const std::string& default_budget_text();
// Reads overrides: `baseline_k = K`, [[budget]] tables with impl/profile/tensor/metric/max/
// source, and a [design] table of rounding points (keys of core/design.hpp, string values).
// Replaces budgets with the same (impl, profile, tensor, metric) and adds new ones. Throws
// InputError naming the file and the key.
void apply_budget_file(GateRule& rule, const std::string& path);
// The same for TOML text already read; `name` is what messages call the file.
void apply_budget_text(GateRule& rule, const std::string& text, const std::string& name);

struct Verdict {
  bool pass = true;
  std::vector<std::string>
      failed;  // "nonfinite_mismatch=3", "baseline_ratio=2.7>2 (conventions §6)", ...
  std::string first_metric;  // the metric of the first failure ("" if passed)
};

// What a verdict is about (budgets match on these).
struct Subject {
  ImplId impl;
  std::string preset, scenario, profile, tensor;
};

// PASS iff nonfinite_mismatch == 0, every metric is a number, baseline_ratio <= k (when a
// baseline exists) and every matching budget holds. Matching baseline_ratio budgets replace the
// rule's k and must all hold. Each k is widened, for a tensor of few independent samples, to the
// ratio two correct implementations' rel_l2 can reach by chance: sqrt of the F(n, n) quantile at
// 1 - kSmallSampleAlpha (proofs/budgets.md). NaN never passes.
constexpr double kSmallSampleAlpha = 1e-5;
double small_sample_k(int64_t samples);
Verdict judge(const GateRule& rule, const Subject& s, const Metrics& m, double baseline_ratio,
              int64_t samples);

}  // namespace qkmla
