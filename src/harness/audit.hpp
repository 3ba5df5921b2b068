// An audit (conventions §4 audit.<label>): a third party's outputs judged against a golden case's
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
  // the judged implementation's form: absorbed or explicit; "" (undeclared): both where affordable
  // (harness/yardstick.hpp audit_forms)
  std::string form;
  std::string design;  // a declared design (core/design.hpp syntax), or "" to infer
  // > 0: the implementation attends over KV chunks of this many tokens merged by their lse (a
  // chunked prefill): the yardstick samples that chunking instead of 2-4 splits (yardstick.hpp)
  int kv_chunk = 0;
  bool diagnose = true;  // on FAIL, try the conventions of harness/diagnose.hpp
  // undeclared, on FAIL: judge the outputs once more as attention at the softmax scale stored in
  // the model dtype (harness/stored_scale.hpp), against that problem's own truth
  bool stored_scale = true;
  GateRule rule;
};

// How well one family of legitimate designs explains a tensor: its yardstick (the RMS rel_l2 of its
// correct implementations on the case, its member that explains the tensor best) and the ratio.
struct FamilyFit {
  std::string family;
  std::string design;      // the member (core/design.hpp syntax)
  double yardstick = 0;    // rel_l2
  double ratio = 0;        // judged rel_l2 / max(yardstick, floor)
  bool consistent = true;  // ratio within the rule's k (with the small-sample allowance)
};

// One structure statistic (metrics/structure.hpp) against the largest a correct implementation of
// a candidate design makes on the case.
struct StructureCheck {
  std::string stat;
  double value = 0, yardstick = 0, ratio = 0;
  bool pass = true;
  std::string note;  // what a reader needs beyond the numbers (ill_rows: how many, why)
};

struct TensorAudit {
  Judged j;
  DType delivered = DType::F64;
  bool judged = true;               // false: no yardstick for it (printed "not judged", never PASS)
  double yardstick = 0;             // rel_l2 of the least accurate consistent design
  std::string yardstick_design;     // that design
  std::vector<FamilyFit> families;  // tightest first (primary outputs; undeclared designs)
  std::vector<StructureCheck> structure;
  std::vector<std::pair<int64_t, double>> per_head, per_seq;  // (index, rel_l2)
  std::vector<Worst> worst;                                   // the five largest errors
};

struct AuditResult {
  ImplId id;  // audit.<label>
  std::string case_path;
  MlaConfig cfg;
  std::vector<TensorAudit> tensors;
  std::vector<std::string> missing;  // primary outputs not given (not judged)
  std::vector<std::string> ignored;  // given tensors the case has no reference for
  std::vector<std::string> designs;  // the design(s) the yardstick ran: declared, or inferred
  std::string declared;              // the declared design ("" when inferred)
  std::vector<std::string> forms;    // the forms the candidates took (absorbed, explicit)
  std::string forms_note;            // why a form was left out, where one was
  int kv_chunk = 0;                  // the declared KV chunk length (0: none)
  // With a declared design that failed: how the undeclared candidates fit each failed tensor.
  std::map<std::string, std::vector<FamilyFit>> undeclared;
  std::string nothing_judged;    // non-empty: no primary output was judged (never a PASS)
  std::vector<Match> diagnosis;  // on FAIL: conventions the outputs match (harness/diagnose.hpp)
  // Non-empty: the verdict is that of the case at the stored softmax scale (harness/stored_scale),
  // which the outputs pass, and this says so (the scale, and how the case's own scale failed).
  std::string stored_scale;
  bool pass() const;
};

// `given` are the outputs read from `outputs_path` (named in messages). InputError on a shape
// mismatch or when no given tensor has a reference in the case; a file whose tensors have
// references but hold no primary output (out, lse; latent_out at kernel level) is judged "nothing
// judged", which fails.
AuditResult run_audit(const CaseFile& golden, const std::string& case_path,
                      std::map<std::string, Tensor> given, const std::string& outputs_path,
                      const AuditOptions& o);

}  // namespace qkmla
