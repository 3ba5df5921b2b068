// One case, judged: the reference (with its two-precision check), the same-profile baseline, and
// the implementations asked for by id pattern. Shared by gate, mutants, golden and audit.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "gate/budgets.hpp"

namespace qkmla {

struct Evaluated {
  Case k;
  Outputs truth;              // ref.explicit at P (with latent_out)
  double agreeing_bits = 0;   // vs the 2P run
  double required_bits = 0;   // stored precision + 20
  std::vector<Outputs> impls; // cpu.explicit first, then the requested ones
  std::map<std::string, double> baseline;  // tensor -> rel_l2 of cpu.explicit
};

// Implementation ids without the profile: "cpu.explicit", "cpu.absorbed", "cpu.absorbed.<variant>",
// "mutant.<name>". A pattern is an id or a prefix ending in '*'.
std::vector<std::string> impl_ids(Profile p);
bool id_matches(const std::string& pattern, const std::string& id);
std::string with_profile(const std::string& id, Profile p);  // "cpu.absorbed" -> "cpu.absorbed.bf16"

// Runs the implementations of k matching `patterns` (and cpu.explicit, the baseline).
std::vector<Outputs> run_impls(const Case& k, const std::vector<std::string>& patterns);

// Metrics of one output against the truth (latent_out against ref.absorbed when asked), with the
// baseline ratio of SPEC §5.
struct Judged {
  std::string tensor;
  Metrics m;
  double baseline_ratio = 0;
  Verdict v;
};
// `bound`: the implementation's forward error bounds (cpu.* only), or null.
std::vector<Judged> judge_outputs(const GateRule& rule, const Evaluated& e, const Outputs& o,
                                  const std::vector<std::string>& tensors, const Outputs* bound = nullptr);
// Forward error bounds of every cpu.* implementation in `impls`, by implementation id.
std::map<std::string, Outputs> bounds_for(const Case& k, const std::vector<Outputs>& impls);

// Reference at P bits and its 2P check for many cases, in two precision phases (Boost keeps one
// global default precision), `threads` cases at a time.
void evaluate_references(std::vector<Evaluated>& cases, int bits, int threads);

}  // namespace qkmla
