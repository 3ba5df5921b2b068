#include "render/audit_view.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "render/junit.hpp"
#include "render/rows.hpp"

namespace qkmla {

std::string audit_text(const AuditResult& r, bool md) {
  const MlaConfig& c = r.cfg;
  std::string text =
      fmt::format("{}qkmla audit: {} against {} ({} level, profile {}, preset {}, scenario {})\n",
                  md ? "# " : "", r.impl, r.case_path, to_string(c.level), to_string(c.profile),
                  c.preset, c.scenario);
  if (!r.missing.empty())
    text +=
        fmt::format("{}not given (not judged): {}\n", md ? "\n" : "", fmt::join(r.missing, ", "));
  if (!r.ignored.empty())
    text += fmt::format("ignored (no reference in the case): {}\n", fmt::join(r.ignored, ", "));
  for (const TensorAudit& a : r.tensors) {
    const Judged& j = a.j;
    text += fmt::format(
        "{}{}: {}  max_abs {:.3g}  max_ulp {:.3g}  rel_l2 {:.3g}  cos_diff {:.3g}  baseline_ratio "
        "{:.3g}  nonfinite {}\n",
        md ? "\n## " : "\n", j.tensor, j.v.pass ? "PASS" : "FAIL", j.m.max_abs, j.m.max_ulp,
        j.m.rel_l2, j.m.cos_diff, j.baseline_ratio, j.m.nonfinite_mismatch);
    for (const std::string& why : j.v.failed) text += "  failed: " + why + "\n";
    for (const Worst& w : a.worst)
      text +=
          fmt::format("  worst {} value {:.9g} ref {:.9g}\n", index_str(w.index), w.value, w.ref);
    std::string heads, seqs;
    for (const auto& [h, v] : a.per_head) heads += fmt::format(" h{}={:.3g}", h, v);
    for (const auto& [b, v] : a.per_seq) seqs += fmt::format(" b{}={:.3g}", b, v);
    text += "  rel_l2 per head:" + heads + "\n  rel_l2 per sequence:" + seqs + "\n";
  }
  if (!r.pass() && r.diagnosis.empty())
    text +=
        "\ndiagnosis: no convention tried (qkmla audit --help) matches the outputs better than the "
        "case's own\n";
  for (const Match& m : r.diagnosis) {
    std::string ts;
    for (const TensorMatch& t : m.tensors)
      ts += fmt::format("{}{} rel_l2 {:.3g} ({:.3g})", ts.empty() ? "" : ", ", t.tensor, t.rel_l2,
                        t.rel_l2_case);
    text += fmt::format("\ndiagnosis: the outputs match the reference under {} ({}): {}{}",
                        m.convention, m.what, ts,
                        m.would_pass ? "; every tensor would pass under it" : "");
  }
  if (!r.diagnosis.empty()) text += "\n  (in parentheses: rel_l2 under the case's own conventions)";
  if (!r.diagnosis.empty()) text += "\n";
  return text + fmt::format("\nverdict: {}\n", r.pass() ? "PASS" : "FAIL");
}

std::string audit_json(const AuditResult& r) {
  nlohmann::ordered_json j;
  j["impl"] = r.impl;
  j["case"] = r.case_path;
  j["verdict"] = r.pass() ? "PASS" : "FAIL";
  j["missing"] = r.missing;
  j["ignored"] = r.ignored;
  j["designs"] = r.designs;
  j["diagnosis"] = nlohmann::json::array();
  for (const Match& m : r.diagnosis) {
    nlohmann::json ts = nlohmann::json::array();
    for (const TensorMatch& t : m.tensors)
      ts.push_back({{"tensor", t.tensor}, {"rel_l2", t.rel_l2}, {"rel_l2_case", t.rel_l2_case}});
    j["diagnosis"].push_back({{"convention", m.convention},
                              {"what", m.what},
                              {"would_pass", m.would_pass},
                              {"tensors", ts}});
  }
  for (const TensorAudit& a : r.tensors) {
    const Judged& x = a.j;
    nlohmann::ordered_json t = {{"tensor", x.tensor},
                                {"pass", x.v.pass},
                                {"failed", x.v.failed},
                                {"max_abs", finite_or_null(x.m.max_abs)},
                                {"max_ulp", finite_or_null(x.m.max_ulp)},
                                {"rel_l2", finite_or_null(x.m.rel_l2)},
                                {"cos_diff", finite_or_null(x.m.cos_diff)},
                                {"baseline_ratio", finite_or_null(x.baseline_ratio)},
                                {"nonfinite_mismatch", x.m.nonfinite_mismatch},
                                {"delivered", dtype_name(a.delivered)},
                                {"yardstick_rel_l2", finite_or_null(a.yardstick)},
                                {"yardstick_design", a.yardstick_design}};
    for (const Worst& w : a.worst)
      t["worst"].push_back({{"index", w.index}, {"value", w.value}, {"ref", w.ref}});
    for (const auto& [h, v] : a.per_head) t["per_head"].push_back({{"head", h}, {"rel_l2", v}});
    for (const auto& [b, v] : a.per_seq)
      t["per_sequence"].push_back({{"sequence", b}, {"rel_l2", v}});
    j["tensors"].push_back(t);
  }
  return j.dump(1) + "\n";
}

std::string audit_junit(const AuditResult& r) {
  std::vector<JUnitCase> cases;
  for (const TensorAudit& a : r.tensors) {
    std::string why;
    for (const std::string& w : a.j.v.failed) why += (why.empty() ? "" : "; ") + w;
    cases.push_back({"qkmla.audit", r.impl, a.j.tensor, a.j.v.pass, 0.0, a.j.v.first_metric, why});
  }
  return junit_xml("qkmla.audit", cases);
}

}  // namespace qkmla
