// The one mechanism by which a bug is injected into an implementation: a Perturbation is data
// (which step deviates from conventions §1 and how), and the hooks below are the only places where
// the absorbed implementations (reference/ref_absorbed, src/impl/cpu_absorbed) and the exact
// certifier (reference/certify) consult it. The default-constructed Perturbation is the correct
// path, so the correct code reads as the paper. The shipped mutants of conventions §7 are named
// Perturbations (src/impl/mutants.cpp): the gate runs them, certify refutes the same objects.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/attention_math.hpp"
#include "core/case.hpp"
#include "core/config.hpp"

namespace qkmla {

enum class EpsPlacement { Inside, OutsideSqrt, Dropped };
// How the reported lse is formed: natural log of sum_t exp(logit) (correct); base 2; of the
// unscaled scores logit / sigma; or with the row maximum taken before the scale (m / sigma +
// log sum exp(logit - m): a FlashAttention-style kernel that forgets to scale its running max).
enum class LseForm { Natural, Base2, Unscaled, MaxUnscaled };
// How an attention sink (conventions §1.5) is applied: to out only (correct); also folded into the
// returned lse, log(exp(lse) + exp(s_h)); or not at all.
enum class SinkForm { OutOnly, AlsoLse, Ignored };

struct Perturbation {
  int gamma_k_power = 1;  // gamma_ck applied this many times in q_latent (0, 1, 2)
  EpsPlacement eps = EpsPlacement::Inside;  // where eps sits in the RMS statistic
  bool key_stat_from_latent = false;     // alpha_k from the RMS of c[t] (width r), not of the key
  bool key_stat_lowp = false;            // key sum of squares with bf16 partial sums
  bool joint_stat_in_blockwise = false;  // the unified statistic in a blockwise config
  int alpha_k_shift = 0;                 // token t scaled by alpha_k[max(t + shift, 0)]
  bool group_mod = false;                // g(h) = h % G
  bool scale_dc_only = false;            // sigma = 1 / sqrt(d_c)
  bool drop_alpha_q = false;             // alpha_q never applied
  bool score_lowp = false;               // q_latent . c with bf16 partial sums
  int causal_extra = 0;                  // a causal query also sees pos(i) + causal_extra
  bool swap_rope_order = false;          // the rope order the config does not say
  bool lse_base2 = false;                // lse reported in base 2
  int topk_shift = 0;                    // top-k: each listed slot read as slot + shift
  SinkForm sink = SinkForm::OutOnly;     // how the attention sink is applied
  // Conventions a diagnosis tries (harness/diagnose.hpp); no conventions §7 mutant sets these.
  LseForm lse_form = LseForm::Natural;
  int gamma_q_power = 1;                  // gamma_cq in q_latent: 1, or 0 (missing)
  bool no_rope_gain_q = false;            // the query rope gain missing
  bool no_rope_gain_k = false;            // the key rope gain missing
  bool mean_over_d_minus_1 = false;       // the RMS statistic's mean over d - 1
  bool rope_unscaled_by_alpha_k = false;  // unified: alpha_k scales the content part only
  int query_pos_shift = 0;                // queries rotated at pos(i) + shift
  bool split_average = false;  // two KV splits combined by a plain average, not lse-weighted

