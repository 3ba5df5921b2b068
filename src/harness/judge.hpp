// The judge, written once (conventions §5, §6): metrics of an output against its truth, the
// baseline ratio with its floor, the budgets, and the verdict. report, gate and audit all call it.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "harness/budgets.hpp"
#include "harness/truth.hpp"

namespace qkmla {

struct Judged {
  std::string tensor;
  Metrics m;
  double baseline_ratio = 0;  // NaN when there is no baseline for the tensor
  int64_t samples = 0;        // independent samples behind rel_l2 (effective_samples)
  Verdict v;
};

// How many roughly independent errors a tensor's rel_l2 aggregates: its non-zero rows for out,
// latent_out and q_latent (one logit error moves a whole row), its compared values otherwise.
int64_t effective_samples(const std::string& tensor, int64_t compared, const Tensor& y);

// The floor of the baseline ratio's denominator (conventions §5): u/16 of the type the tensor is
// computed and delivered in (fp32 for lse and alpha_k in every low-precision profile), so that it
// only stops a zero yardstick from making every ratio infinite and stays far below real errors.
double baseline_floor(DType delivered);
// rel_l2 / max(baseline rel_l2, floor); NaN when the baseline is NaN (none).
double baseline_ratio(double rel_l2, double baseline_rel_l2, double floor);

// One tensor x against its truth y (with y's double-double remainder y_lo, if any).
struct JudgeInput {
  Subject subject;               // impl, preset, scenario, profile, tensor: what budgets match on
  const Tensor* x = nullptr;     // the judged values
  const Tensor* x_lo = nullptr;  // their double-double remainder (multiprecision results only)
  const Tensor* y = nullptr;     // the truth
  const Tensor* y_lo = nullptr;
  std::vector<bool> mask;        // valid positions (empty = all)
  DType ulp_dtype = DType::F64;  // the format max_ulp counts in
  double baseline_rel_l2 = std::numeric_limits<double>::quiet_NaN();
  double floor = 0;
  const Tensor* bound = nullptr;  // proven per-element forward error bound, if any
};
Judged judge_tensor(const GateRule& rule, const JudgeInput& in);

// Every tensor of `o` among `tensors` that the truth has, judged against it; `baselines` maps a
// tensor to the baseline's rel_l2; `bound` (optional) holds the implementation's proven bounds.
std::vector<Judged> judge_outputs(const GateRule& rule, const Case& k, const Truth& truth,
                                  const Outputs& o, const std::vector<std::string>& tensors,
                                  const std::map<std::string, double>& baselines,
                                  const Outputs* bound = nullptr);

// rel_l2 of each of `o`'s tensors against the truth (what a baseline contributes).
std::map<std::string, double> rel_l2_of(const Case& k, const Truth& truth, const Outputs& o,
                                        const std::vector<std::string>& tensors);

}  // namespace qkmla
