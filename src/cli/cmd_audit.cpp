// qkmla audit CASE OUTPUTS: a third party's outputs against a golden case's reference, with the
// gate rule, worst elements and per-head / per-sequence breakdowns.
#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "gate/budgets.hpp"
#include "io/case_io.hpp"
#include "io/outputs_io.hpp"
#include "io/safetensors.hpp"
#include "metrics/compare.hpp"

namespace qkmla::cli {

namespace {

struct AuditFlags {
  std::string case_path, outputs_path, label = "third_party", lse_base = "e", empty_lse = "-inf", budgets, junit,
                                       format = "table", output;
};

struct TensorAudit {
  std::string tensor;
  Metrics m;
  double baseline_ratio = std::nan("");
  Verdict v;
  std::vector<std::pair<int64_t, double>> per_head, per_seq;  // (index, rel_l2)
  std::vector<Worst> worst;                                   // the five largest errors
};

// rel_l2 over the elements whose index along `dim` equals each value.
std::vector<std::pair<int64_t, double>> breakdown(const Tensor& x, const Tensor& y, int dim) {
  if (int(y.shape.size()) <= dim) return {};
  std::vector<long double> d2(size_t(y.shape[size_t(dim)]), 0), y2(d2.size(), 0);
  for (int64_t i = 0; i < y.numel(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
    const size_t at = size_t(y.unravel(i)[size_t(dim)]);
    d2[at] += (long double)(x[i] - y[i]) * (x[i] - y[i]);
    y2[at] += (long double)y[i] * y[i];
  }
  std::vector<std::pair<int64_t, double>> out;
  for (size_t a = 0; a < d2.size(); ++a) out.emplace_back(int64_t(a), y2[a] > 0 ? double(std::sqrt(d2[a] / y2[a])) : double(std::sqrt(d2[a])));
  return out;
}

std::vector<Worst> top_errors(const Tensor& x, const Tensor& y, size_t n) {
  std::vector<std::pair<double, int64_t>> e;
  for (int64_t i = 0; i < y.numel(); ++i)
    if (std::isfinite(x[i]) && std::isfinite(y[i])) e.emplace_back(std::fabs(x[i] - y[i]), i);
  std::partial_sort(e.begin(), e.begin() + std::ptrdiff_t(std::min(n, e.size())), e.end(), std::greater<>());
  std::vector<Worst> w;
  for (size_t k = 0; k < std::min(n, e.size()); ++k) w.push_back({y.unravel(e[k].second), x[e[k].second], y[e[k].second]});
  return w;
}

std::string idx(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return "[" + s + "]";
}

}  // namespace

Runner add_audit(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<AuditFlags>();
  auto* cmd = app.add_subcommand("audit", "judge a third party's outputs (safetensors file or .npy folder) against a golden case");
  cmd->add_option("case", f->case_path, "golden case (qkmla golden)")->required();
  cmd->add_option("outputs", f->outputs_path, "outputs: .safetensors file or folder of .npy files")->required();
  cmd->add_option("--label", f->label, "name of the audited implementation (reported as audit.<label>)")->capture_default_str();
  cmd->add_option("--lse-base", f->lse_base, "base of the given lse: e or 2")->check(CLI::IsMember({"e", "2"}))->capture_default_str();
  cmd->add_option("--empty-lse", f->empty_lse, "what the outputs hold for rows with no visible key: -inf, +inf or nan")
      ->check(CLI::IsMember({"-inf", "+inf", "nan"}))->capture_default_str();
  cmd->add_option("--budgets", f->budgets, "budget overrides (TOML: baseline_k, [[budget]])")->check(CLI::ExistingFile);
  cmd->add_option("--junit", f->junit, "write JUnit XML to FILE");
  cmd->add_option("--format", f->format, "table|md|json")->check(CLI::IsMember({"table", "md", "json"}))->capture_default_str();
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  return [f, command_line] {
    const CaseFile cf = read_case(f->case_path);
    if (cf.refs.empty()) throw InputError(f->case_path, "ref.*", "not a golden case: no reference tensors (make one with qkmla golden)");
    std::map<std::string, Tensor> given = read_outputs(f->outputs_path);
    GateRule rule = default_rule();
    if (!f->budgets.empty()) apply_budget_file(rule, f->budgets);
    const MlaConfig& c = cf.k.cfg;
    const bool kernel = c.level == Level::Kernel;
    const std::vector<std::string> primary = kernel ? std::vector<std::string>{"latent_out", "lse"} : std::vector<std::string>{"out", "lse"};
    nlohmann::json base;
    if (cf.metadata.count("qkmla.baseline")) base = nlohmann::json::parse(cf.metadata.at("qkmla.baseline"), nullptr, false);
    const double floor = unit_roundoff(stored_dtype(c.profile)) / 16;
    std::vector<TensorAudit> audits;
    std::vector<std::string> missing, ignored;
    for (auto& [name, x] : given) {
      if (!cf.refs.count("ref." + name)) {
        ignored.push_back(name);
        continue;
      }
      const Tensor& y = cf.refs.at("ref." + name);
      if (x.shape != y.shape)
        throw InputError(f->outputs_path, name, "shape " + shape_str(x.shape) + " does not match the case's " + shape_str(y.shape));
      if (name == "lse") {
        for (int64_t i = 0; i < x.numel(); ++i) {
          if (f->lse_base == "2" && std::isfinite(x[i])) x[i] *= std::log(2.0);
          const bool empty = std::isinf(y[i]) && y[i] < 0;
          const bool convention = (f->empty_lse == "+inf" && std::isinf(x[i]) && x[i] > 0) || (f->empty_lse == "nan" && std::isnan(x[i]));
          if (empty && convention) x[i] = -INFINITY;
        }
      }
      TensorAudit a;
      a.tensor = name;
      const DType ulp = (name == "out" || name == "latent_out" || name == "q_latent") ? stored_dtype(c.profile) : accumulate_dtype(c.profile);
      a.m = compare(x, y, ulp, valid_mask(cf.k, name));
      if (base.is_object() && base.contains("rel_l2") && base["rel_l2"].contains(name))
        a.baseline_ratio = a.m.rel_l2 / std::max(base["rel_l2"][name].get<double>(), floor);
      a.v = judge(rule, {"audit." + f->label, c.preset, c.scenario, to_string(c.profile), name}, a.m, a.baseline_ratio);
      a.per_head = breakdown(x, y, 2);
      a.per_seq = breakdown(x, y, 0);
      a.worst = top_errors(x, y, 5);
      audits.push_back(std::move(a));
    }
    for (const std::string& p : primary)
      if (!given.count(p)) missing.push_back(p);
    if (audits.empty())
      throw InputError(f->outputs_path, "outputs", "none of the given tensors has a reference in the case (expected " + primary[0] + " and/or lse)");
    bool pass = true;
    for (const TensorAudit& a : audits) pass &= a.v.pass;
    // Rendering.
    std::string text;
    if (f->format == "json") {
      nlohmann::ordered_json j;
      j["impl"] = "audit." + f->label;
      j["case"] = f->case_path;
      j["verdict"] = pass ? "PASS" : "FAIL";
      j["missing"] = missing;
      j["ignored"] = ignored;
      for (const TensorAudit& a : audits) {
        nlohmann::ordered_json t = {{"tensor", a.tensor}, {"pass", a.v.pass}, {"failed", a.v.failed}, {"max_abs", a.m.max_abs},
                                    {"max_ulp", a.m.max_ulp}, {"rel_l2", a.m.rel_l2}, {"cos_diff", a.m.cos_diff},
                                    {"baseline_ratio", std::isnan(a.baseline_ratio) ? nlohmann::json(nullptr) : nlohmann::json(a.baseline_ratio)},
                                    {"nonfinite_mismatch", a.m.nonfinite_mismatch}};
        for (const Worst& w : a.worst) t["worst"].push_back({{"index", w.index}, {"value", w.value}, {"ref", w.ref}});
        for (const auto& [h, r] : a.per_head) t["per_head"].push_back({{"head", h}, {"rel_l2", r}});
        for (const auto& [b, r] : a.per_seq) t["per_sequence"].push_back({{"sequence", b}, {"rel_l2", r}});
        j["tensors"].push_back(t);
      }
      text = j.dump(1) + "\n";
    } else {
      const bool md = f->format == "md";
      text = fmt::format("{}qkmla audit: audit.{} against {} ({} level, profile {}, preset {}, scenario {})\n", md ? "# " : "", f->label,
                         f->case_path, to_string(c.level), to_string(c.profile), c.preset, c.scenario);
      if (!missing.empty()) text += fmt::format("{}not given (not judged): {}\n", md ? "\n" : "", fmt::join(missing, ", "));
      if (!ignored.empty()) text += fmt::format("ignored (no reference in the case): {}\n", fmt::join(ignored, ", "));
      for (const TensorAudit& a : audits) {
        text += fmt::format("{}{}: {}  max_abs {:.3g}  max_ulp {:.3g}  rel_l2 {:.3g}  cos_diff {:.3g}  baseline_ratio {:.3g}  nonfinite {}\n",
                            md ? "\n## " : "\n", a.tensor, a.v.pass ? "PASS" : "FAIL", a.m.max_abs, a.m.max_ulp, a.m.rel_l2, a.m.cos_diff,
                            a.baseline_ratio, a.m.nonfinite_mismatch);
        for (const std::string& why : a.v.failed) text += "  failed: " + why + "\n";
        for (const Worst& w : a.worst) text += fmt::format("  worst {} value {:.9g} ref {:.9g}\n", idx(w.index), w.value, w.ref);
        std::string heads, seqs;
        for (const auto& [h, r] : a.per_head) heads += fmt::format(" h{}={:.3g}", h, r);
        for (const auto& [b, r] : a.per_seq) seqs += fmt::format(" b{}={:.3g}", b, r);
        text += "  rel_l2 per head:" + heads + "\n  rel_l2 per sequence:" + seqs + "\n";
      }
      text += fmt::format("\nverdict: {}\n", pass ? "PASS" : "FAIL");
    }
    if (!f->junit.empty()) {
      std::string x = fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"{}\" failures=\"{}\">\n  <testsuite name=\"qkmla.audit\" tests=\"{}\" failures=\"{}\">\n",
                                  audits.size(), std::count_if(audits.begin(), audits.end(), [](const TensorAudit& a) { return !a.v.pass; }), audits.size(),
                                  std::count_if(audits.begin(), audits.end(), [](const TensorAudit& a) { return !a.v.pass; }));
      for (const TensorAudit& a : audits) {
        x += fmt::format("    <testcase classname=\"audit.{}\" name=\"{}\"", f->label, a.tensor);
        if (a.v.pass) x += "/>\n";
        else {
          std::string why;
          for (const std::string& w : a.v.failed) why += (why.empty() ? "" : "; ") + w;
          for (char& ch : why) if (ch == '<' || ch == '>' || ch == '&' || ch == '"') ch = ' ';
          x += fmt::format(">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n", a.v.first_metric, why);
        }
      }
      x += "  </testsuite>\n</testsuites>\n";
      if (const int rc = write_output(x, f->junit)) return rc;
    }
    if (const int rc = write_output(text, f->output)) return rc;
    return pass ? 0 : 1;
  };
}

}  // namespace qkmla::cli
