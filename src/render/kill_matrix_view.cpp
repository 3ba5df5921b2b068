#include "render/kill_matrix_view.hpp"

#include <fmt/format.h>

namespace qkmla {

int survived(const std::vector<KillCell>& cells) {
  int n = 0;
  for (const KillCell& c : cells) n += c.status == KillCell::Status::Survived;
  return n;
}

std::string kill_matrix_table(const std::vector<KillCell>& cells,
                              const std::vector<std::string>& profiles) {
  std::string table = fmt::format("{:<26}", "mutant");
  for (const std::string& p : profiles) table += fmt::format(" {:<40}", p);
  std::string last;
  for (const KillCell& c : cells) {
    if (c.mutant != last) table += fmt::format("\n{:<26}", last = c.mutant);
    const std::string shown = c.status == KillCell::Status::Killed
                                  ? fmt::format("killed ({}, {})", c.by, c.scenario)
                              : c.status == KillCell::Status::Survived ? std::string("SURVIVED")
                                                                       : "n/a: " + c.detail;
    table += fmt::format(" {:<40}", shown.substr(0, 40));
  }
  return table + "\n" + fmt::format("{} cells survived\n", survived(cells));
}

nlohmann::ordered_json kill_matrix_json(const std::vector<KillCell>& cells) {
  nlohmann::ordered_json out = nlohmann::json::array();
  for (const KillCell& c : cells) {
    nlohmann::ordered_json cell = {{"mutant", c.mutant}, {"profile", c.profile}};
    if (c.status == KillCell::Status::Killed) {
      cell["status"] = "killed", cell["by"] = c.by, cell["scenario"] = c.scenario;
    } else if (c.status == KillCell::Status::Survived) {
      cell["status"] = "survived", cell["detail"] = c.detail;
    } else {
      cell["status"] = "not_applicable", cell["reason"] = c.detail;
    }
    out.push_back(cell);
  }
  return out;
}

}  // namespace qkmla
