// The mutants kill matrix (conventions §7): which structured bug the gate kills in which profile,
// and by what. `qkmla gate --kill-matrix` runs the default matrix's mutant entries and prints it
// (render/kill_matrix_view.hpp).
#pragma once
#include <string>
#include <vector>

#include "gate/gate_config.hpp"
#include "gate/run_gate.hpp"
#include "render/kill_matrix_view.hpp"

namespace qkmla {

// The entries of `c` that judge at least one mutant, each run in `profiles`. ConfigError when
// none does.
GateConfig mutant_entries(GateConfig c, const std::vector<std::string>& profiles);

// One cell per (mutant, profile), mutants in conventions §7's order.
std::vector<KillCell> kill_matrix(const GateResults& r, const std::vector<std::string>& profiles);

}  // namespace qkmla
