// The report's pictures: rel_l2 of `out` and of `lse` for every implementation across the
// profiles (log scale), cpu.explicit (the same-precision baseline) dashed. ref.absorbed is left
// out: at ~1e-33 it would flatten every other line (the summary gives its equivalence bits).
#pragma once
#include <string>
#include <vector>

#include "render/plot.hpp"
#include "report/report.hpp"

namespace qkmla {

std::vector<Plot> report_charts(const Report& r);  // out, then lse

// The chart files for `path` (FILE.svg): FILE.svg for out, FILE-lse.svg for lse.
std::vector<std::string> chart_paths(const std::string& path);

// Draws the charts to chart_paths(path); returns "" or what went wrong.
std::string write_report_charts(const Report& r, const std::string& path);

}  // namespace qkmla
