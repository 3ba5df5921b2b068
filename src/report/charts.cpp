#include "report/charts.hpp"

#include <map>

namespace qkmla {

namespace {

Plot chart(const Report& r, const std::string& tensor) {
  Plot p;
  p.title = "rel_l2 of " + tensor + " against ref.explicit, by implementation and profile";
  p.xlabel = "profile";
  p.ylabel = "rel_l2 (log scale)";
  std::map<std::string, size_t> x;  // profile -> category
  for (const ProfileReference& ref : r.references) {
    x[ref.profile] = p.xtics.size();
    p.xtics.push_back(ref.profile);
  }
  std::map<std::string, size_t> series;
  for (const Row& row : r.rows) {
    if (row.tensor != tensor || row.impl == ref_id(Form::Absorbed) || !x.count(row.profile))
      continue;
    if (!(row.m.rel_l2 > 0)) continue;  // exact: no point on a log scale
    const std::string name = to_string(row.impl.without_profile());
    if (!series.count(name)) {
      series[name] = p.series.size();
      PlotSeries s;
      s.name = name == "cpu.explicit" ? "cpu.explicit (baseline)"
               : name == "quant"      ? "quant.fp8 (the quantization alone)"
                                      : name;
      s.dashed = name == "cpu.explicit";
      p.series.push_back(s);
    }
    p.series[series[name]].points.emplace_back(double(x[row.profile]), row.m.rel_l2);
  }
  return p;
}

}  // namespace

std::vector<Plot> report_charts(const Report& r) { return {chart(r, "out"), chart(r, "lse")}; }

std::vector<std::string> chart_paths(const std::string& path) {
  const bool svg = path.size() > 4 && path.compare(path.size() - 4, 4, ".svg") == 0;
  const std::string stem = svg ? path.substr(0, path.size() - 4) : path;
  return {stem + ".svg", stem + "-lse.svg"};
}

std::string write_report_charts(const Report& r, const std::string& path) {
  const std::vector<Plot> plots = report_charts(r);
  const std::vector<std::string> files = chart_paths(path);
  for (size_t i = 0; i < plots.size(); ++i)
    if (std::string err = write_svg(plots[i], files[i]); !err.empty()) return files[i] + ": " + err;
  return "";
}

}  // namespace qkmla
