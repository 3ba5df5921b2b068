#include "harness/budgets.hpp"

#include <fmt/format.h>

#include <boost/math/distributions/fisher_f.hpp>
#include <cmath>
#include <fstream>
#include <limits>

#include "core/impl_id.hpp"
#include "io/safetensors.hpp"
#include "io/toml_text.hpp"

namespace qkmla {

GateRule default_rule() {
  GateRule r;
  apply_budget_text(r, default_budget_text(), "budget table (src/gate/budgets.toml)");
  return r;
}

const std::string& default_budget_text() {
  static const std::string text =
#include "harness/budgets_toml.inc"
      ;
  return text;
}

namespace {

bool matches(const std::string& pattern, const std::string& value) {
  if (pattern == "*" || pattern == value) return true;
  return !pattern.empty() && pattern.back() == '*' &&
         value.rfind(pattern.substr(0, pattern.size() - 1), 0) == 0;
}

double metric_value(const Metrics& m, const std::string& name, double baseline_ratio) {
  if (name == "max_abs") return m.max_abs;
  if (name == "max_ulp") return m.max_ulp;
  if (name == "rel_l2") return m.rel_l2;
  if (name == "cos_diff") return m.cos_diff;
  if (name == "baseline_ratio") return baseline_ratio;
  if (name == "bound_ratio") return m.bound_ratio;
  return std::nan("");
}

bool known_metric(const std::string& name) {
  for (const char* n :
       {"max_abs", "max_ulp", "rel_l2", "cos_diff", "baseline_ratio", "bound_ratio"})
    if (name == n) return true;
  return false;
}

}  // namespace

void apply_budget_file(GateRule& rule, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "file", "cannot be opened");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const toml::table t = parse_toml(text, path);
  for (const auto& [key, node] : t) {
    const std::string k(key.str());
    if (k != "baseline_k" && k != "baseline_k_source" && k != "budget" && k != "design" &&
        k != "projection_k" && k != "projection_k_source")
      throw InputError(path, k,
                       "unknown key (expected baseline_k, baseline_k_source, [[budget]] or "
                       "[design])");
  }
  if (const auto* node = t.get("design")) {
    const toml::table* d = node->as_table();
    if (!d) throw InputError(path, "design", "must be a table ([design])");
    std::string text;
    for (const auto& [key, v] : *d) {
      const auto value = v.value<std::string>();
      if (!value)
        throw InputError(path, "design." + std::string(key.str()),
                         "must be a string (e.g. q_latent = \"bf16\")");
      text += (text.empty() ? "" : ",") + std::string(key.str()) + "=" + *value;
    }
    rule.design = text;
  }
  apply_budget_text(rule, text, path);
}

void apply_budget_text(GateRule& rule, const std::string& text, const std::string& path) {
  const toml::table t = parse_toml(text, path);
  if (const auto* k = t.get("baseline_k")) {
    const auto v = k->value<double>();
    if (!v || !(*v > 0)) throw InputError(path, "baseline_k", "must be a positive number");
    rule.baseline_k = *v;
    rule.baseline_k_source = t["baseline_k_source"].value_or(std::string(path));
  }
  if (const auto* k = t.get("projection_k")) {
    const auto v = k->value<double>();
    if (!v || !(*v > 0)) throw InputError(path, "projection_k", "must be a positive number");
    rule.projection_k = *v;
    rule.projection_k_source = t["projection_k_source"].value_or(std::string(path));
  }
  const toml::array* arr = t["budget"].as_array();
  if (!arr && t.contains("budget"))
    throw InputError(path, "budget", "must be an array of tables ([[budget]])");
  for (size_t i = 0; arr && i < arr->size(); ++i) {
    const toml::table* b = (*arr)[i].as_table();
    const std::string where = fmt::format("budget[{}]", i);
    if (!b) throw InputError(path, where, "must be a table");
    for (const auto& [key, node] : *b) {
      const std::string k(key.str());
      if (k != "impl" && k != "preset" && k != "scenario" && k != "profile" && k != "tensor" &&
          k != "metric" && k != "max" && k != "source")
        throw InputError(path, where + "." + k, "unknown key");
    }
    Budget bud;
    bud.impl = (*b)["impl"].value_or(std::string("*"));
    bud.preset = (*b)["preset"].value_or(std::string("*"));
    bud.scenario = (*b)["scenario"].value_or(std::string("*"));
    bud.profile = (*b)["profile"].value_or(std::string("*"));
    bud.tensor = (*b)["tensor"].value_or(std::string("*"));
    bud.metric = (*b)["metric"].value_or(std::string(""));
    const auto max = (*b)["max"].value<double>();
    bud.source = (*b)["source"].value_or(std::string(""));
    if (!known_metric(bud.metric))
      throw InputError(path, where + ".metric",
                       "must be max_abs, max_ulp, rel_l2, cos_diff, baseline_ratio or bound_ratio");
    if (!max || !(*max >= 0)) throw InputError(path, where + ".max", "must be a number >= 0");
    if (bud.source.empty())
      throw InputError(path, where + ".source",
                       "every budget needs a source (a proof step or a measured baseline)");
    bud.max = *max;
    bool replaced = false;
    for (Budget& old : rule.budgets)
      if (old.impl == bud.impl && old.preset == bud.preset && old.scenario == bud.scenario &&
          old.profile == bud.profile && old.tensor == bud.tensor && old.metric == bud.metric)
        old = bud, replaced = true;
    if (!replaced) rule.budgets.push_back(bud);
  }
}

