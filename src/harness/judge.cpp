#include "harness/judge.hpp"

#include <cmath>

namespace qkmla {

double baseline_floor(DType delivered) {
  return unit_roundoff(delivered == DType::I32 ? DType::F64 : delivered) / 16;
}

double baseline_ratio(double rel_l2, double baseline_rel_l2, double floor) {
  if (std::isnan(baseline_rel_l2)) return std::nan("");
  return rel_l2 / std::max(baseline_rel_l2, floor);
}

int64_t effective_samples(const std::string& tensor, int64_t compared, const Tensor& y) {
  const bool rows = tensor == "out" || tensor == "latent_out" || tensor == "q_latent";
  if (!rows || y.shape.empty() || y.shape.back() <= 0) return compared;
  const int64_t w = y.shape.back();
  int64_t n =
      0;  // rows that carry a value (a row with no visible key is all zero: no error to sample)
  for (int64_t r = 0; r < y.numel() / w; ++r)
    for (int64_t j = 0; j < w; ++j)
      if (std::isfinite(y[r * w + j]) && y[r * w + j] != 0) {
        ++n;
        break;
      }
  return n;
}

Judged judge_tensor(const GateRule& rule, const JudgeInput& in) {
  Judged j;
  j.tensor = in.subject.tensor;
  j.m = compare(*in.x, *in.y, in.ulp_dtype, in.mask, in.x_lo, in.y_lo);
  if (in.bound) j.m.bound_ratio = bound_ratio(*in.x, *in.y, *in.bound, in.mask);
  j.baseline_ratio = baseline_ratio(j.m.rel_l2, in.baseline_rel_l2, in.floor);
  j.samples = effective_samples(in.subject.tensor, j.m.compared, *in.y);
  j.v = judge(rule, in.subject, j.m, j.baseline_ratio, j.samples);
  return j;
}

std::vector<Judged> judge_outputs(const GateRule& rule, const Case& k, const Truth& truth,
                                  const Outputs& o, const std::vector<std::string>& tensors,
                                  const std::map<std::string, double>& baselines,
                                  const Outputs* bound) {
  std::vector<Judged> out;
  const MlaConfig& c = k.cfg;
  for (const std::string& t : tensors) {
    const Outputs* ref = truth.of(t);
    if (!o.tensors.count(t) || !ref) continue;
    JudgeInput in;
    in.subject = {o.id, c.preset, c.scenario, to_string(c.profile), t};
    in.x = &o.tensors.at(t);
    in.x_lo = o.lo.count(t) ? &o.lo.at(t) : nullptr;
    in.y = &ref->tensors.at(t);
    in.y_lo = ref->lo.count(t) ? &ref->lo.at(t) : nullptr;
    in.mask = valid_mask(k, t);
    in.ulp_dtype = in.x->dtype;
    if (baselines.count(t)) in.baseline_rel_l2 = baselines.at(t);
    in.floor = baseline_floor(in.x->dtype);
    in.bound = bound && bound->tensors.count(t) ? &bound->tensors.at(t) : nullptr;
    out.push_back(judge_tensor(rule, in));
  }
  return out;
}

std::map<std::string, double> rel_l2_of(const Case& k, const Truth& truth, const Outputs& o,
                                        const std::vector<std::string>& tensors) {
  std::map<std::string, double> out;
  for (const std::string& t : tensors) {
    const Outputs* ref = truth.of(t);
    if (!o.tensors.count(t) || !ref) continue;
    const Tensor& x = o.tensors.at(t);
    out[t] =
        compare(x, ref->tensors.at(t), x.dtype, valid_mask(k, t),
                o.lo.count(t) ? &o.lo.at(t) : nullptr, ref->lo.count(t) ? &ref->lo.at(t) : nullptr)
            .rel_l2;
  }
  return out;
}

}  // namespace qkmla
