// An audit (SPEC §4 audit.<label>): a third party's outputs judged against a golden case's
// reference by the one judge, with the conventions a kernel may use (lse base, the empty-row lse)
// converted first, and breakdowns that say where the error is.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "harness/judge.hpp"
#include "io/case_io.hpp"

namespace qkmla {

struct AuditOptions {
  std::string label = "third_party";
  std::string lse_base = "e";      // "e" or "2"
  std::string empty_lse = "-inf";  // what the outputs hold for rows with no visible key
  GateRule rule;
};

struct TensorAudit {
  Judged j;
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
  bool pass() const;
};

// `given` are the outputs read from `outputs_path` (named in messages). InputError on a shape
// mismatch or when nothing can be judged.
AuditResult run_audit(const CaseFile& golden, const std::string& case_path,
                      std::map<std::string, Tensor> given, const std::string& outputs_path,
                      const AuditOptions& o);

}  // namespace qkmla
