#include "render/audit_view.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "render/junit.hpp"
#include "render/rows.hpp"

namespace qkmla {

namespace {

// "PyTorch module (every op stored) (out bf16): ratio 0.97" per family, tightest first.
std::string family_lines(const std::vector<FamilyFit>& fits, const std::string& indent) {
  std::string text;
  for (size_t n = 0; n < fits.size(); ++n) {
    const FamilyFit& f = fits[n];
    text += fmt::format("{}{}: ratio {:.3g} (yardstick rel_l2 {:.3g}){}\n", indent, f.family,
                        f.ratio, f.yardstick,
                        !f.consistent ? " (not consistent)"
                        : n == 0      ? " <- tightest"
                                      : "");
  }
  return text;
}

// The verdict's one line: which design the outputs pass as, or why they fail.
std::string verdict_line(const AuditResult& r) {
  if (!r.nothing_judged.empty()) return "FAIL (" + r.nothing_judged + ")";
  if (!r.pass()) return "FAIL";
  if (!r.declared.empty()) return "PASS as the declared design " + r.declared;
  const std::string at = r.stored_scale.empty() ? "" : " at the stored softmax scale";
  const TensorAudit* shown = nullptr;  // the vector output when given, else lse
  for (const TensorAudit& a : r.tensors)
    if (!a.families.empty() && (!shown || a.j.tensor != "lse")) shown = &a;
  if (!shown || !shown->families[0].consistent) return "PASS" + at;
  std::string text = fmt::format("PASS{} as {}: {} ratio {:.3g}", at, shown->families[0].family,
                                 shown->j.tensor, shown->families[0].ratio);
  const FamilyFit& last = shown->families.back();
  if (!last.consistent)
    text += fmt::format("; {}: ratio {:.3g} (not consistent)", last.family, last.ratio);
  return text;
}

// Whether to point at --kv-chunk: an undeclared chunk length, the explicit form among the
// candidates (its chunked family merges stored partials) and out failing on a row scale, the
// signature of many stored merges (zoo style vllm_mla_prefill, seed 107333).
bool merge_hint(const AuditResult& r) {
  if (r.pass() || r.kv_chunk > 0 ||
      std::find(r.forms.begin(), r.forms.end(), "explicit") == r.forms.end())
    return false;
  for (const TensorAudit& a : r.tensors)
    if (a.j.tensor == "out")
      for (const StructureCheck& s : a.structure)
        if (!s.pass && (s.stat == "bias" || s.stat == "row_bias")) return true;
  return false;
}

}  // namespace

std::string audit_text(const AuditResult& r, bool md) {
  const MlaConfig& c = r.cfg;
  std::string text =
      fmt::format("{}qkmla audit: {} against {}\n({} level, profile {}, preset {}, scenario {})\n",
                  md ? "# " : "", to_string(r.id), r.case_path, to_string(c.level),
                  to_string(c.profile), c.preset, c.scenario);
  if (!r.declared.empty()) text += "declared design (strict): " + r.declared + "\n";
  if (!r.forms_note.empty()) text += r.forms_note + "\n";
  if (r.kv_chunk > 0)
    text +=
        fmt::format("declared KV chunks of {} tokens: sampled instead of 2-4 splits\n", r.kv_chunk);
  if (!r.stored_scale.empty()) text += r.stored_scale + "\n";
  if (!r.missing.empty())
    text +=
        fmt::format("{}not given (not judged): {}\n", md ? "\n" : "", fmt::join(r.missing, ", "));
  if (!r.ignored.empty())
    text += fmt::format("ignored (no reference in the case): {}\n", fmt::join(r.ignored, ", "));
  if (!r.nothing_judged.empty()) text += r.nothing_judged + "\n";
  for (const TensorAudit& a : r.tensors) {
    const Judged& j = a.j;
    const std::string state = !a.judged ? "not judged (no yardstick)" : j.v.pass ? "PASS" : "FAIL";
    text += fmt::format(
        "{}{}: {}  max_abs {:.3g}  max_ulp {:.3g}  rel_l2 {:.3g}  cos_diff {:.3g}\n"
        "  baseline_ratio {:.3g}  nonfinite {}  delivered {}\n",
        md ? "\n## " : "\n", j.tensor, state, j.m.max_abs, j.m.max_ulp, j.m.rel_l2, j.m.cos_diff,
        j.baseline_ratio, j.m.nonfinite_mismatch, dtype_name(a.delivered));
    for (const std::string& why : j.v.failed) text += "  failed: " + why + "\n";
    if (!a.families.empty()) text += "  designs:\n" + family_lines(a.families, "    ");
    if (r.undeclared.count(j.tensor))
      text += "  without the declaration:\n" + family_lines(r.undeclared.at(j.tensor), "    ");
    for (const StructureCheck& s : a.structure)
      text += fmt::format("  {} {:.3g}: {:.3g}x the correct implementations' largest ({:.3g}){}\n",
                          s.stat, s.value, s.ratio, s.yardstick, s.pass ? "" : "  FAIL") +
              (s.note.empty() ? "" : "    (" + s.note + ")\n");
    for (const Worst& w : a.worst)
      text +=
          fmt::format("  worst {} value {:.9g} ref {:.9g}\n", index_str(w.index), w.value, w.ref);
    std::string heads, seqs;
    for (const auto& [h, v] : a.per_head) heads += fmt::format(" h{}={:.3g}", h, v);
    for (const auto& [b, v] : a.per_seq) seqs += fmt::format(" b{}={:.3g}", b, v);
    text += "  rel_l2 per head:" + heads + "\n  rel_l2 per sequence:" + seqs + "\n";
  }
  if (!r.pass() && r.diagnosis.empty() && r.nothing_judged.empty())
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
  if (merge_hint(r))
    text +=
        "\nnote: out fails on a row scale (bias or row_bias); if the implementation merges more "
        "than 4 KV chunks one after another, each partial stored (a chunked prefill with a small "
        "workspace), declare its chunk length with --kv-chunk N: undeclared, the yardstick "
        "merges 2 to 4\n";
  return text + "\nverdict: " + verdict_line(r) + "\n";
}

std::string audit_json(const AuditResult& r) {
  nlohmann::ordered_json j;
  j["impl"] = to_string(r.id);
  j["case"] = r.case_path;
  j["verdict"] = r.pass() ? "PASS" : "FAIL";
  j["verdict_line"] = verdict_line(r);
  j["declared_design"] = r.declared;
  j["nothing_judged"] = r.nothing_judged;
  j["missing"] = r.missing;
  j["ignored"] = r.ignored;
  j["designs"] = r.designs;
  j["forms"] = r.forms;
  j["forms_note"] = r.forms_note;
  j["kv_chunk"] = r.kv_chunk;
  j["stored_scale"] = r.stored_scale;
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
                                {"yardstick_design", a.yardstick_design},
                                {"judged", a.judged}};
    auto fits = [](const std::vector<FamilyFit>& v) {
      nlohmann::json arr = nlohmann::json::array();
      for (const FamilyFit& f : v)
        arr.push_back({{"family", f.family},
                       {"design", f.design},
                       {"yardstick_rel_l2", finite_or_null(f.yardstick)},
                       {"ratio", finite_or_null(f.ratio)},
                       {"consistent", f.consistent}});
      return arr;
    };
    t["designs"] = fits(a.families);
    if (r.undeclared.count(x.tensor)) t["without_declaration"] = fits(r.undeclared.at(x.tensor));
    for (const StructureCheck& s : a.structure) {
      t["structure"].push_back({{"stat", s.stat},
                                {"value", finite_or_null(s.value)},
                                {"yardstick", finite_or_null(s.yardstick)},
                                {"ratio", finite_or_null(s.ratio)},
                                {"pass", s.pass}});
      if (!s.note.empty()) t["structure"].back()["note"] = s.note;
    }
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
    if (!a.judged) continue;  // not judged: no testcase
    cases.push_back(
        {"qkmla.audit", to_string(r.id), a.j.tensor, a.j.v.pass, 0.0, a.j.v.first_metric, why});
  }
  if (!r.nothing_judged.empty())
    cases.push_back({"qkmla.audit", to_string(r.id), "outputs", false, 0.0, "nothing_judged",
                     r.nothing_judged});
  return junit_xml("qkmla.audit", cases);
}

}  // namespace qkmla
