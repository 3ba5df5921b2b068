#include "harness/audit.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "harness/yardstick.hpp"
#include "io/safetensors.hpp"

namespace qkmla {

bool AuditResult::pass() const {
  for (const TensorAudit& a : tensors)
    if (!a.j.v.pass) return false;
  return true;
}

namespace {

// rel_l2 over the elements whose index along `dim` equals each value.
std::vector<std::pair<int64_t, double>> breakdown(const Tensor& x, const Tensor& y, int dim) {
  if (int(y.shape.size()) <= dim) return {};
  std::vector<long double> d2(size_t(y.shape[size_t(dim)]), 0), y2(d2.size(), 0);
  for (int64_t i = 0; i < y.numel(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
    const size_t at = size_t(y.unravel(i)[size_t(dim)]);
    d2[at] += (long double)(x[i] - y[i]) * (x[i] - y[i]);
    y2[at] += (long double)y[i] * y[i];
  }
  std::vector<std::pair<int64_t, double>> out;
  for (size_t a = 0; a < d2.size(); ++a)
    out.emplace_back(int64_t(a),
                     y2[a] > 0 ? double(std::sqrt(d2[a] / y2[a])) : double(std::sqrt(d2[a])));
  return out;
}

std::vector<Worst> top_errors(const Tensor& x, const Tensor& y, size_t n) {
  std::vector<std::pair<double, int64_t>> e;
  for (int64_t i = 0; i < y.numel(); ++i)
    if (std::isfinite(x[i]) && std::isfinite(y[i])) e.emplace_back(std::fabs(x[i] - y[i]), i);
  std::partial_sort(e.begin(), e.begin() + std::ptrdiff_t(std::min(n, e.size())), e.end(),
                    std::greater<>());
  std::vector<Worst> w;
  for (size_t k = 0; k < std::min(n, e.size()); ++k)
    w.push_back({y.unravel(e[k].second), x[e[k].second], y[e[k].second]});
  return w;
}

// The kernel's lse conventions, converted to the reference's: natural log, -inf for empty rows.
void convert_lse(Tensor& x, const Tensor& y, const AuditOptions& o) {
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (o.lse_base == "2" && std::isfinite(x[i])) x[i] *= std::log(2.0);
    const bool empty = std::isinf(y[i]) && y[i] < 0;
    const bool convention = (o.empty_lse == "+inf" && std::isinf(x[i]) && x[i] > 0) ||
                            (o.empty_lse == "nan" && std::isnan(x[i]));
    if (empty && convention) x[i] = -INFINITY;
  }
}

}  // namespace

AuditResult run_audit(const CaseFile& cf, const std::string& case_path,
                      std::map<std::string, Tensor> given, const std::string& outputs_path,
                      const AuditOptions& o) {
  if (cf.refs.empty())
    throw InputError(case_path, "ref.*",
                     "not a golden case: no reference tensors (make one with qkmla golden)");
  const MlaConfig& c = cf.k.cfg;
  AuditResult res;
  res.impl = "audit." + o.label;
  res.case_path = case_path;
  res.cfg = c;
  const bool kernel = c.level == Level::Kernel;
  const std::vector<std::string> primary = kernel ? std::vector<std::string>{"latent_out", "lse"}
                                                  : std::vector<std::string>{"out", "lse"};
  Delivered delivered;  // what the implementation delivers, checked and converted first
  for (auto& [name, x] : given) {
    if (!cf.refs.count("ref." + name)) {
      res.ignored.push_back(name);
      continue;
    }
    const Tensor& y = cf.refs.at("ref." + name);
    if (x.shape != y.shape)
      throw InputError(
          outputs_path, name,
          "shape " + shape_str(x.shape) + " does not match the case's " + shape_str(y.shape));
    if (x.dtype == DType::I32)  // no rounding format to judge it by
      throw InputError(outputs_path, name,
                       "dtype I32: an output is a floating-point tensor (F64, F32, F16, BF16 or "
                       "F8_E4M3)");
    if (name == "lse") convert_lse(x, y, o);
    delivered[name] = x.dtype;
  }
  // The yardstick: correct implementations of the declared design, or of every legitimate design
  // consistent with the form and the delivered dtypes, on this very case.
  const Form form = parse_form(o.form);
  const std::vector<Design> designs =
      o.design.empty() ? candidate_designs(c, form, delivered)
                       : std::vector<Design>{parse_design(o.design, c.profile, form)};
  for (const Design& d : designs) res.designs.push_back(to_string(d));
  std::vector<std::string> names;
  for (const auto& [name, dt] : delivered) names.push_back(name);
  auto ref = [&](const std::string& t) {
    return cf.refs.count("ref." + t) ? &cf.refs.at("ref." + t) : nullptr;
  };
  const Yardstick ys = measure_yardstick(cf.k, designs, ref, names);
  for (const auto& [name, dt] : delivered) {
    const Tensor& x = given.at(name);
    JudgeInput in;
    in.subject = {res.impl, c.preset, c.scenario, to_string(c.profile), name};
    in.x = &x;
    in.y = ref(name);
    in.mask = valid_mask(cf.k, name);
    const bool vector = name == "out" || name == "latent_out" || name == "q_latent";
    in.ulp_dtype = vector ? stored_dtype(c.profile) : accumulate_dtype(c.profile);
    if (ys.rel_l2.count(name)) in.baseline_rel_l2 = ys.rel_l2.at(name);
    in.floor = baseline_floor(dt);  // of the delivered type (SPEC §5)
    res.tensors.push_back({judge_tensor(o.rule, in), dt, in.baseline_rel_l2,
                           ys.design_of.count(name) ? ys.design_of.at(name) : "",
                           breakdown(x, *in.y, 2), breakdown(x, *in.y, 0),
                           top_errors(x, *in.y, 5)});
  }
  for (const std::string& p : primary)
    if (!given.count(p)) res.missing.push_back(p);
  if (!res.pass() && o.diagnose) {
    std::map<std::string, double> allowed;  // the rel_l2 each tensor may have and pass
    for (const TensorAudit& a : res.tensors)
      allowed[a.j.tensor] =
          std::max(o.rule.baseline_k, small_sample_k(a.j.samples)) *
          std::max(std::isnan(a.yardstick) ? 0.0 : a.yardstick, baseline_floor(a.delivered));
    res.diagnosis = diagnose(cf.k, given, cf.refs, allowed);
  }
  if (res.tensors.empty())
    throw InputError(outputs_path, "outputs",
                     "none of the given tensors has a reference in the case (expected " +
                         primary[0] + " and/or lse)");
  return res;
}

}  // namespace qkmla
