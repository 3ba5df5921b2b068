// Runs a gate configuration (or one shard of it) and renders its results: JUnit XML, a Markdown
// summary for a CI job page, and JSON that `qkmla gate --merge` combines.
#pragma once
#include <string>
#include <vector>

#include "gate/gate_config.hpp"

namespace qkmla {

struct GateCase {                         // one testcase of the JUnit file
  std::string suite;                      // the entry's name
  std::string classname;                  // implementation id with profile, or "reference"
  std::string name;                       // job label (+ "/" + tensor for correct implementations)
  std::string mutant, profile, scenario;  // mutants only: for the kill matrix
  bool expect_pass = true;
  bool ok = true;       // the expectation held
  std::string metric;   // first failing metric (for mutants: what killed it)
  std::string message;  // why it failed / how it was killed
  double seconds = 0;
};

struct NotApplicable {
  std::string mutant, profile, reason;
};

struct GateResults {
  std::vector<GateCase> cases;  // raw: mutants once per case they ran on
  std::vector<NotApplicable> not_applicable;
  // The verdicts: every non-mutant case as is; each (mutant, profile) once (suite "mutants"), ok
  // when the mutant was killed on at least one case of any entry that runs it (expect = "fail").
  std::vector<GateCase> testcases() const;
  int passed() const;
  int failed() const;
};

GateResults run_gate(const GateConfig& c, int shard_k, int shard_n, int threads);

std::string junit_xml(const GateResults& r);
std::string gate_markdown(const GateResults& r, const std::string& how);
std::string results_json(const GateResults& r);
GateResults results_from_json(const std::string& path);  // InputError on a bad file
void merge_into(GateResults& into, const GateResults& part);

}  // namespace qkmla
