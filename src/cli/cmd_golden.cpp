// qkmla golden: a case file with the inputs rounded to a profile, the config, the fp64 reference
// outputs and the same-profile baseline's error (so an audit applies SPEC §6 without recomputing).
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "core/generator.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/kernel_level.hpp"
#include "io/case_io.hpp"
#include "metrics/compare.hpp"
#include "mp.hpp"
#include "reference.hpp"

namespace qkmla::cli {

namespace {

struct GoldenFlags {
  CaseFlags c;
  std::string level = "module", output;
  int ref_bits = 113;
};

// The reference as fp64 tensors (the nearest double of each multiprecision value).
std::map<std::string, Tensor> as_refs(const Outputs& o) {
  std::map<std::string, Tensor> m;
  for (const auto& [name, t] : o.tensors) m["ref." + name] = t;
  return m;
}

std::string baseline_json(const Outputs& base, const Outputs& truth, const Case& k) {
  nlohmann::ordered_json j;
  j["impl"] = base.impl;
  for (const auto& [name, t] : base.tensors) {
    if (!truth.tensors.count(name)) continue;
    const Metrics m = compare(t, truth.tensors.at(name), t.dtype, valid_mask(k, name), nullptr, &truth.lo.at(name));
    j["rel_l2"][name] = m.rel_l2;
    j["max_abs"][name] = m.max_abs;
  }
  return j.dump();
}

}  // namespace

Runner add_golden(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<GoldenFlags>();
  auto* cmd = app.add_subcommand("golden", "write a golden case: inputs in one profile, the config, fp64 reference outputs, baseline error");
  add_case_flags(*cmd, f->c, 64);
  cmd->add_option("--level", f->level, "module|kernel")->check(CLI::IsMember({"module", "kernel"}))->capture_default_str();
  cmd->add_option("--ref-bits", f->ref_bits, "reference precision P (checked at 2P)")->check(CLI::Range(64, 4096))->capture_default_str();
  cmd->add_option("--output,-o", f->output, "the .safetensors file to write")->required();
  return [f, command_line] {
    MlaConfig cfg = build_config(f->c, 64);
    const std::vector<Profile> ps = build_profiles(f->c, {Profile::BF16});
    if (ps.size() != 1) throw ConfigError("profile", "golden writes one profile (got " + std::to_string(ps.size()) + ")");
    cfg.profile = ps[0];
    const Case module = generate_case(cfg);
    const bool kernel = f->level == "kernel";
    const Case k = kernel ? impl::kernel_case(module) : module;
    const ref::Dots dots = kernel ? ref::Dots{} : ref::exact_dots(k);
    Outputs truth, check, extra;
    int bits = 0, check_bits = 0;
    {
      ref::PrecisionScope scope(f->ref_bits);
      bits = ref::PrecisionScope::current_bits();
      truth = kernel ? ref::ref_kernel(k) : ref::ref_explicit(k, dots, true);
      if (!kernel) extra = ref::ref_absorbed(k, dots);  // q_latent, from the absorbed form
    }
    {
      ref::PrecisionScope scope(2 * f->ref_bits);
      check_bits = ref::PrecisionScope::current_bits();
      check = kernel ? ref::ref_kernel(k) : ref::ref_explicit(k, dots, false);
    }
    std::vector<std::string> names;
    for (const auto& [name, t] : check.tensors) names.push_back(name);
    const double agree = agreeing_bits(k, truth, check, names);
    const double required = format_of(stored_dtype(cfg.profile)).precision + 20;
    if (agree < required) {
      std::cerr << fmt::format("qkmla golden: refused: reference agrees on {:.1f} bits < {:.0f}; raise --ref-bits\n", agree, required);
      return 1;
    }
    std::map<std::string, Tensor> refs = as_refs(truth);
    if (!kernel) refs["ref.q_latent"] = extra.tensors.at("q_latent");
    const Outputs base = kernel ? impl::cpu_kernel(k) : impl::cpu_explicit(k);
    const std::map<std::string, std::string> meta = {
        {"qkmla.baseline", baseline_json(base, truth, k)},
        {"qkmla.reference", nlohmann::json{{"bits", bits}, {"check_bits", check_bits}, {"agreeing_bits", agree}}.dump()},
        {"qkmla.made_by", command_line}};
    write_case(f->output, k, refs, meta);
    std::cout << fmt::format("wrote {} ({} level, profile {}, reference {} bits agreeing on {:.1f}; baseline {})\n", f->output,
                             f->level, to_string(cfg.profile), bits, agree, base.impl);
    return 0;
  };
}

}  // namespace qkmla::cli
