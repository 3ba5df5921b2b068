#include "core/outputs.hpp"

#include <stdexcept>

namespace qkmla {

Tensor make_output(const Case& k, const std::string& name, DType d, double fill) {
  const MlaConfig& c = k.cfg;
  const int64_t B = c.batch, S = c.s_q, H = c.heads;
  if (name == "out") return Tensor(d, {B, S, H, c.d_v}, fill);
  if (name == "lse" || name == "alpha_q") return Tensor(d, {B, S, H}, fill);
  if (name == "alpha_k") return Tensor(d, {B, k.t_max(), c.groups}, fill);
  if (name == "latent_out" || name == "q_latent") return Tensor(d, {B, S, H, c.latent_rank}, fill);
  throw std::invalid_argument("make_output: unknown output '" + name + "'");
}

}  // namespace qkmla
