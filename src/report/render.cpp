// Report renderers: a table for people, Markdown for reports/ and CI pages, JSON and CSV for
// machines. All show the same rows.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "render/rows.hpp"
#include "render/table.hpp"
#include "report/report.hpp"

namespace qkmla {

namespace {

std::string case_line(const MlaConfig& c) {
  std::string seqlens;
  for (size_t i = 0; i < c.seqlens.size(); ++i)
    seqlens += (i ? "," : "") + std::to_string(c.seqlens[i]);
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

namespace {
const std::vector<Col> kTableCols = {Col::Impl,      Col::Tensor,  Col::MaxAbs,   Col::MaxUlp,
                                     Col::RelL2,     Col::CosDiff, Col::Baseline, Col::VsExplicit,
                                     Col::Nonfinite, Col::Seconds, Col::Worst};
}  // namespace

std::string render_table(const Report& r, const std::string& how) {
  std::string s =
      "qkmla report: " + case_line(r.cfg) + "\n" + how + "\n" + reference_lines(r, "  ");
  s += to_text(rows_table(r.rows, kTableCols, true));
  for (const std::string& n : r.notes) s += "note: " + n + "\n";
  s += fmt::format("total {:.1f} s\n", r.total_seconds);
  return s;
}

std::string render_markdown(const Report& r, const std::string& how) {
  std::string s =
      "# qkmla report\n\n**Case:** " + case_line(r.cfg) + "\n\n**How it was made:** " + how +
      "\n\n**Reference (ref.explicit, Boost.Multiprecision/MPFR):**\n\n" +
      reference_lines(r, "- ") +
      "\nErrors are against `ref.explicit` on the same stored bits (latent_out, which the explicit "
      "form never forms, against `ref.absorbed`). `baseline` is rel_l2 / max(rel_l2 of "
      "cpu.explicit in the same profile, u/16); cpu.explicit has no latent_out, so those rows "
      "have none.\n\n";
  std::vector<Row> rows = r.rows;
  for (Row& row : rows) row.impl = "`" + row.impl + "`";
  s += to_markdown(rows_table(rows, kTableCols, true), "## Profile ");
  if (!r.notes.empty()) s += "\n**Notes:**\n\n";
  for (const std::string& n : r.notes) s += "- " + n + "\n";
  s += fmt::format("\nTotal wall time {:.1f} s.\n", r.total_seconds);
  return s;
}

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
