// How a convergence study is shown: a table (text or Markdown), JSON, an SVG chart.
#pragma once
#include <string>

#include "harness/converge.hpp"

namespace qkmla {

std::string converge_text(const ConvergeResult& r, const std::string& how, bool markdown);
std::string converge_json(const ConvergeResult& r, const std::string& how);
// "" or what went wrong.
std::string converge_svg(const ConvergeResult& r, const std::string& path);

}  // namespace qkmla
