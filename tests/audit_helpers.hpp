// Helpers of the audit.* tests: golden cases, correct runs of a design, audits and their
// statistics (conventions §5 "Judging").
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "harness/audit.hpp"
#include "harness/golden.hpp"
#include "helpers.hpp"
#include "impl/cpu_impls.hpp"
#include "metrics/compare.hpp"

namespace qkmla::test {

inline CaseFile golden_of(const MlaConfig& c) {
  Golden g = make_golden(generate_case(c), Level::Module, 113, "test");
  REQUIRE(g.truth.ok());
  return {g.k, g.refs, g.metadata};
}

// The outputs of one correct absorbed implementation of design `d` (forward order).
inline std::map<std::string, Tensor> run_design(const CaseFile& cf, const Design& d) {
  Outputs o = impl::cpu_absorbed(cf.k, {{Variant::Default, {}, d}})[0];
  return {{"out", o.tensors.at("out")}, {"lse", o.tensors.at("lse")}};
}

// The same values in another container dtype (exact: they are representable there).
inline Tensor in_container(Tensor t, DType d) {
  for (double x : t.data) REQUIRE((std::isnan(x) || round_to(d, x) == x));
  t.dtype = d;
  return t;
}

// t's values rounded to format f and delivered in it (a kernel writing that format).
inline void written_as(Tensor& t, DType f) {
  for (double& x : t.data) x = round_to(f, x);
  t.dtype = f;
}

inline AuditResult audit(const CaseFile& cf, std::map<std::string, Tensor> outs,
                         const std::string& design = "") {
  AuditOptions o;
  o.rule = default_rule();
  o.design = design;
  o.diagnose = false;
  return run_audit(cf, "case", std::move(outs), "outputs", o);
}

inline const TensorAudit& tensor(const AuditResult& r, const std::string& t) {
  for (const TensorAudit& a : r.tensors)
    if (a.j.tensor == t) return a;
  FAIL("no tensor " << t);
  return r.tensors.front();
}

// The largest structure ratio of tensor t, each statistic's ratio printed.
inline double worst_structure_ratio(const AuditResult& r, const std::string& t) {
  double worst = 0;
  for (const StructureCheck& s : tensor(r, t).structure) {
    MESSAGE(s.stat << " " << s.ratio << "x");
    worst = std::max(worst, s.ratio);
  }
  return worst;
}

}  // namespace qkmla::test
