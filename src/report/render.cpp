// Report renderers: a table for people, Markdown for reports/ and CI pages, one self-contained
// HTML file for CI artifacts, JSON and CSV for machines. All show the same summary and rows.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "render/junit.hpp"
#include "render/rows.hpp"
#include "render/table.hpp"
#include "report/report.hpp"
#include "report/summary.hpp"

namespace qkmla {

namespace {

// conventions §1.5 features, when the case has them.
std::string sparse_note(const MlaConfig& c) {
  return (c.topk > 0 ? fmt::format(", top-k {}", c.topk) : std::string()) +
         (c.attn_sink ? ", attention sinks" : "");
}

std::string case_line(const MlaConfig& c) {
  std::string seqlens;
  for (size_t i = 0; i < c.seqlens.size(); ++i)
    seqlens += (i ? "," : "") + std::to_string(c.seqlens[i]);
  return fmt::format(
             "preset {} (H={} G={} r={} d_c={} d_r={} d_v={}), batch {}, S_q {}, seqlens [{}], "
             "scenario {}, seed {}, norm {}, {}, {}, {}, eps {:g}, softmax_scale {:.17g}",
             c.preset, c.heads, c.groups, c.latent_rank, c.d_c, c.d_r, c.d_v, c.batch, c.s_q,
             seqlens, c.scenario, c.seed, to_string(c.norm), to_string(c.rope_order),
             to_string(c.rope_style), c.causal ? "causal" : "non-causal", c.eps, c.softmax_scale) +
         sparse_note(c);
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

namespace {

const std::vector<Col> kNarrowCols = {Col::Impl,     Col::Tensor,     Col::RelL2,  Col::MaxUlp,
                                      Col::Baseline, Col::VsExplicit, Col::Verdict};
const std::vector<Col> kWideCols = {Col::Impl,  Col::Tensor,    Col::MaxAbs,   Col::MaxUlp,
                                    Col::RelL2, Col::CosDiff,   Col::Baseline, Col::VsExplicit,
                                    Col::Bound, Col::Nonfinite, Col::Seconds,  Col::Verdict,
                                    Col::Worst};

// The rows as the view asks: within each profile (rows are grouped by profile), the largest ratio
// first when `worst_first` (rows without a ratio last, in their order).
std::vector<Row> view_rows(const Report& r, const ReportView& v) {
  std::vector<Row> rows = r.rows;
  if (!v.worst_first) return rows;
  auto key = [](const Row& x) { return std::isnan(x.baseline_ratio) ? -1.0 : x.baseline_ratio; };
  for (size_t a = 0; a < rows.size();) {
    size_t b = a;
    while (b < rows.size() && rows[b].profile == rows[a].profile) ++b;
    std::stable_sort(rows.begin() + long(a), rows.begin() + long(b),
                     [&](const Row& x, const Row& y) { return key(x) > key(y); });
    a = b;
  }
  return rows;
}

const char* kColumnsNote =
    "Errors are against `ref.explicit` on the same stored bits (latent_out, which the explicit "
    "form never forms, against `ref.absorbed`). `ratio` is the gate's baseline_ratio: rel_l2 / "
    "max(yardstick of the row's design, u/16); `vs_explicit` is rel_l2 / rel_l2 of cpu.explicit "
    "in the same profile (is absorption as accurate as the explicit form?).";

std::string short_case(const MlaConfig& c) {
  std::string seqlens;
  for (size_t i = 0; i < c.seqlens.size(); ++i)
    seqlens += (i ? "," : "") + std::to_string(c.seqlens[i]);
  return fmt::format("{}, seqlens [{}], S_q {}, {}, seed {}, norm {}", c.preset, seqlens, c.s_q,
                     c.scenario, c.seed, to_string(c.norm)) +
         sparse_note(c);
}

}  // namespace

std::string render_table(const Report& r, const std::string& how, const ReportView& v) {
  std::string s = "qkmla report: " + short_case(r.cfg) + "\n" + summary_text(r) + "\n";
  s += to_text(rows_table(view_rows(r, v), v.wide ? kWideCols : kNarrowCols, true));
  for (const std::string& n : r.notes) s += "note: " + n + "\n";
  s += "case: " + case_line(r.cfg) + "\n" + how + "\n" + reference_lines(r, "  ");
  s += fmt::format("total {:.1f} s\n", r.total_seconds);
  return v.wide ? s : wrap_lines(s);  // 100 columns for a terminal
}

std::string render_markdown(const Report& r, const std::string& how, const ReportView& v) {
  std::string s = "# qkmla report\n\n```\n" + summary_text(r) + "```\n\n**Case:** " +
                  case_line(r.cfg) + "\n\n**How it was made:** " + how +
                  "\n\n**Reference (ref.explicit, Boost.Multiprecision/MPFR):**\n\n" +
                  reference_lines(r, "- ") + "\n" + kColumnsNote + "\n\n";
  const std::vector<Row> rows = view_rows(r, v);
  s += to_markdown(rows_table(rows, v.wide ? kWideCols : kNarrowCols, true, false, true),
                   "## Profile ");
  if (!r.notes.empty()) s += "\n**Notes:**\n\n";
  for (const std::string& n : r.notes) s += "- " + n + "\n";
  s += fmt::format("\nTotal wall time {:.1f} s.\n", r.total_seconds);
  return s;
}

std::string render_html(const Report& r, const std::string& how, const ReportView& v,
                        const std::vector<std::string>& svgs) {
  std::string s =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>qkmla report</title>\n<style>\nbody{font-family:sans-serif;margin:2em;max-width:"
      "1200px}\npre{background:#f6f6f6;padding:1em;overflow-x:auto}\ntable{border-collapse:"
      "collapse;margin-bottom:1em}\ntd,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}\n"
      "td.n{text-align:right;font-family:monospace}\ntd.fail{background:#fbb;font-weight:bold}\n"
      "</style>\n</head>\n<body>\n<h1>qkmla report</h1>\n<h2>Summary</h2>\n<pre>" +
      xml_escape(summary_text(r)) + "</pre>\n";
  if (!svgs.empty()) s += "<h2>Charts</h2>\n";
  for (const std::string& svg : svgs) {
    const size_t at = svg.find("<svg");  // drop the XML prolog and DOCTYPE: inline SVG
    s += "<figure>\n" + (at == std::string::npos ? svg : svg.substr(at)) + "\n</figure>\n";
  }
  s += "<h2>Rows</h2>\n<p>" + xml_escape(kColumnsNote) + "</p>\n" +
       to_html(rows_table(view_rows(r, v), v.wide ? kWideCols : kNarrowCols, true));
  if (!r.notes.empty()) s += "<h2>Notes</h2>\n<ul>\n";
  for (const std::string& n : r.notes) s += "<li>" + xml_escape(n) + "</li>\n";
  if (!r.notes.empty()) s += "</ul>\n";
  s += "<h2>How it was made</h2>\n<p>Case: " + xml_escape(case_line(r.cfg)) + "</p>\n<p>" +
       xml_escape(how) + "</p>\n<pre>" + xml_escape(reference_lines(r, "")) +
       fmt::format("</pre>\n<p>Total wall time {:.1f} s.</p>\n</body>\n</html>\n", r.total_seconds);
  return s;
}

std::string render_json(const Report& r, const std::string& how) {
  nlohmann::ordered_json j;
  j["case"] = nlohmann::json::parse(config_to_json(r.cfg));
  j["how"] = how;
  j["summary"] = summary_json(r);
  double min_agree = 1e9;
  int bits = 0;
  nlohmann::json profiles = nlohmann::json::array();
  for (const ProfileReference& p : r.references) {
    min_agree = std::min(min_agree, p.agreeing_bits);
    bits = p.bits;
    profiles.push_back({{"profile", p.profile},
                        {"bits", p.bits},
                        {"check_bits", p.check_bits},
                        {"agreeing_bits", p.agreeing_bits},
                        {"required_bits", p.required_bits},
                        {"exact_products_seconds", p.dots_seconds},
                        {"explicit_seconds", p.explicit_seconds},
                        {"absorbed_seconds", p.absorbed_seconds},
                        {"check_seconds", p.check_seconds}});
  }
  j["reference"] = {{"bits", bits},
                    {"agreeing_bits", min_agree},
                    {"ok", r.reference_ok()},
                    {"profiles", profiles}};
  j["rows"] = rows_json(r.rows);
  j["notes"] = r.notes;
  j["total_seconds"] = r.total_seconds;
  return j.dump(2) + "\n";
}

std::string render_csv(const Report& r) {
  return to_csv(
      rows_table(r.rows,
                 {Col::Impl, Col::Profile, Col::Tensor, Col::MaxAbs, Col::MaxUlp, Col::RelL2,
                  Col::CosDiff, Col::Baseline, Col::VsExplicit, Col::Nonfinite, Col::Seconds},
                 false, true));
}

}  // namespace qkmla
