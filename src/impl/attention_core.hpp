// The attention core of every CPU profile implementation (explicit, absorbed, kernel level, and
// the error-bound runs of each): logits of the visible tokens in token order, softmax in Acc (p not
// rounded), then sum_t p_t * value_t in token order (E.5-E.7, A.4-A.5). One function, so the forms
// differ only in what they score and what they average.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/attention_math.hpp"
#include "impl/profile_math.hpp"

namespace qkmla::impl {

// One query row. `logit(t)` gives the logit of token t, `value(t)` a pointer to its `width` values;
// `acc` [width] receives sum_t p_t value_t, with p stored in `p_format` first when a design rounds
// it (FlashMLA's bf16 P). Returns lse (-inf, acc all zero, for no token).
template <class Acc, class Logit, class Value>
Acc attend_row(const std::vector<int64_t>& tokens, const Logit& logit, const Value& value,
               int width, std::vector<Acc>& acc,
               const std::optional<DType>& p_format = std::nullopt) {
  std::vector<Acc> p;
  p.reserve(tokens.size());
  for (int64_t t : tokens) p.push_back(logit(t));
  const Acc lse = softmax(p);
  if (p_format)
    for (Acc& x : p) x = store(*p_format, x);
  acc.assign(size_t(width), Acc(0));
  ordered_accumulate<Acc>(
      int64_t(tokens.size()), width, [&](int64_t n) { return p[size_t(n)]; },
      [&](int64_t n) { return value(tokens[size_t(n)]); }, acc.data());
  return lse;
}

// The latent cache of one sequence as a decode kernel reads it (A.3).
template <class Acc>
struct LatentCache {
  std::vector<Acc> c;        // [T, r] as stored (fp8: code x scale in Acc)
  std::vector<Acc> rope;     // [T, d_r] kr^ (blockwise), gained rotated rope key (unified), or the
                             // rotated raw rope key (norm none), rounded to the stored dtype
  std::vector<Acc> alpha_k;  // [T, G] (1 in norm none)
};

// One absorbed query row (A.1-A.2).
template <class Acc>
struct LatentQuery {
  std::vector<Acc> q_latent, rope;  // [r], [d_r], rounded to the stored dtype
  Acc alpha_q = 0;                  // the reported statistic 1 / S^q
  Acc row_scale = 1;                // what multiplies alpha_k after the dot: alpha_q, or 1 when the
                                    // query already carries it (folded, normalized first) or none
};

// A.4-A.5 for one row against one sequence's cache: latent and rope scores of the visible tokens,
// the logit of core/attention_math.hpp, softmax, latent_out [r] (in `lat`, unrounded). `ak_token`
// maps a token to the one whose alpha_k scales it; `lowp` rounds the latent score's partial sums
// to bf16 (a mutant).
template <class Acc, class AkToken>
Acc latent_attend(const MlaConfig& cf, const LatentQuery<Acc>& q, const LatentCache<Acc>& cache,
                  int g, const std::vector<int64_t>& tokens, Acc scale, const AkToken& ak_token,
                  bool lowp, const std::optional<DType>& p_format, std::vector<Acc>& lat) {
  const int r = cf.latent_rank, dr = cf.d_r, G = cf.groups;
  const bool unified = cf.norm == NormMode::Unified;
  auto logit = [&](int64_t t) {
    const Acc latent = dot_maybe_lowp(q.q_latent.data(), cache.c.data() + t * r, r, lowp);
    const Acc rope = dot(q.rope.data(), cache.rope.data() + t * dr, dr);
    const Acc s = q.row_scale * cache.alpha_k[size_t(ak_token(t) * G + g)];
    return latent_logit(unified, scale, s, latent, rope);
  };
  auto value = [&](int64_t t) { return cache.c.data() + t * r; };
  return attend_row(tokens, logit, value, r, lat, p_format);
}

}  // namespace qkmla::impl
