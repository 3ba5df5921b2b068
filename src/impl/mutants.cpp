#include "impl/mutants.hpp"

#include <cmath>

namespace qkmla::impl {

namespace {
// A mutant: the correct path with one field of its Perturbation changed by `set`.
Mutant mutant(const char* name, const char* bug, void (*set)(Perturbation&),
              const char* exposed_by = "", bool converge = false) {
  Mutant m{name, bug, {}, exposed_by, converge};
  set(m.p);
  return m;
}
}  // namespace

const std::vector<Mutant>& mutants() {
  static const std::vector<Mutant> all = {
      mutant(
          "no_gamma_k", "gamma_ck not absorbed into q_latent",
          [](Perturbation& p) { p.gamma_k_power = 0; }, "", true),
      mutant("gamma_k_twice", "gamma_ck applied twice",
             [](Perturbation& p) { p.gamma_k_power = 2; }),
      mutant(
          "eps_outside_sqrt", "1 / (sqrt(mean z^2) + eps)",
          [](Perturbation& p) { p.eps = EpsPlacement::OutsideSqrt; }, "tiny_keys", true),
      mutant(
          "no_eps", "eps dropped", [](Perturbation& p) { p.eps = EpsPlacement::Dropped; },
          "tiny_keys"),
      mutant("alpha_k_from_latent", "RMS taken over c[t] instead of the key",
             [](Perturbation& p) { p.key_stat_from_latent = true; }),
      mutant("alpha_k_lowp", "key RMS accumulated in bf16",
             [](Perturbation& p) { p.key_stat_lowp = true; }),
      mutant("joint_norm_in_blockwise", "unified statistic used in a blockwise config",
             [](Perturbation& p) { p.joint_stat_in_blockwise = true; }),
      mutant("alpha_k_off_by_one", "token t scaled by alpha_k[t-1]",
             [](Perturbation& p) { p.alpha_k_shift = -1; }),
      mutant("group_map_mod", "g(h) = h % G instead of h / (H/G)",
             [](Perturbation& p) { p.group_mod = true; }),
      mutant("scale_dc_only", "sigma = 1/sqrt(d_c)",
             [](Perturbation& p) { p.scale_dc_only = true; }),
      mutant("no_alpha_q", "alpha_q dropped", [](Perturbation& p) { p.drop_alpha_q = true; }),
      mutant("score_lowp_accum", "q_latent . c accumulated in bf16",
             [](Perturbation& p) { p.score_lowp = true; }),
      mutant("causal_off_by_one", "query i also sees position pos(i)+1",
             [](Perturbation& p) { p.causal_extra = 1; }),
      mutant("rope_order_swapped", "rope_then_norm where the config says norm_then_rope",
             [](Perturbation& p) { p.swap_rope_order = true; }),
      mutant("lse_base2", "lse reported in base 2", [](Perturbation& p) { p.lse_base2 = true; }),
      mutant("topk_off_by_one", "top-k: each listed slot read as slot + 1",
             [](Perturbation& p) { p.topk_shift = 1; }),
      mutant("sink_in_lse", "attention sink also folded into the returned lse",
             [](Perturbation& p) { p.sink = SinkForm::AlsoLse; }),
      mutant("sink_ignored", "attention sink not applied",
             [](Perturbation& p) { p.sink = SinkForm::Ignored; }),
  };
  return all;
}

const Mutant& find_mutant(const std::string& name) {
  std::string known;
  for (const Mutant& m : mutants()) {
    if (m.name == name) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  throw ConfigError("mutant", "unknown mutant '" + name + "' (known: " + known + ")");
}

std::string mutant_not_applicable(const Mutant& m, const MlaConfig& c) {
  const Perturbation& p = m.p;
  if (c.norm == NormMode::None) {
    if (p.gamma_k_power != 1) return "norm none: no gains";
    if (p.eps != EpsPlacement::Inside || p.key_stat_from_latent || p.key_stat_lowp ||
        p.alpha_k_shift != 0 || p.drop_alpha_q || p.joint_stat_in_blockwise)
      return "norm none: no RMS statistics (alpha_q = alpha_k = 1)";
    if (p.swap_rope_order) return "norm none: no norm to order against the rotation";
  }
  if (p.joint_stat_in_blockwise && c.norm != NormMode::Blockwise)
    return "the config is already unified";
  if (p.joint_stat_in_blockwise && c.d_r == 0)
    return "no rope part: the joint statistic is the blockwise one";
  if (p.group_mod && (c.heads == c.groups || c.groups == 1))
    return "H == G or G == 1: h % G == h / (H/G)";
  if (p.scale_dc_only && c.softmax_scale == 1.0 / std::sqrt(double(c.d_c)))
    return c.d_r == 0 ? "no rope part: the scale is already 1/sqrt(d_c)"
                      : "softmax_scale already equals 1/sqrt(d_c)";
  if (p.causal_extra != 0 && (!c.causal || c.s_q < 2)) return "needs a causal case with S_q >= 2";
  if (p.causal_extra != 0 && c.topk > 0) return "top-k: the index set replaces the causal window";
  if (p.topk_shift != 0 && c.topk == 0) return "needs a top-k case (--topk)";
  if (p.sink != SinkForm::OutOnly && !c.attn_sink) return "needs attention sinks (--attn-sink)";
  if (p.alpha_k_shift != 0) {
    bool any = false;
    for (int t : c.seqlens) any |= t >= 2;
    if (!any) return "needs a sequence of at least 2 tokens";
  }
  if (p.swap_rope_order && c.d_r == 0) return "no rope part";
  return "";
}

}  // namespace qkmla::impl
