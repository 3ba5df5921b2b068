// Charts, drawn by the project's plotting tool (gnuplot, SVG terminal). Names are shown literally
// (no enhanced-text markup: alpha_q_folded stays alpha_q_folded) and the legend sits below the
// plot so that it never takes the plot's width.
#pragma once
#include <string>
#include <vector>

namespace qkmla {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); y <= 0 is drawn at the axis floor
  bool dashed = false;                            // e.g. a baseline
};

struct Plot {
  std::string title, xlabel, ylabel;
  bool log_x = false, log_y = true;
  int width = 900, height = 600;
  std::vector<PlotSeries> series;
  std::vector<std::string> xtics;  // categorical x axis: point i's x is i, labelled xtics[i]
};

// Writes `svg_path`; returns "" or what went wrong (gnuplot missing or failing).
std::string write_svg(const Plot& p, const std::string& svg_path);

}  // namespace qkmla
