// An audit (SPEC §4 audit.<label>): a third party's outputs judged against a golden case's
// reference by the one judge, with the conventions a kernel may use (lse base, the empty-row lse)
// converted first, and breakdowns that say where the error is.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "harness/diagnose.hpp"
#include "harness/judge.hpp"
#include "io/case_io.hpp"

namespace qkmla {

struct AuditOptions {
  std::string label = "third_party";
  std::string lse_base = "e";      // "e" or "2"
  std::string empty_lse = "-inf";  // what the outputs hold for rows with no visible key
  std::string form = "absorbed";   // the judged implementation's form: absorbed or explicit
  std::string design;              // a declared design (core/design.hpp syntax), or "" to infer
  bool diagnose = true;            // on FAIL, try the conventions of harness/diagnose.hpp
  GateRule rule;
};

struct TensorAudit {
  Judged j;
  DType delivered = DType::F64;
  double yardstick = 0;          // rel_l2 of the correct implementations of the design(s)
  std::string yardstick_design;  // the design that made it
  std::vector<std::pair<int64_t, double>> per_head, per_seq;  // (index, rel_l2)
  std::vector<Worst> worst;                                   // the five largest errors
};

struct AuditResult {
  std::string impl;  // audit.<label>
  std::string case_path;
  MlaConfig cfg;
  std::vector<TensorAudit> tensors;
  std::vector<std::string> missing;  // primary outputs not given (not judged)
  std::vector<std::string> ignored;  // given tensors the case has no reference for
  std::vector<std::string> designs;  // the design(s) the yardstick ran: declared, or inferred
  std::vector<Match> diagnosis;  // on FAIL: conventions the outputs match (harness/diagnose.hpp)
  bool pass() const;
};

// `given` are the outputs read from `outputs_path` (named in messages). InputError on a shape
// mismatch or when nothing can be judged.
AuditResult run_audit(const CaseFile& golden, const std::string& case_path,
                      std::map<std::string, Tensor> given, const std::string& outputs_path,
                      const AuditOptions& o);

}  // namespace qkmla
