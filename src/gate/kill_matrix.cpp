#include "gate/kill_matrix.hpp"

#include "core/impl_id.hpp"
#include "harness/registry.hpp"

namespace qkmla {

GateConfig mutant_entries(GateConfig c, const std::vector<std::string>& profiles) {
  std::vector<GateEntry> kept;
  for (GateEntry e : c.entries) {
    bool has_mutants = false;
    for (const std::string& p : e.impls)
      for (const impl::Mutant& m : impl::mutants()) {
        ImplId id;
        id.family = Family::Mutant, id.name = m.name;
        has_mutants |= id_matches(p, id);
      }
    if (!has_mutants) continue;
    e.profiles = profiles;
    kept.push_back(e);
  }
  if (kept.empty()) throw ConfigError("config", "no [[entry]] with mutant.* implementations");
  c.entries = kept;
  return c;
}

std::vector<KillCell> kill_matrix(const GateResults& r, const std::vector<std::string>& profiles) {
  const std::vector<GateCase> tc = r.testcases();
  std::vector<KillCell> out;
  for (const impl::Mutant& m : impl::mutants())
    for (const std::string& p : profiles) {
      KillCell cell{m.name, p, KillCell::Status::NotApplicable, "", "", ""};
      const GateCase* found = nullptr;
      for (const GateCase& g : tc)
        if (g.mutant == m.name && g.profile == p) found = &g;
      if (found && found->ok) {
        cell.status = KillCell::Status::Killed;
        cell.by = found->metric, cell.scenario = found->scenario;
      } else if (found) {
        cell.status = KillCell::Status::Survived;
        cell.detail = found->message;
      } else {
        cell.detail = "no case of the matrix exposes it";
        for (const NotApplicable& n : r.not_applicable)
          if (n.mutant == m.name && n.profile == p) cell.detail = n.reason;
      }
      out.push_back(cell);
    }
  return out;
}

}  // namespace qkmla
