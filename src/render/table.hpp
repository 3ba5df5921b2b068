// The printers every command uses: one neutral table (header, rows of cells, optional sections)
// rendered as aligned text for people, Markdown for CI pages and reports/, HTML for CI artifacts,
// CSV for machines.
#pragma once
#include <string>
#include <vector>

namespace qkmla {

struct Table {
  std::vector<std::string> header;
  std::vector<bool> numeric;  // per column: right-aligned in text (default: left)
  std::vector<std::vector<std::string>> rows;
  // Section titles before the row of the given index (e.g. one per profile).
  std::vector<std::pair<size_t, std::string>> sections;
};

std::string to_text(const Table& t);
std::string to_markdown(const Table& t, const std::string& section_prefix = "## ");
std::string to_csv(const Table& t);
// HTML tables (one per section, each after an <h3> title), cells escaped (xml_escape, valid in
// HTML5); FAIL cells marked with class "fail".
std::string to_html(const Table& t);

// Numbers for people: 3 significant digits, "-" for NaN, "0" for zero.
std::string num(double v);

// Every line longer than `width` broken at spaces, its continuation lines indented two columns
// past the line's own indent (terminal output: 100 columns unless the user asks for --wide). A
// word longer than the width stays whole.
std::string wrap_lines(const std::string& text, size_t width = 100);

}  // namespace qkmla
