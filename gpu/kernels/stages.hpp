// The per-row and per-element stages of the GPU decode pipeline, compiled for host (gpu.model) and
// device (kernels). Each function is what one thread does; the kernels call it from their thread
// mapping, the model calls it in loops. Proof steps: proofs/gpu_kernels.md (K.1-K.7).
#pragma once
#include "core/attention_math.hpp"
#include "gpu/dims.hpp"
#include "gpu/kernels/math.hpp"

namespace qkmla::gpu {

// Value of x after storing it in format s (the bits the next stage reads back).
QK_HD float round_store(Store s, float x) {
  switch (s) {
    case Store::BF16:
      return bf16_to_float(float_to_bf16(x));
    case Store::F16:
      return half_to_float(float_to_half(x));
    case Store::E4M3:
      return e4m3_to_float(float_to_e4m3(x));
    default:
      return x;
  }
}

constexpr int kPage = 64;      // tokens per cache page (conventions §10)
constexpr int kMaxRank = 512;  // r <= kMaxRank: the decode kernel keeps r / 256 columns per thread
constexpr int kMaxRope = 64;
constexpr int kRowsPerBlock = 16;  // query rows (i, h) per decode block

// K.1 query stage for one row (b, i, h) at position pos. Inputs as fp32 values of the stored bits.
// Writes w [d_c] = q_nope (.) g_q (.) g_k (the vector projected by WK_g^T), the query rope part
// [d_r] rounded to the stored format, and returns alpha_q. pos < 0 (only when T_b = 0) leaves the
// rope part unrotated: no key can see it.
QK_HD float query_row(const Dims& d, const float* q_nope, const float* q_pe, const float* g_q,
                      const float* g_k, const float* g_rq, const float* cos_row,
                      const float* sin_row, bool rotate, float* w, float* q_rope) {
  for (int j = 0; j < d.d_r; ++j) q_rope[j] = q_pe[j];
  float alpha_q;
  if (d.unified) {
    if (!d.norm_then_rope && rotate) rope_rotate(q_rope, d.d_r, d.interleaved, cos_row, sin_row);
    alpha_q = inv_rms(sum_sq(q_nope, d.d_c) + sum_sq(q_rope, d.d_r), d.d_c + d.d_r, d.eps);
    for (int j = 0; j < d.d_r; ++j) q_rope[j] = mul_rn(q_rope[j], g_q[d.d_c + j]);
    if (d.norm_then_rope && rotate) rope_rotate(q_rope, d.d_r, d.interleaved, cos_row, sin_row);
  } else {
    alpha_q = inv_rms(sum_sq(q_nope, d.d_c), d.d_c, d.eps);
    if (!d.norm_then_rope && rotate) rope_rotate(q_rope, d.d_r, d.interleaved, cos_row, sin_row);
    const float a = inv_rms(sum_sq(q_rope, d.d_r), d.d_r, d.eps);
    for (int j = 0; j < d.d_r; ++j) q_rope[j] = mul_rn(mul_rn(q_rope[j], g_rq[j]), a);
    if (d.norm_then_rope && rotate) rope_rotate(q_rope, d.d_r, d.interleaved, cos_row, sin_row);
  }
  for (int j = 0; j < d.d_r; ++j) q_rope[j] = round_store(d.stored, q_rope[j]);
  for (int j = 0; j < d.d_c; ++j) w[j] = mul_rn(mul_rn(q_nope[j], g_q[j]), g_k[j]);
  return alpha_q;
}

// K.2 one element of a projection: sum_l x[l] * w(l), sequential fma over l.
template <class LoadW>
QK_HD float project(const float* x, int n, const LoadW& w) {
  float s = 0.0f;
  for (int l = 0; l < n; ++l) s = fmaf(x[l], w(l), s);
  return s;
}

// Explicit form: the stored normalized content query qc^ [d_c] (K.1 applied to q_nope alone).
QK_HD void explicit_query_content(const Dims& d, const float* q_nope, const float* g_cq,
                                  float alpha_q, float* qc) {
  for (int j = 0; j < d.d_c; ++j)
    qc[j] = round_store(d.stored, mul_rn(mul_rn(q_nope[j], g_cq[j]), alpha_q));
}

// K.3 append, rope part of token t: the cached rope key [d_r] rounded to the stored format, and the
// rope share of the unified statistic (0 in blockwise mode). z holds the raw k_pe on entry.
QK_HD float append_rope(const Dims& d, float* z, const float* g_rk, const float* cos_row,
                        const float* sin_row) {
  float share = 0.0f;
  if (d.unified) {  // g_rk: the rope half of gamma_k; the cache holds the gained rotated,
                    // un-normalized key
    if (!d.norm_then_rope) rope_rotate(z, d.d_r, d.interleaved, cos_row, sin_row);
    share = sum_sq(z, d.d_r);
    for (int j = 0; j < d.d_r; ++j) z[j] = mul_rn(z[j], g_rk[j]);
    if (d.norm_then_rope) rope_rotate(z, d.d_r, d.interleaved, cos_row, sin_row);
  } else {
    if (!d.norm_then_rope) rope_rotate(z, d.d_r, d.interleaved, cos_row, sin_row);
    const float a = inv_rms(sum_sq(z, d.d_r), d.d_r, d.eps);
    for (int j = 0; j < d.d_r; ++j) z[j] = mul_rn(mul_rn(z[j], g_rk[j]), a);
    if (d.norm_then_rope) rope_rotate(z, d.d_r, d.interleaved, cos_row, sin_row);
  }
  for (int j = 0; j < d.d_r; ++j) z[j] = round_store(d.stored, z[j]);
  return share;
}

// K.3 alpha_k of one (token, group) from its transient content key [d_c] (fp32, never stored).
QK_HD float append_alpha_k(const Dims& d, const float* key, float rope_share) {
  const int n = d.unified ? d.d_c + d.d_r : d.d_c;
  return inv_rms(sum_sq(key, d.d_c) + rope_share, n, d.eps);
}

// Explicit form: the stored normalized content key kc^ [d_c] of one (token, group).
QK_HD void explicit_key_content(const Dims& d, const float* key, const float* g_ck, float alpha_k,
                                float* kc) {
  for (int j = 0; j < d.d_c; ++j) kc[j] = round_store(d.stored, (key[j] * g_ck[j]) * alpha_k);
}

// K.4 the logit of one (row, token) from its latent and rope dot products. qk_norm = false is
// plain MLA (the benchmark's "scaling disabled" baseline, and the explicit form, whose keys are
// already normalized). Masked tokens are -inf, set by the caller.
QK_HD float logit(const Dims& d, bool qk_norm, float alpha_q, float alpha_k, float latent,
                  float rope) {
  if (!qk_norm) return plain_logit(d.scale, latent, rope);
  return latent_logit(d.unified, d.scale, mul_rn(alpha_q, alpha_k), latent, rope);
}

// Online-softmax state of one row within a split.
struct RowState {
  float m, l;  // running max and sum of exp(logit - m)
};
QK_HD RowState row_start() { return {-qk_inf(), 0.0f}; }

// K.5 pieces, shared by the model's softmax_tile (one thread, in order) and the kernel's (a warp
// per row: tile max by butterfly, p by the lanes, the sum by one lane in order).
//
// The tile max: the largest logit, never a NaN, and +0 above -0. That is a maximum under a total
// order, so every reduction order (sequential here, a butterfly in the kernel) gives the same bits.
QK_HD float tile_max(float a, float b) { return (b > a || (b == a && f2u(b) == 0u)) ? b : a; }
QK_HD float tile_m_new(const RowState& st, float mt) { return mt > st.m ? mt : st.m; }
// p of one logit: masked (-inf) logits get 0; while nothing is visible (m_new = -inf) a NaN logit
// is kept as p, so it propagates into l.
QK_HD float tile_p(float logit, float m_new) {
  if (m_new == -qk_inf()) return qk_isnan(logit) ? logit : 0.0f;
  return qk_exp(logit - m_new);
}
// Folds the tile's sum of p (sequential, in token order) into the state; returns alpha, the factor
// that rescales the row's accumulator.
QK_HD float tile_finish(RowState& st, float m_new, float sum) {
  if (m_new == -qk_inf()) {
    st.l = st.l + sum;
    return 1.0f;
  }
  const float alpha = qk_exp(st.m - m_new);
  st.l = add_rn(mul_rn(st.l, alpha), sum);  // rounded twice, as the model: never an fma
  st.m = m_new;
  return alpha;
}

// K.5 one tile (n tokens in order) of one row: updates the state, writes p [n], returns alpha.
QK_HD float softmax_tile(RowState& st, const float* logits, int n, float* p) {
  float mt = -qk_inf();
  for (int t = 0; t < n; ++t) mt = tile_max(mt, logits[t]);
  const float m_new = tile_m_new(st, mt);
  float sum = 0.0f;
  for (int t = 0; t < n; ++t) {
    p[t] = tile_p(logits[t], m_new);
    sum += p[t];
  }
  return tile_finish(st, m_new, sum);
}

// K.6 one accumulator element over a tile: acc * alpha + sum_t p[t] * c[t] (sequential fma in
// token order). Tokens of the tile are all < T_b: rows past T_b are never read.
template <class LoadC>
QK_HD float accumulate_tile(float acc, float alpha, const float* p, const LoadC& c, int n) {
  float s = 0.0f;
  for (int t = 0; t < n; ++t) s = fmaf(p[t], c(t), s);
  return fmaf(acc, alpha, s);
}

// End of a split: the normalized partial output and its lse (-inf, output 0 when nothing was
// visible).
QK_HD float split_lse(const RowState& st) {
  return st.m == -qk_inf() ? (qk_isnan(st.l) ? st.l : -qk_inf()) : st.m + qk_log(st.l);
}
QK_HD float split_out(const RowState& st, float acc) {
  return st.m == -qk_inf() ? (qk_isnan(st.l) ? st.l : 0.0f) : acc / st.l;
}

// K.7 combine of one row over its n splits (lse-weighted): returns the row's lse.
QK_HD float combine_lse(const float* lse_s, int n) {
  float M = -qk_inf();
  bool nan = false;
  for (int s = 0; s < n; ++s) {
    nan = nan || qk_isnan(lse_s[s]);
    if (lse_s[s] > M) M = lse_s[s];
  }
  if (nan) return qk_nan();
  if (M == -qk_inf()) return M;
  float sum = 0.0f;
  for (int s = 0; s < n; ++s) sum += qk_exp(lse_s[s] - M);
  return M + qk_log(sum);
}
// One output element: sum_s exp(lse_s - lse) * o_s[j], sequential over splits.
template <class LoadO>
QK_HD float combine_element(const float* lse_s, int n, float lse, const LoadO& o) {
  if (qk_isnan(lse)) return lse;
  if (lse == -qk_inf()) return 0.0f;
  float acc = 0.0f;
  for (int s = 0; s < n; ++s)
    if (lse_s[s] != -qk_inf()) acc = fmaf(qk_exp(lse_s[s] - lse), o(s), acc);
  return acc;
}

}  // namespace qkmla::gpu
