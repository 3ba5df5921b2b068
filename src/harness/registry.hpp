// The one list of implementations. Every command asks it which ids exist for a config and runs
// them through it: report (Use::Report), the gate matrix (Use::Gate), golden baselines
// (Use::Baseline), converge (Use::Converge). A family runs several of its ids in one call when they
// share work (the absorbed variants share one cache).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/impl_id.hpp"
#include "core/outputs.hpp"
#include "impl/mutants.hpp"
#include "reference/reference.hpp"

namespace qkmla {

enum Use : unsigned {
  kReport = 1,    // rows of qkmla report
  kGate = 2,      // judged by qkmla gate (patterns of its matrix)
  kBaseline = 4,  // the same-profile baseline a golden case records
  kConverge = 8,  // series of qkmla converge (multiprecision, at the enclosing PrecisionScope)
};

// What a run may need beyond the case: the exact products (multiprecision families only).
struct RunContext {
  const ref::Dots* dots = nullptr;
};

struct ImplFamily {
  std::string name;
  unsigned uses = 0;
  // The ids this family provides for a config (profile, norm and shape decide which apply).
  std::function<std::vector<ImplId>(const MlaConfig&)> ids;
  // Outputs of the given ids (all from this family's ids(k.cfg)), in that order, named.
  std::function<std::vector<Outputs>(const Case&, const std::vector<ImplId>&, const RunContext&)>
      run;
  // Forward error bounds of the given ids (proofs/error_bounds.md), or empty when none are proven.
  std::function<std::vector<Outputs>(const Case&, const std::vector<ImplId>&)> bounds;
  // The ids it has but cannot run on this config, each with the reason (may be empty).
  std::function<std::vector<std::pair<ImplId, std::string>>(const MlaConfig&)> unavailable;
};

const std::vector<ImplFamily>& registry();

// The family that registers `id` for this config (ConfigError when none does).
const ImplFamily& family_of(const ImplId& id, const MlaConfig& c);
// Ids of every family with any of the `uses` bits, for this config, in registry order.
std::vector<ImplId> registered_ids(const MlaConfig& c, unsigned uses);
// Runs the wanted ids (each must be a registered id of k.cfg), grouped by family; outputs in the
// order of `wanted`.
std::vector<Outputs> run_impls(const Case& k, const std::vector<ImplId>& wanted,
                               const RunContext& ctx = {});
// Forward error bounds of those of `wanted` that have them, by printed id.
std::map<std::string, Outputs> run_bounds(const Case& k, const std::vector<ImplId>& wanted);

// Ids the families with any of the `uses` bits have but cannot run on this config, with the
// reason (not-applicable mutants, GPU limits): for the kill matrix and notes.
std::vector<std::pair<ImplId, std::string>> unavailable_ids(const MlaConfig& c, unsigned uses);

// The mutant behind a mutant id (ConfigError for an unknown name).
const impl::Mutant& mutant_of(const ImplId& id);

}  // namespace qkmla
