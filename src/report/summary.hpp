// The report's summary: what a person came to ask, per profile, before any table. Is the reference
// accurate, is the absorbed form exactly the explicit one in exact arithmetic (ref.absorbed vs
// ref.explicit), is it as accurate as the explicit form in this precision, which implementation is
// worst, and does everything pass the gate rule (the same verdicts the rows carry)?
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "report/report.hpp"

namespace qkmla {

struct WorstRow {
  std::string tensor;
  ImplId impl;       // the row's implementation
  double ratio = 0;  // its baseline_ratio (the largest of the profile for that tensor)
};

struct ProfileSummary {
  std::string profile;
  double agreeing_bits = 0, required_bits = 0;  // the reference against its check run
  double equivalence_bits = 0;  // -log2 of ref.absorbed's largest rel_l2 vs ref.explicit (inf: 0)
  std::vector<WorstRow> worst;  // per tensor with a ratio, in row order
  int judged = 0, passed = 0;   // implementations (all of an implementation's rows must pass)
  std::vector<std::string> failed;            // implementations with a failing row
  double absorbed_out = 0, explicit_out = 0;  // rel_l2 of out: cpu.absorbed, cpu.explicit
  std::string conclusion;                     // one line a person can quote
};

std::vector<ProfileSummary> summarize(const Report& r);
// "GPU: ..." (kernels run and matched their model, or why no kernel ran).
std::string gpu_status(const Report& r);

// Lines of at most 100 columns.
std::string summary_text(const Report& r);
nlohmann::ordered_json summary_json(const Report& r);

}  // namespace qkmla
