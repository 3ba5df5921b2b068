#include "harness/truth.hpp"

#include "core/parallel.hpp"
#include "metrics/compare.hpp"
#include "reference/mp.hpp"

namespace qkmla {

const Outputs* Truth::of(const std::string& tensor) const {
  if (explicit_p.tensors.count(tensor)) return &explicit_p;
  if (absorbed_p.tensors.count(tensor)) return &absorbed_p;
  return nullptr;
}

namespace {

Outputs reference_run(const Case& k, const ref::Dots& d, bool latent_out) {
  return k.cfg.level == Level::Kernel ? ref::ref_kernel(k) : ref::ref_explicit(k, d, latent_out);
}

// The tensors both runs carry (and that carry meaning): what the agreement is measured on.
std::vector<std::string> agreement_tensors(const Outputs& check) {
  std::vector<std::string> names;
  for (const char* n : {"out", "lse", "alpha_q", "alpha_k", "latent_out"})
    if (check.tensors.count(n)) names.push_back(n);
  return names;
}

}  // namespace

std::vector<Truth> compute_truths(const std::vector<const Case*>& cases, const TruthOptions& o,
                                  const std::vector<std::function<void()>>& extra) {
  std::vector<Truth> truths(cases.size());
  std::vector<std::function<void()>> tasks;
  for (size_t i = 0; i < cases.size(); ++i)
    if (cases[i]->cfg.level == Level::Module)
      tasks.push_back([&, i] {
        truths[i].dots = o.dots && cases.size() == 1 ? *o.dots : ref::exact_dots(*cases[i]);
      });
  tasks.insert(tasks.end(), extra.begin(), extra.end());
  run_parallel(tasks, o.threads);
  {
    ref::PrecisionScope scope(o.bits);
    tasks.clear();
    for (size_t i = 0; i < cases.size(); ++i) {
      truths[i].bits = ref::PrecisionScope::current_bits();
      const bool module = cases[i]->cfg.level == Level::Module;
      tasks.push_back([&, i, module] {
        truths[i].explicit_p = reference_run(*cases[i], truths[i].dots, o.latent_out);
      });
      if (o.absorbed && module)
        tasks.push_back(
            [&, i] { truths[i].absorbed_p = ref::ref_absorbed(*cases[i], truths[i].dots); });
    }
    run_parallel(tasks, o.threads);
  }
  {
    ref::PrecisionScope scope(o.check_bits ? o.check_bits : o.bits + 64);
    tasks.clear();
    for (size_t i = 0; i < cases.size(); ++i) {
      truths[i].check_bits = ref::PrecisionScope::current_bits();
      tasks.push_back(
          [&, i] { truths[i].check = reference_run(*cases[i], truths[i].dots, false); });
    }
    run_parallel(tasks, o.threads);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    Truth& t = truths[i];
    t.agreeing_bits = agreeing_bits(*cases[i], t.explicit_p, t.check, agreement_tensors(t.check));
    t.required_bits = format_of(stored_dtype(cases[i]->cfg.profile)).precision + 20;
  }
  return truths;
}

Truth compute_truth(const Case& k, const TruthOptions& o) {
  std::vector<Truth> t = compute_truths({&k}, o);
  return std::move(t[0]);
}

}  // namespace qkmla
