#include "render/presets_view.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/presets.hpp"

namespace qkmla {

std::string presets_table() {
  std::string s = fmt::format("{:<18} {:>4} {:>4} {:>5} {:>5} {:>5} {:>5}  {}\n", "preset", "H",
                              "G", "r", "d_c", "d_r", "d_v", "notes");
  for (const Preset& p : presets())
    s += fmt::format("{:<18} {:>4} {:>4} {:>5} {:>5} {:>5} {:>5}  {}\n", p.name, p.heads, p.groups,
                     p.latent_rank, p.d_c, p.d_r, p.d_v, p.notes);
  return s;
}

std::string presets_json() {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const Preset& p : presets())
    a.push_back({{"name", p.name},
                 {"heads", p.heads},
                 {"groups", p.groups},
                 {"latent_rank", p.latent_rank},
                 {"d_c", p.d_c},
                 {"d_r", p.d_r},
                 {"d_v", p.d_v}});
  return a.dump() + "\n";
}

}  // namespace qkmla
