// RMSNorm + RoPE stages of the CPU profile implementations (E.2-E.4 and U.1 in Acc), with the
// perturbation hooks of core/perturbation.hpp (the default Perturbation is the correct path).
#pragma once
#include "core/perturbation.hpp"
#include "impl/profile_math.hpp"

namespace qkmla::impl {

// Each step's output stored in `eager` (a PyTorch module in eager mode: core/design.hpp), or kept
// in Acc when `eager` is F64 (every accumulate type fits in it: nothing to round).
template <class Acc>
void eager_step(DType eager, Acc* z, int n) {
  if (eager != DType::F64)
    for (int j = 0; j < n; ++j) z[j] = store(eager, z[j]);
}

// RMSNorm's x * inv * gamma in Acc, or, when `eager` is a format (a module in the stored dtype:
// Design::eager, Design::prelude), x * inv stored, then gamma * that stored (Qwen3's RMSNorm).
template <class Acc>
void norm_gain(Acc* z, int n, const Acc* gamma, Acc inv, DType eager) {
  if (eager == DType::F64) return scale_gain(z, n, gamma, inv);
  for (int j = 0; j < n; ++j) z[j] = store(eager, gamma[j] * store(eager, z[j] * inv));
}

// Blockwise rope vector: normalize with its own gain and rotate, in the configured order.
// z [d_r] holds the raw vector on entry and the normalized rotated vector (in Acc) on return.
// Eager: rotated, normalized (x * inv), and gained (gamma * x) each stored, as Qwen3's RMSNorm and
// DeepSeek's apply_rotary_emb store them.
template <class Acc>
void blockwise_rope(Acc* z, const Acc* gamma, int64_t pos, const Case& k, Acc eps,
                    const Perturbation& p = {}, DType eager = DType::F64) {
  const int dr = k.cfg.d_r;
  const bool ntr = hook::norm_then_rope(p, k.cfg);
  if (!ntr) rotate(z, k, pos), eager_step(eager, z, dr);
  const Acc inv = hook::inv_rms(p, sum_sq(z, dr), dr, eps);
  norm_gain(z, dr, gamma, inv, eager);
  if (ntr) rotate(z, k, pos), eager_step(eager, z, dr);
}

// Unified statistic over [content; rope_stat] (U.1): 1 / sqrt((|c|^2 + |r|^2) / (d_c + d_r) + eps).
template <class Acc>
Acc unified_inv(const Acc* content, const Acc* rope_stat, const Case& k, Acc eps) {
  const int dc = k.cfg.d_c, dr = k.cfg.d_r;
  return inv_rms_from(sum_sq(content, dc) + sum_sq(rope_stat, dr), dc + dr, eps);
}

}  // namespace qkmla::impl
