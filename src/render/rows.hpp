// A neutral list of measured (and possibly judged) rows, and its printers: the same rows become a
// text or Markdown table, CSV, or JSON. report, gate and audit all print through these.
#pragma once
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/budgets.hpp"
#include "render/table.hpp"

namespace qkmla {

struct Row {
  ImplId impl;
  std::string profile, tensor;
  std::string label;  // the case (gate), or empty
  Metrics m;
  double baseline_ratio =
      std::numeric_limits<double>::quiet_NaN();  // against the design's yardstick
  double vs_explicit =
      std::numeric_limits<double>::quiet_NaN();  // rel_l2 / cpu.explicit's (report)
  double seconds = 0;
  bool judged = false;  // v holds a verdict
  Verdict v;
};

enum class Col {
  Impl,
  Profile,
  Tensor,
  Label,
  MaxAbs,
  MaxUlp,
  RelL2,
  CosDiff,
  Baseline,
  VsExplicit,
  Bound,
  Nonfinite,
  Seconds,
  Worst,
  Verdict
};

// Rows as a table with the given columns; with `by_profile`, a section per run of equal profiles.
// `precise`: numbers with 17 significant digits (CSV for machines) instead of 3; `code_ids`:
// implementation ids as Markdown code.
Table rows_table(const std::vector<Row>& rows, const std::vector<Col>& cols, bool by_profile,
                 bool precise = false, bool code_ids = false);
// Every field of every row (non-finite numbers as null).
nlohmann::ordered_json rows_json(const std::vector<Row>& rows);
nlohmann::json finite_or_null(double v);
std::string index_str(const std::vector<int64_t>& idx);  // "[0,1,2]"

}  // namespace qkmla
