#include "harness/golden.hpp"

#include <nlohmann/json.hpp>

#include "harness/judge.hpp"
#include "harness/registry.hpp"
#include "impl/kernel_level.hpp"

namespace qkmla {

Golden make_golden(const Case& module_case, Level level, int ref_bits, const std::string& made_by) {
  Golden g;
  g.k = level == Level::Kernel ? impl::kernel_case(module_case) : module_case;
  TruthOptions o;
  o.bits = ref_bits, o.latent_out = true,
  o.absorbed = level == Level::Module;  // ref.absorbed gives q_latent
  const std::vector<ImplId> base = registered_ids(g.k.cfg, kBaseline);
  Outputs b;  // the same-profile baseline, on a thread the reference's phases leave idle
  g.truth = compute_truth(g.k, o, {[&] { b = run_impls(g.k, base).at(0); }});
  for (const char* name : {"out", "lse", "alpha_q", "alpha_k", "latent_out", "q_latent"})
    if (const Outputs* t = g.truth.of(name))
      g.refs[std::string("ref.") + name] = t->tensors.at(name);
  g.baseline_impl = to_string(b.id);
  nlohmann::ordered_json j;
  j["impl"] = to_string(b.id);
  for (const auto& [name, t] : b.tensors) {
    const Outputs* ref = g.truth.of(name);
    if (!ref) continue;
    const Metrics m = compare(t, ref->tensors.at(name), t.dtype, valid_mask(g.k, name), nullptr,
                              &ref->lo.at(name));
    j["rel_l2"][name] = m.rel_l2;
    j["max_abs"][name] = m.max_abs;
  }
  g.metadata["qkmla.baseline"] = j.dump();
  g.metadata["qkmla.reference"] = nlohmann::json{
      {"bits", g.truth.bits},
      {"check_bits", g.truth.check_bits},
      {"agreeing_bits",
       g.truth.agreeing_bits}}.dump();
  g.metadata["qkmla.made_by"] = made_by;
  return g;
}

}  // namespace qkmla
