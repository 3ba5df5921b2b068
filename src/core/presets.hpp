// The named model shapes of conventions §8.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"

namespace qkmla {

struct Preset {
  std::string name;
  int heads, groups, latent_rank, d_c, d_r, d_v;
  std::string notes;
};

const std::vector<Preset>& presets();
const Preset& find_preset(const std::string& name);  // throws ConfigError("preset", ...)
// A config with the preset's dims, batch 1, S_q 1, one sequence of `seqlen` tokens, bf16.
MlaConfig config_for(const Preset& p, int seqlen);

}  // namespace qkmla
