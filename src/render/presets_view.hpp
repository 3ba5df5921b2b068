// `qkmla presets`: the model presets and their dims, as a table or JSON.
#pragma once
#include <string>

namespace qkmla {

std::string presets_table();
std::string presets_json();  // an array of {name, heads, groups, latent_rank, d_c, d_r, d_v}

}  // namespace qkmla
