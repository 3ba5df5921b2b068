// Report renderers: a table for people, Markdown for reports/ and CI pages, JSON and CSV for
// machines. All show the same rows.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "report/report.hpp"

namespace qkmla {

namespace {

std::string num(double v) {
  if (std::isnan(v)) return "-";
  if (v == 0) return "0";
  return fmt::format("{:.3g}", v);
}

std::string index_str(const std::vector<int64_t>& idx) {
  std::string s;
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? "," : "") + std::to_string(idx[i]);
  return "[" + s + "]";
}

std::string case_line(const MlaConfig& c) {
  std::string seqlens;
  for (size_t i = 0; i < c.seqlens.size(); ++i) seqlens += (i ? "," : "") + std::to_string(c.seqlens[i]);
  return fmt::format(
      "preset {} (H={} G={} r={} d_c={} d_r={} d_v={}), batch {}, S_q {}, seqlens [{}], "
      "scenario {}, seed {}, norm {}, {}, {}, {}, eps {:g}, softmax_scale {:.17g}",
      c.preset, c.heads, c.groups, c.latent_rank, c.d_c, c.d_r, c.d_v, c.batch, c.s_q, seqlens,
      c.scenario, c.seed, to_string(c.norm), to_string(c.rope_order), to_string(c.rope_style),
      c.causal ? "causal" : "non-causal", c.eps, c.softmax_scale);
}

std::string reference_lines(const Report& r, const char* bullet) {
  std::string s;
  for (const ProfileReference& p : r.references)
    s += fmt::format(
        "{}reference for {}: {} bits, agrees with its {}-bit run on {:.1f} bits (required {:.0f}); "
        "exact products {:.2f} s, ref.explicit {:.2f} s, ref.absorbed {:.2f} s, check {:.2f} s\n",
        bullet, p.profile, p.bits, p.check_bits, p.agreeing_bits, p.required_bits, p.dots_seconds,
        p.explicit_seconds, p.absorbed_seconds, p.check_seconds);
  return s;
}

}  // namespace

std::string render_table(const Report& r, const std::string& how) {
  std::string s = "qkmla report: " + case_line(r.cfg) + "\n" + how + "\n" + reference_lines(r, "  ");
  s += fmt::format("{:<36} {:<10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>6} {:>8}  {}\n", "impl", "tensor",
                   "max_abs", "max_ulp", "rel_l2", "cos_diff", "baseline", "nonfin", "seconds", "worst [index] value/ref");
  std::string last;
  for (const ReportRow& row : r.rows) {
    if (row.profile != last) s += fmt::format("-- profile {} --\n", last = row.profile);
    s += fmt::format("{:<36} {:<10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>6} {:>8.3f}  {} {:.6g}/{:.6g}\n", row.impl,
                     row.tensor, num(row.m.max_abs), num(row.m.max_ulp), num(row.m.rel_l2), num(row.m.cos_diff),
                     num(row.baseline_ratio), row.m.nonfinite_mismatch, row.seconds,
                     index_str(row.m.worst.index), row.m.worst.value, row.m.worst.ref);
  }
  for (const std::string& n : r.notes) s += "note: " + n + "\n";
  s += fmt::format("total {:.1f} s\n", r.total_seconds);
  return s;
}

