// The mutants kill matrix as a table (one row per mutant, one column per profile) or JSON cells.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qkmla {

struct KillCell {
  enum class Status { Killed, Survived, NotApplicable };
  std::string mutant, profile;
  Status status = Status::NotApplicable;
  std::string by, scenario;  // killed: the first failing metric and the scenario it failed on
  std::string detail;        // survived: the gate's message; not applicable: the reason
};

int survived(const std::vector<KillCell>& cells);
// Rows in the order of `cells` (mutant-major), one column per profile, each cell cut to 40
// columns.
std::string kill_matrix_table(const std::vector<KillCell>& cells,
                              const std::vector<std::string>& profiles);
nlohmann::ordered_json kill_matrix_json(const std::vector<KillCell>& cells);

}  // namespace qkmla
