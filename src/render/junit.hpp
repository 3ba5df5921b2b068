// JUnit XML, the one writer (gate and audit): one testcase per verdict.
#pragma once
#include <string>
#include <vector>

namespace qkmla {

struct JUnitCase {
  std::string suite, classname, name;
  bool ok = true;
  double seconds = 0;
  std::string failure_type;  // the failing metric (or "survived")
  std::string message;       // why
};

std::string junit_xml(const std::string& name, const std::vector<JUnitCase>& cases);
std::string xml_escape(const std::string& s);

}  // namespace qkmla
