#include "render/converge_view.hpp"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "render/plot.hpp"
#include "render/table.hpp"

namespace qkmla {

std::string converge_text(const ConvergeResult& r, const std::string& how, bool md) {
  const MlaConfig& b = r.base;
  std::string text = fmt::format(
      "{}qkmla converge: preset {}, seqlens [{}], S_q {}, {} norm, profile {} inputs, seed {}; "
      "reference: "
      "ref.explicit at {} bits\n{}{}\n\n",
      md ? "# " : "", b.preset, fmt::join(b.seqlens, ","), b.s_q, to_string(b.norm),
      to_string(b.profile), b.seed, r.reference_bits, md ? "\nMade by " : "", how);
  Table t;
  t.header = {"series", "scenario"};
  t.numeric = {false, false};
  for (int p : r.bits) t.header.push_back(std::to_string(p)), t.numeric.push_back(true);
  t.header.insert(t.header.end(), {"slope", "last-4 slope"});
  t.numeric.insert(t.numeric.end(), {true, true});
  for (const ConvergeSeries& s : r.series) {
    std::vector<std::string> row = {md ? "`" + s.impl + "`" : s.impl, s.scenario};
    for (const auto& pt : s.points) row.push_back(fmt::format("2^{:.1f}", std::log2(pt.second)));
    row.push_back(fmt::format("{:.3f}", s.slope));
    row.push_back(fmt::format("{:.3f}", s.tail_slope));
    t.rows.push_back(std::move(row));
  }
  text += md ? to_markdown(t) : to_text(t);
  return text +
         "\nEntries are the worst normwise relative difference over rows of out and lse (lse "
         "relative to max(|lse|, 1)).\n"
         "Equivalent forms: slope about -1 (one bit of agreement per bit of precision); a mutant "
         "plateaus (slope near 0).\n";
}

std::string converge_json(const ConvergeResult& r, const std::string& how) {
  nlohmann::ordered_json j;
  j["case"] = nlohmann::json::parse(config_to_json(r.base));
  j["reference_bits"] = r.reference_bits;
  j["how"] = how;
  for (const ConvergeSeries& s : r.series) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& [p, diff] : s.points) pts.push_back({p, diff});
    j["series"].push_back({{"impl", s.impl},
                           {"scenario", s.scenario},
                           {"points", pts},
                           {"slope", s.slope},
                           {"tail_slope", s.tail_slope}});
  }
  return j.dump(1) + "\n";
}

std::string converge_svg(const ConvergeResult& r, const std::string& path) {
  Plot p;
  p.title = fmt::format("qkmla converge: {} ({} norm), reference {} bits", r.base.preset,
                        to_string(r.base.norm), r.reference_bits);
  p.xlabel = "working precision p (bits)";
  p.ylabel = "relative difference to the reference";
  for (const ConvergeSeries& s : r.series) {
    PlotSeries ps{s.impl + (s.scenario == r.base.scenario ? "" : " (" + s.scenario + ")") +
                      fmt::format(", slope {:.2f}", s.slope),
                  {},
                  false};
    for (const auto& [bits, diff] : s.points) ps.points.emplace_back(bits, diff);
    ps.dashed = s.mutant;
    p.series.push_back(std::move(ps));
  }
  return write_svg(p, path);
}

}  // namespace qkmla
