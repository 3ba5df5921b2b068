// RMSNorm + RoPE stages of the CPU profile implementations (E.2-E.4 and U.1 in Acc), with the
// perturbation hooks of core/perturbation.hpp (the default Perturbation is the correct path).
#pragma once
#include "core/perturbation.hpp"
#include "impl/profile_math.hpp"

namespace qkmla::impl {

// Blockwise rope vector: normalize with its own gain and rotate, in the configured order.
// z [d_r] holds the raw vector on entry and the normalized rotated vector (in Acc) on return.
template <class Acc>
void blockwise_rope(Acc* z, const Acc* gamma, int64_t pos, const Case& k, Acc eps,
                    const Perturbation& p = {}) {
  const int dr = k.cfg.d_r;
  const bool ntr = hook::norm_then_rope(p, k.cfg);
  if (!ntr) rotate(z, k, pos);
  scale_gain(z, dr, gamma, hook::inv_rms(p, sum_sq(z, dr), dr, eps));
  if (ntr) rotate(z, k, pos);
}

// Unified statistic over [content; rope_stat] (U.1): 1 / sqrt((|c|^2 + |r|^2) / (d_c + d_r) + eps).
template <class Acc>
Acc unified_inv(const Acc* content, const Acc* rope_stat, const Case& k, Acc eps) {
  const int dc = k.cfg.d_c, dr = k.cfg.d_r;
  return inv_rms_from(sum_sq(content, dc) + sum_sq(rope_stat, dr), dc + dr, eps);
}

}  // namespace qkmla::impl