std::string render_markdown(const Report& r, const std::string& how) {
  std::string s = "# qkmla report\n\n**Case:** " + case_line(r.cfg) + "\n\n**How it was made:** " + how +
                  "\n\n**Reference (ref.explicit, Boost.Multiprecision/MPFR):**\n\n" + reference_lines(r, "- ") +
                  "\nErrors are against `ref.explicit` on the same stored bits (latent_out, which the explicit "
                  "form never forms, against `ref.absorbed`). `baseline` is rel_l2 / max(rel_l2 of "
                  "cpu.explicit in the same profile, u/16); cpu.explicit has no latent_out, so those rows "
                  "have none.\n";
  std::string last;
  for (const ReportRow& row : r.rows) {
    if (row.profile != last) {
      s += fmt::format("\n## Profile {}\n\n| impl | tensor | max_abs | max_ulp | rel_l2 | cos_diff | baseline | nonfinite | seconds | worst [index] value / ref |\n|---|---|---|---|---|---|---|---|---|---|\n", last = row.profile);
    }
    s += fmt::format("| `{}` | {} | {} | {} | {} | {} | {} | {} | {:.3f} | {} {:.6g} / {:.6g} |\n", row.impl, row.tensor,
                     num(row.m.max_abs), num(row.m.max_ulp), num(row.m.rel_l2), num(row.m.cos_diff),
                     num(row.baseline_ratio), row.m.nonfinite_mismatch, row.seconds,
                     index_str(row.m.worst.index), row.m.worst.value, row.m.worst.ref);
  }
  if (!r.notes.empty()) s += "\n**Notes:**\n\n";
  for (const std::string& n : r.notes) s += "- " + n + "\n";
  s += fmt::format("\nTotal wall time {:.1f} s.\n", r.total_seconds);
  return s;
}

namespace {
nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
}  // namespace

std::string render_json(const Report& r, const std::string& how) {
  nlohmann::ordered_json j;
  j["case"] = nlohmann::json::parse(config_to_json(r.cfg));
  j["how"] = how;
  double min_agree = 1e9;
  int bits = 0;
  nlohmann::json profiles = nlohmann::json::array();
  for (const ProfileReference& p : r.references) {
    min_agree = std::min(min_agree, p.agreeing_bits);
    bits = p.bits;
    profiles.push_back({{"profile", p.profile}, {"bits", p.bits}, {"check_bits", p.check_bits},
                        {"agreeing_bits", p.agreeing_bits}, {"required_bits", p.required_bits},
                        {"exact_products_seconds", p.dots_seconds}, {"explicit_seconds", p.explicit_seconds},
                        {"absorbed_seconds", p.absorbed_seconds}, {"check_seconds", p.check_seconds}});
  }
  j["reference"] = {{"bits", bits}, {"agreeing_bits", min_agree}, {"ok", r.reference_ok()}, {"profiles", profiles}};
  nlohmann::json rows = nlohmann::json::array();
  for (const ReportRow& row : r.rows)
    rows.push_back({{"impl", row.impl}, {"profile", row.profile}, {"tensor", row.tensor},
                    {"max_abs", finite_or_null(row.m.max_abs)}, {"max_ulp", finite_or_null(row.m.max_ulp)},
                    {"rel_l2", finite_or_null(row.m.rel_l2)}, {"cos_diff", finite_or_null(row.m.cos_diff)},
                    {"baseline_ratio", finite_or_null(row.baseline_ratio)},
                    {"nonfinite_mismatch", row.m.nonfinite_mismatch}, {"compared", row.m.compared},
                    {"worst", {{"index", row.m.worst.index}, {"value", finite_or_null(row.m.worst.value)},
                               {"ref", finite_or_null(row.m.worst.ref)}}},
                    {"seconds", row.seconds}});
  j["rows"] = rows;
  j["notes"] = r.notes;
  j["total_seconds"] = r.total_seconds;
  return j.dump(2) + "\n";
}

std::string render_csv(const Report& r) {
  std::string s = "impl,profile,tensor,max_abs,max_ulp,rel_l2,cos_diff,baseline_ratio,nonfinite_mismatch,seconds\n";
  for (const ReportRow& row : r.rows)
    s += fmt::format("{},{},{},{:.17g},{:.17g},{:.17g},{:.17g},{:.17g},{},{:.6f}\n", row.impl, row.profile, row.tensor,
                     row.m.max_abs, row.m.max_ulp, row.m.rel_l2, row.m.cos_diff, row.baseline_ratio,
                     row.m.nonfinite_mismatch, row.seconds);
  return s;
}

}  // namespace qkmla
