// The gate's results as a CI reads them: JUnit XML, a Markdown summary for the job page, and the
// JSON that `qkmla gate --merge` combines (declared in gate/run_gate.hpp).
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "gate/run_gate.hpp"
#include "io/safetensors.hpp"
#include "render/junit.hpp"
#include "render/table.hpp"

namespace qkmla {

std::string junit_xml(const GateResults& r) {
  std::vector<JUnitCase> cases;
  for (const GateCase& c : r.testcases())
    cases.push_back({c.suite, c.classname, c.name, c.ok, c.seconds,
                     c.metric.empty() ? "survived" : c.metric, c.message});
  return qkmla::junit_xml("qkmla.gate", cases);
}

std::string gate_markdown(const GateResults& r, const std::string& how) {
  std::string s = "# qkmla gate\n\n" + how + "\n\n";
  const std::vector<GateCase> all = r.testcases();
  std::map<std::string, std::pair<int, int>> by_class;  // classname -> (passed, failed)
  for (const GateCase& c : all)
    (c.ok ? by_class[c.classname].first : by_class[c.classname].second)++;
  Table t{{"implementation", "passed", "failed"}, {false, true, true}, {}, {}};
  for (const auto& [cls, pf] : by_class)
    t.rows.push_back({"`" + cls + "`", std::to_string(pf.first), std::to_string(pf.second)});
  s += to_markdown(t);
  if (r.failed()) {
    Table f{{"implementation", "case", "why"}, {}, {}, {}};
    for (const GateCase& c : all)
      if (!c.ok) f.rows.push_back({"`" + c.classname + "`", c.name, c.message});
    s += "\n## Failures\n\n" + to_markdown(f);
  }
  return s + fmt::format("\n{} passed, {} failed\n", r.passed(), r.failed());
}

std::string results_json(const GateResults& r) {
  nlohmann::ordered_json j;
  j["cases"] = nlohmann::json::array();
  for (const GateCase& c : r.cases)
    j["cases"].push_back({{"suite", c.suite},
                          {"classname", c.classname},
                          {"name", c.name},
                          {"mutant", c.mutant},
                          {"profile", c.profile},
                          {"scenario", c.scenario},
                          {"expect_pass", c.expect_pass},
                          {"ok", c.ok},
                          {"metric", c.metric},
                          {"message", c.message},
                          {"seconds", c.seconds}});
  j["not_applicable"] = nlohmann::json::array();
  for (const NotApplicable& n : r.not_applicable)
    j["not_applicable"].push_back(
        {{"mutant", n.mutant}, {"profile", n.profile}, {"reason", n.reason}});
  j["passed"] = r.passed();
  j["failed"] = r.failed();
  return j.dump(1) + "\n";
}

GateResults results_from_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "file", "cannot be opened");
  GateResults r;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& c : j.at("cases"))
      r.cases.push_back({c.at("suite"), c.at("classname"), c.at("name"), c.at("mutant"),
                         c.at("profile"), c.at("scenario"), c.at("expect_pass"), c.at("ok"),
                         c.at("metric"), c.at("message"), c.at("seconds")});
    for (const auto& n : j.at("not_applicable"))
      r.not_applicable.push_back({n.at("mutant"), n.at("profile"), n.at("reason")});
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path, "gate results",
                     std::string("not a qkmla gate --format json file: ") + e.what());
  }
  return r;
}

void merge_into(GateResults& into, const GateResults& part) {
  into.cases.insert(into.cases.end(), part.cases.begin(), part.cases.end());
  into.not_applicable.insert(into.not_applicable.end(), part.not_applicable.begin(),
                             part.not_applicable.end());
}

}  // namespace qkmla