double small_sample_k(int64_t samples) {
  if (samples < 2) return std::numeric_limits<double>::infinity();  // one value: no statistic
  const double n = double(samples);
  const boost::math::fisher_f f(n, n);
  return std::sqrt(boost::math::quantile(boost::math::complement(f, kSmallSampleAlpha)));
}

Verdict judge(const GateRule& rule, const Subject& s, const Metrics& m, double baseline_ratio,
              int64_t samples) {
  Verdict v;
  auto fail = [&](const std::string& metric, const std::string& what) {
    v.pass = false;
    if (v.first_metric.empty()) v.first_metric = metric;
    v.failed.push_back(what);
  };
  if (m.nonfinite_mismatch != 0)
    fail("nonfinite_mismatch", fmt::format("nonfinite_mismatch={}", m.nonfinite_mismatch));
  for (double x : {m.max_abs, m.max_ulp, m.rel_l2, m.cos_diff})
    if (std::isnan(x)) {
      fail("nan", "a metric is NaN");
      break;
    }
  // Every matching baseline_ratio budget holds (the rule's k when none matches), each widened for
  // a small sample to the F-test's k (proofs/budgets.md).
  std::vector<std::pair<double, std::string>> ks;
  std::vector<const Budget*> matching;
  for (const Budget& b : rule.budgets) {
    if (!id_matches(b.impl, s.impl) || !matches(b.preset, s.preset) ||
        !matches(b.scenario, s.scenario) || !matches(b.profile, s.profile) ||
        !matches(b.tensor, s.tensor))
      continue;
    if (b.metric == "baseline_ratio")
      ks.emplace_back(b.max, b.source);
    else
      matching.push_back(&b);
  }
  if (ks.empty()) ks.emplace_back(rule.baseline_k, rule.baseline_k_source);
  const double small = small_sample_k(samples);
  for (const auto& [k0, source] : ks) {
    const double k = std::max(k0, small);
    if (!std::isnan(baseline_ratio) && !(baseline_ratio <= k))
      fail("baseline_ratio",
           k > k0
               ? fmt::format("baseline_ratio={:.3g}>{:.3g} (F-test allowance for {} samples; {})",
                             baseline_ratio, k, samples, source)
               : fmt::format("baseline_ratio={:.3g}>{} ({})", baseline_ratio, k, source));
  }
  for (const Budget* b : matching) {
    if (b->metric == "bound_ratio" && std::isnan(m.bound_ratio))
      continue;  // no bound for this implementation
    const double x = metric_value(m, b->metric, baseline_ratio);
    if (!(x <= b->max))
      fail(b->metric, fmt::format("{}={:.3g}>{:.3g} ({})", b->metric, x, b->max, b->source));
  }
  return v;
}

}  // namespace qkmla
