#include "render/rows.hpp"

#include <fmt/format.h>

#include <cmath>

namespace qkmla {

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

std::string index_str(const std::vector<int64_t>& idx) {
  std::string s;
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? "," : "") + std::to_string(idx[i]);
  return "[" + s + "]";
}

namespace {

const char* header(Col c) {
  switch (c) {
    case Col::Impl:
      return "impl";
    case Col::Profile:
      return "profile";
    case Col::Tensor:
      return "tensor";
    case Col::Label:
      return "case";
    case Col::MaxAbs:
      return "max_abs";
    case Col::MaxUlp:
      return "max_ulp";
    case Col::RelL2:
      return "rel_l2";
    case Col::CosDiff:
      return "cos_diff";
    case Col::Baseline:
      return "ratio";
    case Col::VsExplicit:
      return "vs_explicit";
    case Col::Bound:
      return "bound";
    case Col::Nonfinite:
      return "nonfin";
    case Col::Seconds:
      return "seconds";
    case Col::Worst:
      return "worst [index] value/ref";
    case Col::Verdict:
      return "verdict";
  }
  return "?";
}

bool numeric(Col c) {
  return c != Col::Impl && c != Col::Profile && c != Col::Tensor && c != Col::Label &&
         c != Col::Worst && c != Col::Verdict;
}

std::string cell(const Row& r, Col c, bool precise) {
  auto num = [precise](double v) { return precise ? fmt::format("{:.17g}", v) : qkmla::num(v); };
  switch (c) {
    case Col::Impl:
      return to_string(r.impl);
    case Col::Profile:
      return r.profile;
    case Col::Tensor:
      return r.tensor;
    case Col::Label:
      return r.label;
    case Col::MaxAbs:
      return num(r.m.max_abs);
    case Col::MaxUlp:
      return num(r.m.max_ulp);
    case Col::RelL2:
      return num(r.m.rel_l2);
    case Col::CosDiff:
      return num(r.m.cos_diff);
    case Col::Baseline:
      return num(r.baseline_ratio);
    case Col::VsExplicit:
      return num(r.vs_explicit);
    case Col::Bound:
      return num(r.m.bound_ratio);
    case Col::Nonfinite:
      return std::to_string(r.m.nonfinite_mismatch);
    case Col::Seconds:
      return fmt::format("{:.3f}", r.seconds);
    case Col::Worst:
      return r.m.worst.index.empty() ? "-"
                                     : fmt::format("{} {:.6g}/{:.6g}", index_str(r.m.worst.index),
                                                   r.m.worst.value, r.m.worst.ref);
    case Col::Verdict:
      return !r.judged ? "-" : r.v.pass ? "PASS" : "FAIL";
  }
  return "";
}

}  // namespace

Table rows_table(const std::vector<Row>& rows, const std::vector<Col>& cols, bool by_profile,
                 bool precise, bool code_ids) {
  Table t;
  for (Col c : cols) t.header.push_back(header(c)), t.numeric.push_back(numeric(c));
  std::string last;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (by_profile && (i == 0 || rows[i].profile != last))
      t.sections.emplace_back(t.rows.size(), "profile " + (last = rows[i].profile));
    std::vector<std::string> r;
    for (Col c : cols)
      r.push_back(c == Col::Impl && code_ids ? "`" + cell(rows[i], c, precise) + "`"
                                             : cell(rows[i], c, precise));
    t.rows.push_back(std::move(r));
  }
  return t;
}

nlohmann::ordered_json rows_json(const std::vector<Row>& rows) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const Row& r : rows) {
    nlohmann::ordered_json j = {
        {"impl", to_string(r.impl)}, {"profile", r.profile}, {"tensor", r.tensor}};
    if (!r.label.empty()) j["case"] = r.label;
    j["max_abs"] = finite_or_null(r.m.max_abs);
    j["max_ulp"] = finite_or_null(r.m.max_ulp);
    j["rel_l2"] = finite_or_null(r.m.rel_l2);
    j["cos_diff"] = finite_or_null(r.m.cos_diff);
    j["baseline_ratio"] = finite_or_null(r.baseline_ratio);
    j["vs_explicit"] = finite_or_null(r.vs_explicit);
    j["bound_ratio"] = finite_or_null(r.m.bound_ratio);
    j["nonfinite_mismatch"] = r.m.nonfinite_mismatch;
    j["compared"] = r.m.compared;
    j["worst"] = {{"index", r.m.worst.index},
                  {"value", finite_or_null(r.m.worst.value)},
                  {"ref", finite_or_null(r.m.worst.ref)}};
    j["seconds"] = r.seconds;
    if (r.judged) j["verdict"] = {{"pass", r.v.pass}, {"failed", r.v.failed}};
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace qkmla
