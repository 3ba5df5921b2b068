#include "cli/case_flags.hpp"

#include "core/generator.hpp"
#include "core/presets.hpp"

namespace qkmla::cli {

void add_case_flags(CLI::App& app, CaseFlags& f, int default_seqlen) {
  app.add_option("--preset", f.preset, "model shape (qkmla presets lists them)")
      ->capture_default_str();
  app.add_option("--batch", f.batch, "sequences in the batch (each of --seqlen tokens)")
      ->check(CLI::PositiveNumber);
  auto* one =
      app.add_option("--seqlen", f.seqlen,
                     "cached tokens per sequence (default " + std::to_string(default_seqlen) + ")")
          ->check(CLI::NonNegativeNumber);
  app.add_option("--seqlens", f.seqlens,
                 "cached tokens of each sequence, comma separated (varlen batch)")
      ->delimiter(',')
      ->excludes(one);
  app.add_option("--sq", f.sq, "query tokens per sequence (1 = decode)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--norm", f.norm, "blockwise|unified")
      ->check(CLI::IsMember({"blockwise", "unified"}))
      ->capture_default_str();
  app.add_option("--rope-order", f.rope_order, "norm_then_rope|rope_then_norm")
      ->check(CLI::IsMember({"norm_then_rope", "rope_then_norm"}))
      ->capture_default_str();
  app.add_option("--rope-style", f.rope_style, "interleaved|half")
      ->check(CLI::IsMember({"interleaved", "half"}))
      ->capture_default_str();
  app.add_option("--eps", f.eps, "RMSNorm epsilon (default 1e-6)");
  app.add_option("--softmax-scale", f.softmax_scale, "softmax scale (default 1/sqrt(d_c + d_r))");
  app.add_flag("--causal,!--no-causal", f.causal, "causal mask over the query tokens (default on)");
  app.add_option("--scenario", f.scenario, "input distribution")
      ->check(CLI::IsMember(scenario_names()))
      ->capture_default_str();
  app.add_option("--seed", f.seed, "generator seed")->capture_default_str();
  app.add_option("--profile,--profiles", f.profiles,
                 "precision profiles, comma separated (fp64,fp32,bf16,fp16,fp8)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp64", "fp32", "bf16", "fp16", "fp8"}));
}

MlaConfig build_config(const CaseFlags& f, int default_seqlen) {
  MlaConfig c = config_for(find_preset(f.preset), f.seqlen.value_or(default_seqlen));
  if (!f.seqlens.empty()) {
    if (f.batch && *f.batch != int(f.seqlens.size()))
      throw ConfigError("batch", "--batch " + std::to_string(*f.batch) + " disagrees with the " +
                                     std::to_string(f.seqlens.size()) + " entries of --seqlens");
    c.seqlens = f.seqlens;
  } else {
    c.seqlens.assign(size_t(f.batch.value_or(1)), f.seqlen.value_or(default_seqlen));
  }
  c.batch = int(c.seqlens.size());
  c.s_q = f.sq;
  c.norm = parse_norm(f.norm);
  c.rope_order = parse_rope_order(f.rope_order);
  c.rope_style = parse_rope_style(f.rope_style);
  if (f.eps) c.eps = *f.eps;
  c.softmax_scale = f.softmax_scale.value_or(0.0);
  c.set_default_scale();
  c.causal = f.causal;
  c.scenario = f.scenario;
  c.seed = f.seed;
  c.validate();
  return c;
}

std::vector<Profile> build_profiles(const CaseFlags& f, const std::vector<Profile>& defaults) {
  if (f.profiles.empty()) return defaults;
  std::vector<Profile> out;
  for (const std::string& p : f.profiles) out.push_back(parse_profile(p));
  return out;
}

}  // namespace qkmla::cli
