#include "harness/stored_scale.hpp"

#include <nlohmann/json.hpp>

#include "core/design.hpp"
#include "harness/truth.hpp"
#include "impl/cpu_impls.hpp"

namespace qkmla {

namespace {

// The golden's reference precision (qkmla.reference "bits"), else the default P.
int reference_bits(const CaseFile& cf) {
  const auto it = cf.metadata.find("qkmla.reference");
  if (it != cf.metadata.end()) {
    const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, false);
    if (j.is_object() && j.contains("bits") && j["bits"].is_number_integer())
      return j["bits"].get<int>();
  }
  return TruthOptions{}.bits;
}

}  // namespace

std::optional<double> stored_scale_of(const MlaConfig& c) {
  const DType D = stored_dtype(c.profile), A = accumulate_dtype(c.profile);
  if (c.level != Level::Module || !rounds_at(D, A)) return std::nullopt;
  const double sigma_d = round_to(D, c.softmax_scale);
  if (sigma_d == c.softmax_scale || !(sigma_d > 0)) return std::nullopt;
  return sigma_d;
}

std::optional<CaseFile> stored_scale_case(const CaseFile& cf) {
  const std::optional<double> sigma_d = stored_scale_of(cf.k.cfg);
  if (!sigma_d) return std::nullopt;
  CaseFile alt;
  alt.k = cf.k;
  alt.k.cfg.softmax_scale = *sigma_d;
  alt.metadata = cf.metadata;
  TruthOptions o;  // as make_golden forms them: latent_out and q_latent included
  o.bits = reference_bits(cf), o.latent_out = true, o.absorbed = true;
  const Truth t = compute_truth(alt.k, o);
  if (!t.ok()) return std::nullopt;
  for (const auto& [name, ref] : cf.refs) {     // the same reference tensors, at sigma_D
    const std::string tensor = name.substr(4);  // "ref.out" -> "out"
    const Outputs* out = t.of(tensor);          // alpha_q, alpha_k do not depend on sigma
    alt.refs[name] = out && out->tensors.count(tensor) ? out->tensors.at(tensor) : ref;
  }
  return alt;
}

std::map<std::string, Tensor> stored_scale_shift(const Case& k, double sigma_d) {
  Case at = k;
  at.cfg.softmax_scale = sigma_d;
  const impl::AbsorbedSpec spec{
      Variant::Default, {}, accumulate_design(k.cfg.profile, Form::Absorbed)};
  const Outputs a = impl::cpu_absorbed(k, {spec})[0], b = impl::cpu_absorbed(at, {spec})[0];
  std::map<std::string, Tensor> shift;
  for (const char* t : {"out", "latent_out", "lse"}) {
    if (!a.tensors.count(t) || !b.tensors.count(t)) continue;
    Tensor d = b.tensors.at(t);  // [B, S_q, H, d_v], [B, S_q, H, r] or [B, S_q, H]
    for (int64_t i = 0; i < d.numel(); ++i) d[i] -= a.tensors.at(t)[i];
    shift[t] = std::move(d);
  }
  return shift;
}

}  // namespace qkmla
