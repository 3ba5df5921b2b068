#include "render/junit.hpp"

#include <fmt/format.h>

#include <map>

namespace qkmla {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&apos;";
        break;
      default:
        o += ch;
    }
  }
  return o;
}

std::string junit_xml(const std::string& name, const std::vector<JUnitCase>& cases) {
  std::map<std::string, std::vector<const JUnitCase*>> suites;
  int failures = 0;
  for (const JUnitCase& c : cases) suites[c.suite].push_back(&c), failures += !c.ok;
  std::string s = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"{}\" tests=\"{}\" "
      "failures=\"{}\">\n",
      xml_escape(name), cases.size(), failures);
  for (const auto& [suite, list] : suites) {
    int f = 0;
    double time = 0;
    for (const JUnitCase* c : list) f += !c->ok, time += c->seconds;
    s += fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" time=\"{:.3f}\">\n",
                     xml_escape(suite), list.size(), f, time);
    for (const JUnitCase* c : list) {
      s += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\"",
                       xml_escape(c->classname), xml_escape(c->name), c->seconds);
      if (c->ok)
        s += "/>\n";
      else
        s += fmt::format(">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                         xml_escape(c->failure_type), xml_escape(c->message));
    }
    s += "  </testsuite>\n";
  }
  return s + "</testsuites>\n";
}

}  // namespace qkmla