  bool is_none() const { return *this == Perturbation{}; }
  // Differs from the correct path only in how sums are rounded: identical in exact arithmetic.
  bool rounding_only() const {
    Perturbation p = *this;
    p.key_stat_lowp = p.score_lowp = false;
    return !is_none() && p.is_none();
  }
  bool operator==(const Perturbation& o) const {
    return gamma_k_power == o.gamma_k_power && eps == o.eps &&
           key_stat_from_latent == o.key_stat_from_latent && key_stat_lowp == o.key_stat_lowp &&
           joint_stat_in_blockwise == o.joint_stat_in_blockwise &&
           alpha_k_shift == o.alpha_k_shift && group_mod == o.group_mod &&
           scale_dc_only == o.scale_dc_only && drop_alpha_q == o.drop_alpha_q &&
           score_lowp == o.score_lowp && causal_extra == o.causal_extra &&
           swap_rope_order == o.swap_rope_order && lse_base2 == o.lse_base2 &&
           topk_shift == o.topk_shift && sink == o.sink && lse_form == o.lse_form &&
           gamma_q_power == o.gamma_q_power && no_rope_gain_q == o.no_rope_gain_q &&
           no_rope_gain_k == o.no_rope_gain_k && mean_over_d_minus_1 == o.mean_over_d_minus_1 &&
           rope_unscaled_by_alpha_k == o.rope_unscaled_by_alpha_k &&
           query_pos_shift == o.query_pos_shift && split_average == o.split_average;
  }
};

namespace hook {

// g(h): h / (H/G) (conventions §1), or h % G.
inline int group_of(const Perturbation& p, const MlaConfig& c, int h) {
  return p.group_mod ? h % c.groups : c.group_of(h);
}

inline bool norm_then_rope(const Perturbation& p, const MlaConfig& c) {
  return (c.rope_order == RopeOrder::NormThenRope) != p.swap_rope_order;
}

// The softmax scale as a double (each arithmetic converts it to its own type).
inline double softmax_scale(const Perturbation& p, const MlaConfig& c) {
  return p.scale_dc_only ? 1.0 / std::sqrt(double(c.d_c)) : c.softmax_scale;
}

// Which cached tokens query (b, i) sees, and in which order a kernel visits them (core/case.hpp).
inline bool visible(const Perturbation& p, const Case& k, int b, int i, int64_t t) {
  return k.visible(b, i, t, p.causal_extra, p.topk_shift);
}
inline std::vector<int64_t> tokens(const Perturbation& p, const Case& k, int b, int i) {
  return k.tokens(b, i, p.causal_extra, p.topk_shift);
}

// The cached token whose alpha_k scales token t's score.
inline int64_t alpha_k_token(const Perturbation& p, int64_t t) {
  const int64_t s = t + p.alpha_k_shift;
  return s < 0 ? 0 : s;
}

// Does the key statistic include the rope key's share (unified, or the joint-norm bug)?
inline bool joint_key_stat(const Perturbation& p, const MlaConfig& c) {
  return c.norm == NormMode::Unified || p.joint_stat_in_blockwise;
}

// E.2: the inverse RMS statistic 1 / sqrt(ss / n + eps) from a sum of squares over n entries,
// or the eps bug's form. Unqualified sqrt: every arithmetic brings its own.
template <class T>
T inv_rms(const Perturbation& p, const T& ss, int n, const T& eps) {
  using std::sqrt;
  if (p.mean_over_d_minus_1 && n > 1) n -= 1;
  if (p.eps == EpsPlacement::OutsideSqrt) return T(T(1) / (sqrt(T(ss / T(n))) + eps));
  if (p.eps == EpsPlacement::Dropped) return T(T(1) / sqrt(T(ss / T(n))));
  return T(T(1) / sqrt(T(ss / T(n)) + eps));
}

// gamma_ck as it enters q_latent: gamma, 1 (not absorbed) or gamma^2 (applied twice).
template <class T>
T gain_k(const Perturbation& p, const T& gamma) {
  if (p.gamma_k_power == 0) return T(1);
  if (p.gamma_k_power == 2) return T(gamma * gamma);
  return gamma;
}

// gamma_cq as it enters q_latent: gamma, or 1 (missing).
template <class T>
T gain_q(const Perturbation& p, const T& gamma) {
  return p.gamma_q_power == 0 ? T(1) : gamma;
}

// The query position the rope part is rotated at (never below 0).
inline int64_t query_rope_pos(const Perturbation& p, int64_t pos) {
  const int64_t s = pos + p.query_pos_shift;
  return s < 0 ? 0 : s;
}

// What multiplies alpha_k after the latent dot: alpha_q, or 1 when the bug drops it.
template <class T>
T alpha_q_applied(const Perturbation& p, const T& alpha_q) {
  return p.drop_alpha_q ? T(1) : alpha_q;
}

// The lse an implementation reports: natural log, or divided by ln 2 (ln2 in the caller's type).
template <class T>
T lse_out(const Perturbation& p, const T& lse, const T& ln2) {
  return p.lse_base2 || p.lse_form == LseForm::Base2 ? T(lse / ln2) : lse;
}

// The factor out (and latent_out) of a row is multiplied by under an attention sink s_h (1
// without one, or when the sink is ignored).
template <class T>
T sink_scale(const Perturbation& p, bool has_sink, const T& s, const T& lse) {
  return has_sink && p.sink != SinkForm::Ignored ? sink_factor(s, lse) : T(1);
}

// The lse a row returns: unchanged by the sink (FlashMLA), unless the sink is folded in.
template <class T>
T sink_lse(const Perturbation& p, bool has_sink, const T& s, const T& lse) {
  using std::exp;
  using std::log;
  if (!has_sink || p.sink != SinkForm::AlsoLse) return lse;
  return lse > s ? T(lse + log(T(1) + exp(T(s - lse)))) : T(s + log(T(1) + exp(T(lse - s))));
}

}  // namespace hook

}  // namespace qkmla
