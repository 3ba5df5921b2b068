#include "render/table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "render/junit.hpp"

namespace qkmla {

std::string num(double v) {
  if (std::isnan(v)) return "-";
  if (v == 0) return "0";
  return fmt::format("{:.3g}", v);
}

namespace {

std::string section_at(const Table& t, size_t row) {
  for (const auto& [at, title] : t.sections)
    if (at == row) return title;
  return "";
}

std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c);
  return o;
}

std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

}  // namespace

std::string to_text(const Table& t) {
  std::vector<size_t> w(t.header.size(), 0);
  for (size_t c = 0; c < t.header.size(); ++c) w[c] = t.header[c].size();
  for (const auto& row : t.rows)
    for (size_t c = 0; c < row.size() && c < w.size(); ++c) w[c] = std::max(w[c], row[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (size_t c = 0; c < w.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      const bool right = c < t.numeric.size() && t.numeric[c];
      const bool last = c + 1 == w.size();
      s += (c ? "  " : "") + (right  ? fmt::format("{:>{}}", cell, w[c])
                              : last ? cell
                                     : fmt::format("{:<{}}", cell, w[c]));
    }
    return s + "\n";
  };
  std::string s = line(t.header);
  for (size_t r = 0; r < t.rows.size(); ++r) {
    const std::string title = section_at(t, r);
    if (!title.empty()) s += "-- " + title + " --\n";
    s += line(t.rows[r]);
  }
  return s;
}

std::string to_markdown(const Table& t, const std::string& section_prefix) {
  auto head = [&] {
    std::string s = "|";
    for (const std::string& h : t.header) s += " " + md_cell(h) + " |";
    s += "\n|";
    for (size_t c = 0; c < t.header.size(); ++c)
      s += c < t.numeric.size() && t.numeric[c] ? "---:|" : "---|";
    return s + "\n";
  };
  std::string s = t.sections.empty() || t.sections.front().first != 0 ? head() : "";
  for (size_t r = 0; r < t.rows.size(); ++r) {
    const std::string title = section_at(t, r);
    if (!title.empty()) s += (r ? "\n" : "") + section_prefix + title + "\n\n" + head();
    s += "|";
    for (const std::string& cell : t.rows[r]) s += " " + md_cell(cell) + " |";
    s += "\n";
  }
  return s;
}

std::string to_csv(const Table& t) {
  auto line = [](const std::vector<std::string>& cells) {
    std::string s;
    for (size_t c = 0; c < cells.size(); ++c) s += (c ? "," : "") + csv_cell(cells[c]);
    return s + "\n";
  };
  std::string s = line(t.header);
  for (const auto& row : t.rows) s += line(row);
  return s;
}

std::string to_html(const Table& t) {
  auto head = [&] {
    std::string s = "<table>\n<tr>";
    for (const std::string& h : t.header) s += "<th>" + xml_escape(h) + "</th>";
    return s + "</tr>\n";
  };
  std::string s = t.sections.empty() || t.sections.front().first != 0 ? head() : "";
  for (size_t r = 0; r < t.rows.size(); ++r) {
    const std::string title = section_at(t, r);
    if (!title.empty())
      s += std::string(r ? "</table>\n" : "") + "<h3>" + xml_escape(title) + "</h3>\n" + head();
    s += "<tr>";
    for (size_t c = 0; c < t.rows[r].size(); ++c) {
      const std::string& cell = t.rows[r][c];
      const bool right = c < t.numeric.size() && t.numeric[c];
      s += std::string("<td") +
           (cell == "FAIL" ? " class=\"fail\""
            : right        ? " class=\"n\""
                           : "") +
           ">" + xml_escape(cell) + "</td>";
    }
    s += "</tr>\n";
  }
  return s + "</table>\n";
}

std::string wrap_lines(const std::string& text, size_t width) {
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    const std::string indent(std::min(line.find_first_not_of(' '), line.size()) + 2, ' ');
    while (line.size() > width) {
      size_t cut = line.rfind(' ', width);
      if (cut == std::string::npos || cut < indent.size()) cut = line.find(' ', width);
      const size_t rest = cut == std::string::npos ? cut : line.find_first_not_of(' ', cut);
      if (rest == std::string::npos) break;  // one word too long, or trailing spaces: kept
      out += line.substr(0, cut) + "\n";
      line = indent + line.substr(rest);
    }
    out += line;
    if (end < text.size()) out += "\n";
    at = end + 1;
  }
  return out;
}

}  // namespace qkmla
