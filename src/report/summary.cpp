#include "report/summary.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "core/impl_id.hpp"
#include "render/rows.hpp"

namespace qkmla {

namespace {

bool starts(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

std::string conclusion(const ProfileSummary& s) {
  std::string head = s.profile + ": ";
  if (s.explicit_out > 0 && s.absorbed_out > 0)
    head += fmt::format("absorbed out error {:.2f}x explicit's ({:.2e} vs {:.2e}); ",
                        s.absorbed_out / s.explicit_out, s.absorbed_out, s.explicit_out);
  else if (s.explicit_out == 0 && s.absorbed_out == 0 && s.judged > 0)
    head += "absorbed and explicit out both exact; ";
  if (s.failed.empty()) return head + fmt::format("all {} implementations pass", s.judged);
  std::string f;
  for (const std::string& n : s.failed) f += (f.empty() ? "" : ", ") + n;
  return head + fmt::format("{} of {} FAIL: {}", s.failed.size(), s.judged, f);
}

}  // namespace

std::vector<ProfileSummary> summarize(const Report& r) {
  std::vector<ProfileSummary> out;
  for (const ProfileReference& ref : r.references) {
    ProfileSummary s;
    s.profile = ref.profile;
    s.agreeing_bits = ref.agreeing_bits, s.required_bits = ref.required_bits;
    double equiv = 0;
    std::map<std::string, bool> pass;  // implementation -> every row passes
    std::vector<std::string> order;
    for (const Row& row : r.rows) {
      if (row.profile != s.profile) continue;
      const ImplId& id = row.impl;
      if (id == ref_id(Form::Absorbed)) equiv = std::max(equiv, row.m.rel_l2);
      const bool cpu_default = id.family == Family::Cpu && id.variant == Variant::Default;
      if (row.tensor == "out" && cpu_default && id.form == Form::Absorbed)
        s.absorbed_out = row.m.rel_l2;
      if (row.tensor == "out" && cpu_default && id.form == Form::Explicit)
        s.explicit_out = row.m.rel_l2;
      if (!row.judged) continue;
      const std::string name = to_string(id.without_profile());
      if (!pass.count(name)) order.push_back(name), pass[name] = true;
      pass[name] = pass[name] && row.v.pass;
      if (std::isnan(row.baseline_ratio)) continue;
      WorstRow* w = nullptr;
      for (WorstRow& x : s.worst)
        if (x.tensor == row.tensor) w = &x;
      if (!w) s.worst.push_back({row.tensor, {}, -1}), w = &s.worst.back();
      if (row.baseline_ratio > w->ratio) w->impl = row.impl, w->ratio = row.baseline_ratio;
    }
    s.equivalence_bits = equiv > 0 ? -std::log2(equiv) : std::numeric_limits<double>::infinity();
    s.judged = int(order.size());
    for (const std::string& name : order)
      if (pass[name])
        ++s.passed;
      else
        s.failed.push_back(name);
    s.conclusion = conclusion(s);
    out.push_back(std::move(s));
  }
  return out;
}

std::string gpu_status(const Report& r) {
  for (const std::string& n : r.notes)
    if (starts(n, "no CUDA device"))  // the reason is in the notes
      return "GPU: no kernel ran (no CUDA device); gpu.model rows are the kernels' CPU model";
  std::string s;
  int compared = 0, identical = 0;
  for (const std::string& n : r.notes)
    if (starts(n, "gpu.") && n.find(" vs ") != std::string::npos) {
      ++compared;
      identical += n.find("bit-identical") != std::string::npos;
    }
  for (const std::string& n : r.notes)
    if (starts(n, "GPU run failed")) return "GPU: " + n;
  if (compared)
    return fmt::format("GPU: kernels ran; {} of {} kernel/model pairs bit-identical", identical,
                       compared);
  return "GPU: no kernel rows in this report";
}

std::string summary_text(const Report& r) {
  const std::vector<ProfileSummary> all = summarize(r);
  std::string s =
      "summary: verdicts by the gate rule and budgets (as `qkmla gate`); ratio = rel_l2 over the\n"
      "yardstick of the row's design; equivalence = bits on which ref.absorbed equals "
      "ref.explicit\n";
  s += fmt::format("  {:<12}{:>8}{:>12}{:>6}  {:<29} {}\n", "profile", "ref bits", "equivalence",
                   "pass", "worst out (ratio)", "worst lse (ratio)");
  auto worst = [](const ProfileSummary& p, const char* t) {
    for (const WorstRow& w : p.worst)
      if (w.tensor == t) return fmt::format("{} {:.2f}", brief(w.impl), w.ratio);
    return std::string("-");
  };
  for (const ProfileSummary& p : all) {
    const std::string eq =
        std::isinf(p.equivalence_bits) ? "exact" : fmt::format("{:.1f}", p.equivalence_bits);
    s += fmt::format("  {:<12}{:>8.1f}{:>12}{:>6}  {:<29} {}\n", p.profile, p.agreeing_bits, eq,
                     fmt::format("{}/{}", p.passed, p.judged), worst(p, "out"), worst(p, "lse"));
  }
  s += "  " + gpu_status(r) + "\n";
  for (const ProfileSummary& p : all) s += "  " + p.conclusion + "\n";
  return s;
}

nlohmann::ordered_json summary_json(const Report& r) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const ProfileSummary& p : summarize(r)) {
    nlohmann::ordered_json worst = nlohmann::ordered_json::array();
    for (const WorstRow& w : p.worst)
      worst.push_back(
          {{"tensor", w.tensor}, {"impl", to_string(w.impl)}, {"baseline_ratio", w.ratio}});
    a.push_back({{"profile", p.profile},
                 {"agreeing_bits", p.agreeing_bits},
                 {"required_bits", p.required_bits},
                 {"equivalence_bits", finite_or_null(p.equivalence_bits)},
                 {"worst", worst},
                 {"implementations", p.judged},
                 {"passed", p.passed},
                 {"failed", p.failed},
                 {"absorbed_out_rel_l2", p.absorbed_out},
                 {"explicit_out_rel_l2", p.explicit_out},
                 {"conclusion", p.conclusion}});
  }
  return {{"profiles", a}, {"gpu", gpu_status(r)}};
}

}  // namespace qkmla
