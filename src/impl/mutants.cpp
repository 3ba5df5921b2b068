#include "impl/mutants.hpp"

#include <cmath>

namespace qkmla::impl {

namespace {
const std::vector<std::pair<Mutant, const char*>>& table() {
  static const std::vector<std::pair<Mutant, const char*>> t = {
      {Mutant::NoGammaK, "no_gamma_k"},
      {Mutant::GammaKTwice, "gamma_k_twice"},
      {Mutant::EpsOutsideSqrt, "eps_outside_sqrt"},
      {Mutant::NoEps, "no_eps"},
      {Mutant::AlphaKFromLatent, "alpha_k_from_latent"},
      {Mutant::AlphaKLowp, "alpha_k_lowp"},
      {Mutant::JointNormInBlockwise, "joint_norm_in_blockwise"},
      {Mutant::AlphaKOffByOne, "alpha_k_off_by_one"},
      {Mutant::GroupMapMod, "group_map_mod"},
      {Mutant::ScaleDcOnly, "scale_dc_only"},
      {Mutant::NoAlphaQ, "no_alpha_q"},
      {Mutant::ScoreLowpAccum, "score_lowp_accum"},
      {Mutant::CausalOffByOne, "causal_off_by_one"},
      {Mutant::RopeOrderSwapped, "rope_order_swapped"},
      {Mutant::LseBase2, "lse_base2"},
  };
  return t;
}
}  // namespace

const std::vector<Mutant>& all_mutants() {
  static const std::vector<Mutant> all = [] {
    std::vector<Mutant> v;
    for (const auto& [m, name] : table()) v.push_back(m);
    return v;
  }();
  return all;
}

std::string mutant_name(Mutant m) {
  for (const auto& [x, name] : table())
    if (x == m) return name;
  return "none";
}

Mutant parse_mutant(const std::string& name) {
  std::string known;
  for (const auto& [m, n] : table()) {
    if (name == n) return m;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  throw ConfigError("mutant", "unknown mutant '" + name + "' (known: " + known + ")");
}

std::string mutant_not_applicable(Mutant m, const MlaConfig& c) {
  switch (m) {
    case Mutant::JointNormInBlockwise:
      if (c.norm != NormMode::Blockwise) return "the config is already unified";
      break;
    case Mutant::GroupMapMod:
      if (c.heads == c.groups) return "H == G: h % G == h / (H/G)";
      break;
    case Mutant::ScaleDcOnly:
      if (c.d_r == 0 || c.softmax_scale == 1.0 / std::sqrt(double(c.d_c)))
        return "softmax_scale already equals 1/sqrt(d_c)";
      break;
    case Mutant::CausalOffByOne:
      if (!c.causal || c.s_q < 2) return "needs a causal case with S_q >= 2";
      break;
    case Mutant::AlphaKOffByOne: {
      bool any = false;
      for (int t : c.seqlens) any |= t >= 2;
      if (!any) return "needs a sequence of at least 2 tokens";
      break;
    }
    case Mutant::RopeOrderSwapped:
      if (c.d_r == 0) return "no rope part";
      break;
    default:
      break;
  }
  return "";
}

}  // namespace qkmla::impl
