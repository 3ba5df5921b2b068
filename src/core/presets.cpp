#include "core/presets.hpp"

namespace qkmla {

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      {"tiny", 4, 2, 32, 16, 8, 16, "fast tests"},
      {"paper-decode", 16, 16, 512, 128, 64, 128,
       "paper's H800 decode benchmark (DeepSeek-V3 width, one of 8 TP ranks)"},
      {"paper-g8", 16, 8, 512, 128, 64, 128, "the paper's 1.56 % cache example (G = 8)"},
      {"deepseek-v3", 128, 128, 512, 128, 64, 128, ""},
      {"deepseek-v2-lite", 16, 16, 512, 128, 64, 128, ""},
      {"kimi-k2", 64, 64, 512, 128, 64, 128, ""},
      {"nope-h10", 10, 10, 256, 128, 0, 128,
       "NoPE latent attention (d_r = 0): one RMSNorm over the whole head"},
      {"paper-g1", 16, 1, 512, 128, 64, 128, "one key group for all heads (G = 1)"},
      {"tiny-nope", 4, 2, 32, 16, 0, 16, "fast tests, NoPE (d_r = 0)"},
      {"tiny-g1", 4, 1, 32, 16, 8, 16, "fast tests, G = 1"},
  };
  return all;
}

const Preset& find_preset(const std::string& name) {
  std::string names;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw ConfigError("preset", "unknown preset '" + name + "' (known: " + names + ")");
}

MlaConfig config_for(const Preset& p, int seqlen) {
  MlaConfig c;
  c.heads = p.heads;
  c.groups = p.groups;
  c.latent_rank = p.latent_rank;
  c.d_c = p.d_c;
  c.d_r = p.d_r;
  c.d_v = p.d_v;
  c.seqlens = {seqlen};
  c.preset = p.name;
  c.softmax_scale = 0.0;
  c.set_default_scale();
  return c;
}

}  // namespace qkmla
