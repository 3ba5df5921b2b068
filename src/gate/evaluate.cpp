#include "gate/evaluate.hpp"

#include <cmath>
#include <functional>

#include "core/parallel.hpp"
#include "impl/cpu_impls.hpp"
#include "mp.hpp"
#include "reference.hpp"
#include "report/report_gpu.hpp"

namespace qkmla {

std::vector<std::string> impl_ids(Profile p) {
  std::vector<std::string> ids = {"cpu.explicit"};
  for (impl::Variant v : impl::variants_for(p)) ids.push_back("cpu.absorbed" + impl::variant_suffix(v));
  for (impl::Mutant m : impl::all_mutants()) ids.push_back("mutant." + impl::mutant_name(m));
  return ids;
}

bool id_matches(const std::string& pattern, const std::string& id) {
  if (pattern == "*" || pattern == id) return true;
  return !pattern.empty() && pattern.back() == '*' && id.rfind(pattern.substr(0, pattern.size() - 1), 0) == 0;
}

std::string with_profile(const std::string& id, Profile p) {
  if (id.rfind("cpu.absorbed", 0) == 0) return "cpu.absorbed." + to_string(p) + id.substr(12);
  return id + "." + to_string(p);
}

std::vector<Outputs> run_impls(const Case& k, const std::vector<std::string>& patterns) {
  auto wanted = [&](const std::string& id) {
    for (const std::string& p : patterns)
      if (id_matches(p, id)) return true;
    return false;
  };
  std::vector<Outputs> out = {impl::cpu_explicit(k)};
  bool any_absorbed = false;
  for (impl::Variant v : impl::variants_for(k.cfg.profile)) any_absorbed |= wanted("cpu.absorbed" + impl::variant_suffix(v));
  if (any_absorbed)
    for (Outputs& o : impl::cpu_absorbed_all(k)) {
      const std::string id = "cpu.absorbed" + o.impl.substr(12 + to_string(k.cfg.profile).size() + 1);
      if (wanted(id)) out.push_back(std::move(o));
    }
  for (impl::Mutant m : impl::all_mutants())
    if (wanted("mutant." + impl::mutant_name(m)) && impl::mutant_not_applicable(m, k.cfg).empty())
      out.push_back(impl::cpu_mutant(k, m));
  // The GPU kernels' CPU model (ids gpu.model[.explicit].<profile>; no fp64 profile).
  if (wanted("gpu.model") || wanted("gpu.model.explicit")) {
    const std::string suffix = "." + to_string(k.cfg.profile);
    for (Outputs& o : gpu_model_outputs(k))
      if (wanted(o.impl.substr(0, o.impl.size() - suffix.size()))) out.push_back(std::move(o));
  }
  return out;
}

std::map<std::string, Outputs> bounds_for(const Case& k, const std::vector<Outputs>& impls) {
  bool explicit_wanted = false, absorbed_wanted = false;
  for (const Outputs& o : impls) {
    explicit_wanted |= o.impl.rfind("cpu.explicit.", 0) == 0;
    absorbed_wanted |= o.impl.rfind("cpu.absorbed.", 0) == 0;
  }
  std::map<std::string, Outputs> out;
  if (explicit_wanted) {
    Outputs b = impl::cpu_explicit_bounds(k);
    out[b.impl.substr(6)] = std::move(b);
  }
  if (absorbed_wanted)
    for (Outputs& b : impl::cpu_absorbed_bounds(k)) out[b.impl.substr(6)] = std::move(b);
  return out;
}

std::vector<Judged> judge_outputs(const GateRule& rule, const Evaluated& e, const Outputs& o,
                                  const std::vector<std::string>& tensors, const Outputs* bound) {
  const Profile p = e.k.cfg.profile;
  const double floor = unit_roundoff(stored_dtype(p)) / 16;
  std::vector<Judged> out;
  for (const std::string& t : tensors) {
    if (!o.tensors.count(t) || !e.truth.tensors.count(t)) continue;
    Judged j;
    j.tensor = t;
    const Tensor& x = o.tensors.at(t);
    j.m = compare(x, e.truth.tensors.at(t), x.dtype, valid_mask(e.k, t), nullptr, &e.truth.lo.at(t));
    j.baseline_ratio = e.baseline.count(t) ? j.m.rel_l2 / std::max(e.baseline.at(t), floor) : std::nan("");
    if (bound && bound->tensors.count(t))
      j.m.bound_ratio = bound_ratio(x, e.truth.tensors.at(t), bound->tensors.at(t), valid_mask(e.k, t));
    j.v = judge(rule, {o.impl, e.k.cfg.preset, e.k.cfg.scenario, to_string(p), t}, j.m, j.baseline_ratio);
    out.push_back(std::move(j));
  }
  return out;
}

void evaluate_references(std::vector<Evaluated>& cases, int bits, int threads) {
  std::vector<ref::Dots> dots(cases.size());
  std::vector<std::function<void()>> tasks;
  for (size_t i = 0; i < cases.size(); ++i) tasks.push_back([&, i] { dots[i] = ref::exact_dots(cases[i].k); });
  run_parallel(tasks, threads);
  {
    ref::PrecisionScope scope(bits);
    tasks.clear();
    for (size_t i = 0; i < cases.size(); ++i)
      tasks.push_back([&, i] { cases[i].truth = ref::ref_explicit(cases[i].k, dots[i], true); });
    run_parallel(tasks, threads);
  }
  std::vector<Outputs> check(cases.size());
  {
    ref::PrecisionScope scope(2 * bits);
    tasks.clear();
    for (size_t i = 0; i < cases.size(); ++i)
      tasks.push_back([&, i] { check[i] = ref::ref_explicit(cases[i].k, dots[i], false); });
    run_parallel(tasks, threads);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    Evaluated& e = cases[i];
    e.agreeing_bits = agreeing_bits(e.k, e.truth, check[i], {"out", "lse", "alpha_q", "alpha_k"});
    e.required_bits = format_of(stored_dtype(e.k.cfg.profile)).precision + 20;
  }
}

}  // namespace qkmla
