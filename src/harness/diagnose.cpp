#include "harness/diagnose.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "core/parallel.hpp"
#include "core/perturbation.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/kernel_level.hpp"
#include "impl/mutants.hpp"
#include "metrics/compare.hpp"

namespace qkmla {

namespace {

struct Convention {
  std::string name, what;
  bool kernel_level = false;  // also meaningful for a kernel-level case (the latent core alone)
  std::function<bool(Case&)>
      edit;  // changes the case; false when it cannot apply (or changes nothing)
  Perturbation p;
};

Convention config_edit(std::string name, std::string what, bool kernel,
                       std::function<bool(MlaConfig&)> f) {
  return {std::move(name), std::move(what), kernel, [f](Case& k) { return f(k.cfg); }, {}};
}

Convention perturbed(std::string name, std::string what, bool kernel, void (*set)(Perturbation&),
                     bool (*applies)(const MlaConfig&) = nullptr) {
  Perturbation p;
  set(p);
  return {std::move(name), std::move(what), kernel,
          [applies](Case& k) { return !applies || applies(k.cfg); }, p};
}

bool has_norm(const MlaConfig& c) { return c.norm != NormMode::None; }
bool has_rope(const MlaConfig& c) { return c.d_r > 0; }
bool rope_and_norm(const MlaConfig& c) { return has_rope(c) && has_norm(c); }

bool scale_fp8(Case& k, double power) {
  if (!k.has("kv_c_scale")) return false;
  for (double& s : k.tensors.at("kv_c_scale").data) s = std::isnan(s) ? s : std::pow(s, power);
  attach_latent(k);
  return true;
}

std::vector<Convention> make_conventions() {
  std::vector<Convention> v = {
      perturbed("lse_base=2", "lse reported in base 2 (exp2-based kernels)", true,
                [](Perturbation& p) { p.lse_form = LseForm::Base2; }),
      perturbed("lse=unscaled", "lse of the scores before the softmax scale", true,
                [](Perturbation& p) { p.lse_form = LseForm::Unscaled; }),
      perturbed("lse=max_unscaled", "lse with the running max taken before the softmax scale", true,
                [](Perturbation& p) { p.lse_form = LseForm::MaxUnscaled; }),
      config_edit("softmax_scale=1/sqrt(d_c)", "softmax scale 1/sqrt(d_c) (the rope dims left out)",
                  true,
                  [](MlaConfig& c) {
                    const double s = 1.0 / std::sqrt(double(c.d_c));
                    return std::exchange(c.softmax_scale, s) != s;
                  }),
      config_edit("softmax_scale=1/sqrt(d_c+d_r)",
                  "softmax scale 1/sqrt(d_c + d_r) (the default, not the case's)", true,
                  [](MlaConfig& c) {
                    const double s = 1.0 / std::sqrt(double(c.d_c + c.d_r));
                    return std::exchange(c.softmax_scale, s) != s;
                  }),
      config_edit("softmax_scale=bf16", "softmax scale rounded to bf16 before use", true,
                  [](MlaConfig& c) {
                    const double s = round_to(DType::BF16, c.softmax_scale);
                    return std::exchange(c.softmax_scale, s) != s;
                  }),
      config_edit("causal=flipped", "the causal mask the case does not say", true,
                  [](MlaConfig& c) {
                    c.causal = !c.causal;
                    return c.s_q > 1;
                  }),
      {"fp8_scale=missing",
       "fp8 cache read without its per-token scale",
       true,
       [](Case& k) { return scale_fp8(k, 0.0); },
       {}},
      {"fp8_scale=twice",
       "fp8 per-token scale applied twice",
       true,
       [](Case& k) { return scale_fp8(k, 2.0); },
       {}},
      perturbed("split=average", "split-KV partials averaged instead of lse-weighted", true,
                [](Perturbation& p) { p.split_average = true; }),
      perturbed(
          "causal=exclusive", "a query does not see its own token (t < pos(i))", true,
          [](Perturbation& p) { p.causal_extra = -1; },
          [](const MlaConfig& c) { return c.causal; }),
      config_edit("rope_style=swapped", "interleaved and half rope pairs swapped", false,
                  [](MlaConfig& c) {
                    c.rope_style = c.rope_style == RopeStyle::Interleaved ? RopeStyle::Half
                                                                          : RopeStyle::Interleaved;
                    return has_rope(c);
                  }),
      perturbed(
          "rope_pos=+1", "queries rotated at pos(i) + 1", false,
          [](Perturbation& p) { p.query_pos_shift = 1; }, has_rope),
      perturbed(
          "rope_pos=-1", "queries rotated at pos(i) - 1", false,
          [](Perturbation& p) { p.query_pos_shift = -1; }, has_rope),
      config_edit("eps=x10", "eps ten times the case's", false,
                  [](MlaConfig& c) {
                    c.eps *= 10;
                    return has_norm(c);
                  }),
      config_edit("eps=/10", "eps a tenth of the case's", false,
                  [](MlaConfig& c) {
                    c.eps /= 10;
                    return has_norm(c);
                  }),
      perturbed(
          "rms_mean=d-1", "the RMS statistic's mean over d - 1", false,
          [](Perturbation& p) { p.mean_over_d_minus_1 = true; }, has_norm),
      perturbed(
          "gamma_cq=missing", "the query content gain missing", false,
          [](Perturbation& p) { p.gamma_q_power = 0; }, has_norm),
      perturbed(
          "gamma_rq=missing", "the query rope gain missing", false,
          [](Perturbation& p) { p.no_rope_gain_q = true; }, rope_and_norm),
      perturbed(
          "gamma_rk=missing", "the key rope gain missing", false,
          [](Perturbation& p) { p.no_rope_gain_k = true; }, rope_and_norm),
      perturbed(
          "unified_rope=no_alpha_k", "unified norm: alpha_k scales the content score only", false,
          [](Perturbation& p) { p.rope_unscaled_by_alpha_k = true; },
          [](const MlaConfig& c) { return c.norm == NormMode::Unified && c.d_r > 0; }),
  };
  for (const impl::Mutant& m : impl::mutants()) {  // conventions §7's mutants are conventions too
    if (m.p.rounding_only() || m.p.lse_base2) continue;  // rounding only; lse base 2 is above
    const std::string name = "mutant=" + m.name;
    const Perturbation p = m.p;
    const impl::Mutant* mp = &m;
    // Visibility and the sink act in the attention core, which a kernel-level case runs too.
    const bool kernel = p.causal_extra != 0 || p.topk_shift != 0 || p.sink != SinkForm::OutOnly;
    v.push_back({name, m.bug, kernel,
                 [mp](Case& k) { return impl::mutant_not_applicable(*mp, k.cfg).empty(); }, p});
  }
  return v;
}

const std::vector<Convention>& conventions() {
  static const std::vector<Convention> v = make_conventions();
  return v;
}

double rel_l2_of(const Tensor& x, const Tensor& y, const Case& k, const std::string& t) {
  return compare(x, y, DType::F64, valid_mask(k, t)).rel_l2;
}

}  // namespace

std::vector<std::string> convention_names() {
  std::vector<std::string> n;
  for (const Convention& c : conventions()) n.push_back(c.name);
  return n;
}

std::vector<Match> diagnose(const Case& k, const std::map<std::string, Tensor>& given,
                            const std::map<std::string, Tensor>& refs,
                            const std::map<std::string, double>& allowed, size_t most) {
  std::map<std::string, double> base;  // rel_l2 against the case's own reference
  for (const auto& [t, x] : given)
    if (refs.count("ref." + t) && x.shape == refs.at("ref." + t).shape)
      base[t] = rel_l2_of(x, refs.at("ref." + t), k, t);
  const bool kernel = k.cfg.level == Level::Kernel;
  std::vector<Match> found(conventions().size());
  std::vector<std::function<void()>> tasks;
  for (size_t n = 0; n < conventions().size(); ++n) {
    const Convention& cv = conventions()[n];
    if (kernel && !cv.kernel_level) continue;
    tasks.push_back([&, n] {
      Case alt = k;
      alt.cfg.profile = Profile::FP64;  // the same bits, in fp64 arithmetic with no rounding points
      if (!conventions()[n].edit(alt)) return;
      const Outputs o = kernel ? impl::cpu_kernel(alt, std::nullopt, cv.p)
                               : impl::cpu_absorbed(alt, {{Variant::Default, cv.p, {}}})[0];
      Match m{cv.name, cv.what, {}, 1.0, true};
      double farthest = 0;
      for (const auto& [t, b] : base) {
        if (!o.tensors.count(t) || !(b > 0)) continue;
        const double e = rel_l2_of(given.at(t), o.tensors.at(t), k, t);
        m.tensors.push_back({t, e, b});
        m.score = std::min(m.score, e / b);
        m.would_pass = m.would_pass && (!allowed.count(t) || e <= allowed.at(t));
        farthest = std::max(farthest, e / b);
      }
      if (m.score <= 0.1 && farthest <= 2)
        found[n] = std::move(m);  // no tensor farther (2x: noise)
    });
  }
  run_parallel(tasks, 2);
  std::vector<Match> all;
  for (Match& f : found)
    if (!f.tensors.empty()) all.push_back(std::move(f));
  std::stable_sort(all.begin(), all.end(),
                   [](const Match& a, const Match& b) { return a.score < b.score; });
  if (all.size() > most) all.resize(most);
  return all;
}

}  // namespace qkmla
