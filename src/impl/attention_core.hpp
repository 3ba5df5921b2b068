// The attention core of every CPU profile implementation (explicit, absorbed, kernel level, and
// the error-bound runs of each): logits of the visible tokens in token order, softmax in Acc (p not
// rounded), then sum_t p_t * value_t in token order (E.5-E.7, A.4-A.5). One function, so the forms
// differ only in what they score and what they average.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/attention_math.hpp"
#include "core/design.hpp"
#include "core/dtype.hpp"
#include "core/perturbation.hpp"
#include "core/rng.hpp"
#include "impl/profile_math.hpp"

namespace qkmla::impl {

// Where one attention row rounds beyond its inputs (a design's score, p and exp2 points,
// core/design.hpp): the logits stored before the softmax (a PyTorch module's bf16 scores), the
// probabilities stored before p.v (FlashMLA's bf16 P), and base-2 logits (the caller's scale
// carries log2 e; exp2 and log2, the lse converted back to natural log).
struct RowRounding {
  std::optional<DType> score, p;
  std::optional<DType> eager;  // each factor of the logit stored (core/design.hpp: eager)
  // alpha_k multiplied into each key and the product stored before the dot (core/design.hpp:
  // key_fold): the latent key, and under the unified norm the rope key too
  std::optional<DType> key_fold;
  bool p_normalized = false;  // P stored after the division (a module) or before it (a kernel)
  bool p_sum_stored = false;  // a kernel's denominator summed over its stored P (Design)
  // split-KV partial outputs stored, merged one after another (Design::partials)
  std::optional<DType> partials;
  bool exp2 = false;
  // Design::sink_in_p (with p_normalized): the row's sink logit scales P before P is stored;
  // -inf: no sink. Set per row by the caller, from the head's attn_sink.
  bool sink_in_p = false;
  double sink = -std::numeric_limits<double>::infinity();
  static RowRounding of(const Design& d, DType A) {
    RowRounding r;
    if (rounds_at(d.score, A)) r.score = d.score;
    if (rounds_at(d.p, A)) r.p = d.p;
    if (rounds_at(d.eager, A)) r.eager = d.eager;
    if (rounds_at(d.key_fold, A)) r.key_fold = d.key_fold;
    if (rounds_at(d.partials, A)) r.partials = d.partials;
    r.p_normalized = d.p_normalized;
    r.p_sum_stored = d.p_sum_stored && !d.p_normalized;
    r.exp2 = d.exp2;
    r.sink_in_p = d.sink_in_p && d.p_normalized;
    return r;
  }
};

// Another rounding draw of a stored logit (harness/logit_noise.cpp): while `draw` >= 0, each logit
// a design stores (RowRounding::score) moves by ulp/sqrt(6) of its stored value times a standard
// normal draw from `rng`: the variance of two independent roundings to that format
// (transformers' eager module stores q.k^T, then the scaled logit), an independent draw of what
// the design's own roundings, shared by all of its samples, happened to make. Normal, not random
// signs: two tied tokens' +-1 signs cancel half the time. Per thread. The same for one other value
// a logit is made of: at kernel level a folded design's query (alpha_q x the given query,
// stored), whose rounding moves each of the row's logits as a stored logit's does (zoo seed
// 104914). Each factor of the eager chain only in a `chain` draw, whose changes set the
// ill-conditioned rows' allowances alone (harness/logit_noise.hpp): as a noise floor for every
// statistic it raised a module-level case's bias yardstick ~3.4x (a head x 1.05 went from 9.9x
// to 2.9x, test audit.structure.catches_what_rel_l2_averages_away). Not a folded design's keys
// (tried with the eager chain: the same failure).
struct LogitDither {
  int draw = -1;
  bool chain = false;
  double amplitude = 1;  // an fp8 query's dither in its ulps' units (quantize_row_e4m3)
  Rng rng{1};
};
inline LogitDither& logit_dither() {
  thread_local LogitDither d;
  return d;
}

// A value a logit is made of, as a design stores it: rounded to `f`, then dithered while a draw
// is on.
template <class Acc>
Acc dithered_store(DType f, Acc l) {
  Acc s = store(f, l);
  if constexpr (std::is_floating_point_v<Acc>) {
    LogitDither& d = logit_dither();
    if (d.draw >= 0 && std::isfinite(double(s)))
      s += Acc(ulp_in(f, double(s)) / std::sqrt(6.0) * d.rng.normal());
  }
  return s;
}

// Design::q = F8_E4M3 (an all-FP8 kernel's query; declared only): the query row [q_latent; rope]
// quantized to e4m3 with one dynamic scale s = amax / 448, each value s * e4m3(x / s) (FlashMLA
// PR #54's descale_q, aiter's fp8-Q MLA decode; per row here, which differs from their per-tensor
// scale only for values below e4m3's normal range, 2^-6 s). A row of zeros, or one holding a
// non-finite value, is left as it is. Dithered while a draw is on, as dithered_store: every
// sample of the design shares one draw of this coarse rounding, whose structure statistics vary
// from draw to draw (zoo style fp8_attention, seed 108012: out bias 10.7x the samples').
template <class Acc>
void quantize_row_e4m3(std::vector<Acc>& a, std::vector<Acc>& b) {
  if constexpr (!std::is_floating_point_v<Acc>) {
    throw std::logic_error("no proven error bound for an fp8 query");
  } else {
    Acc amax = 0;
    for (const std::vector<Acc>* v : {&a, &b})
      for (Acc x : *v) amax = std::max(amax, std::abs(x));
    if (!(amax > 0) || !std::isfinite(amax)) return;
    const double s = double(amax) / 448;
    LogitDither& d = logit_dither();
    for (std::vector<Acc>* v : {&a, &b})
      for (Acc& x : *v) {
        double e = round_to(DType::F8_E4M3, double(x) / s);
        if (d.draw >= 0)
          e += d.amplitude * ulp_in(DType::F8_E4M3, e) / std::sqrt(6.0) * d.rng.normal();
        x = Acc(s * e);
      }
  }
}

// One query row. `logit(t)` gives the logit of token t, `value(t)` a pointer to its `width` values;
// `acc` [width] receives sum_t p_t value_t, rounding where `rr` says. Returns lse (-inf, acc all
// zero, for no token).
template <class Acc, class Logit, class Value>
Acc attend_row(const std::vector<int64_t>& tokens, const Logit& logit, const Value& value,
               int width, std::vector<Acc>& acc, const RowRounding& rr = {});

// Design::partials: each chunk's output stored in `f`, merged into a running output one chunk
// after another by lse weights in Acc (merge_state), the running output stored after each merge.
template <class Acc>
Acc merge_stored(const std::vector<Acc>& lse_s, const std::vector<std::vector<Acc>>& o_s, int width,
                 std::vector<Acc>& acc, DType f) {
  using std::exp;
  using std::log;
  acc.resize(size_t(width));
  for (int j = 0; j < width; ++j) acc[size_t(j)] = store(f, o_s[0][size_t(j)]);
  Acc lse = lse_s[0];
  for (size_t s = 1; s < lse_s.size(); ++s) {
    const Acc M = std::max(lse, lse_s[s]);
    if (M == -std::numeric_limits<Acc>::infinity()) continue;  // both empty
    const Acc a = exp(lse - M), b = exp(lse_s[s] - M), sum = a + b;
    const Acc wa = a / sum, wb = b / sum;
    for (int j = 0; j < width; ++j)
      acc[size_t(j)] = store(f, acc[size_t(j)] * wa + store(f, o_s[s][size_t(j)]) * wb);
    lse = M + log(sum);
  }
  return lse;
}

// Split-KV (FlashDecoding): the row's tokens in contiguous chunks of `per`, each attended alone
// (its lse and normalized output in Acc), then combined by lse weights. A yardstick's order
// (profile_math.hpp), so that a split kernel's rounding of each chunk's lse is sampled too.
template <class Acc, class Logit, class Value>
Acc attend_split(const std::vector<int64_t>& tokens, const Logit& logit, const Value& value,
                 int width, std::vector<Acc>& acc, const RowRounding& rr, size_t per) {
  using std::exp;
  using std::log;
  std::vector<Acc> lse_s;
  std::vector<std::vector<Acc>> o_s;
  const size_t n = tokens.size();
  {
    SumOrder inner = sum_order();
    inner.splits = 1, inner.chunk = 0;
    const SumOrder saved = std::exchange(sum_order(), inner);
    for (size_t at = 0; at < n; at += per) {
      o_s.emplace_back();
      lse_s.push_back(
          attend_row(std::vector<int64_t>(tokens.begin() + std::ptrdiff_t(at),
                                          tokens.begin() + std::ptrdiff_t(std::min(n, at + per))),
                     logit, value, width, o_s.back(), rr));
    }
    sum_order() = saved;
  }
  if (rr.partials) return merge_stored(lse_s, o_s, width, acc, *rr.partials);
  Acc M = lse_s[0];
  for (Acc l : lse_s) M = std::max(M, l);
  Acc sum = 0;
  for (Acc l : lse_s) sum += exp(l - M);
  const Acc lse = M + log(sum);
  acc.assign(size_t(width), Acc(0));
  for (size_t s = 0; s < lse_s.size(); ++s) {
    const Acc w = exp(lse_s[s] - lse);
    for (int j = 0; j < width; ++j) acc[size_t(j)] += w * o_s[s][size_t(j)];
  }
  return lse;
}

template <class Acc, class Logit, class Value>
Acc attend_row(const std::vector<int64_t>& tokens, const Logit& logit, const Value& value,
               int width, std::vector<Acc>& acc, const RowRounding& rr) {
  // A design that stores P after the division is a module's (one softmax over the whole row):
  // its correct implementations never split the row, and per-chunk normalized, stored P has a
  // row scale error ~10x a module's (zoo seed 72533), so no split is sampled for it.
  if constexpr (std::is_floating_point_v<Acc>)
    if (const size_t per = sum_order().chunk_tokens(tokens.size()); per && !rr.p_normalized)
      return attend_split(tokens, logit, value, width, acc, rr, per);
  std::vector<Acc> p;
  p.reserve(tokens.size());
  for (int64_t t : tokens) p.push_back(rr.score ? dithered_store(*rr.score, logit(t)) : logit(t));
  Acc lse, sum = 1;
  if constexpr (std::is_floating_point_v<Acc>) {
    if (rr.p && !rr.p_normalized) {  // a kernel's tile: exp(l - m) stored, divided by the sum last
      lse = rr.exp2 ? softmax_base2(p, &sum) : softmax(p, &sum);
    } else {
      lse = rr.exp2 ? softmax_base2(p) : softmax(p);
    }
  } else {
    lse = softmax(p);  // the error-bound type bounds the natural-base designs only
  }
  if constexpr (std::is_floating_point_v<Acc>)
    if (rr.sink_in_p && rr.sink > -std::numeric_limits<double>::infinity() && !tokens.empty()) {
      const Acc f = sink_factor(Acc(rr.sink), lse);  // p_t / (1 + exp(s - lse)), then stored
      for (Acc& x : p) x *= f;
    }
  if (rr.p)
    for (Acc& x : p) x = store(*rr.p, x);
  if constexpr (std::is_floating_point_v<Acc>)
    if (rr.p && rr.p_sum_stored && !rr.p_normalized && !p.empty()) {  // sum of the stored tile
      const Acc stored_sum = ordered_sum<Acc>(int(p.size()), [&](int t) { return p[size_t(t)]; });
      lse += std::log(stored_sum) - std::log(sum);
      sum = stored_sum;
    }
  acc.assign(size_t(width), Acc(0));
  ordered_accumulate<Acc>(
      int64_t(tokens.size()), width, [&](int64_t n) { return p[size_t(n)]; },
      [&](int64_t n) { return value(tokens[size_t(n)]); }, acc.data());
  if constexpr (std::is_floating_point_v<Acc>)
    if (rr.p && !rr.p_normalized)
      for (Acc& x : acc) x /= sum;
  return lse;
}

// How many latent values (T x r) a cache holds in Acc. A longer sequence's rows are read from the
// case as they are needed (LatentSource: the same values), so that a long context holds no second
// [T, r] copy of its cache (a 256k-token bf16 cache is 0.54 GB in fp32). Per thread, so that a
// test can make a short case read its rows.
inline int64_t& held_latent_limit() {
  thread_local int64_t n = int64_t(1) << 22;
  return n;
}

// The latent cache of one sequence as a decode kernel reads it (A.3).
template <class Acc>
struct LatentCache {
  std::vector<Acc> c;        // [T, r] as stored (fp8: code x scale in Acc), or empty: read from
  LatentSource source;       // the case (attach_rows)
  std::vector<Acc> rope;     // [T, d_r] kr^ (blockwise), gained rotated rope key (unified), or the
                             // rotated raw rope key (norm none), rounded to the stored dtype
  std::vector<Acc> alpha_k;  // [T, G] (1 in norm none)
};

// Sequence b's latent rows for a cache of T tokens: held in Acc up to held_latent_limit() values.
template <class Acc>
void attach_rows(LatentCache<Acc>& lc, const Case& k, int b, int64_t T) {
  lc.source = LatentSource(k, b);
  if (T * lc.source.width() <= held_latent_limit()) lc.c = latent_rows<Acc>(k, b, T);
}

// What latent_attend reads of a cache: a cache's arrays, or some of a design's own beside the rest
// of a shared cache (a design that rounds alpha_k copies [T, G], not the [T, r] rows).
template <class Acc>
struct LatentView {
  const Acc* c;  // [T, r], or null: rows read from `source`
  LatentSource source;
  const Acc* rope;     // [T, d_r]
  const Acc* alpha_k;  // [T, G]
  // A design's cache format (the fp8 cache dequantized to bf16): each row stored to it as it is
  // read, no rounded copy held.
  std::optional<DType> round_c;
  LatentView(const LatentCache<Acc>& lc)  // implicit: a whole cache is its own view
      : c(lc.c.empty() ? nullptr : lc.c.data()),
        source(lc.source),
        rope(lc.rope.data()),
        alpha_k(lc.alpha_k.data()) {}
  // Row t [r]: in c, or read (and rounded) into out [r]. Valid until the next call with out.
  const Acc* row(int64_t t, Acc* out) const {
    const int64_t r = source.width();
    if (c && !round_c) return c + t * r;
    if (c)
      std::copy_n(c + t * r, r, out);
    else
      source.read(t, 1, out);
    if (round_c)
      for (int64_t l = 0; l < r; ++l) out[l] = store(*round_c, out[l]);
    return out;
  }
};

// One absorbed query row (A.1-A.2).
template <class Acc>
struct LatentQuery {
  std::vector<Acc> q_latent, rope;  // [r], [d_r], rounded to the stored dtype
  Acc alpha_q = 0;                  // the reported statistic 1 / S^q
  Acc row_scale = 1;                // what multiplies alpha_k after the dot: alpha_q, or 1 when the
                                    // query already carries it (folded, normalized first) or none
};

// The reported lse of a row in a perturbed lse form (core/perturbation.hpp: LseForm; a diagnosis
// evaluates them): `logits` are the row's visible logits, `lse` their correct log-sum-exp.
template <class Acc>
Acc lse_in_form(LseForm form, const std::vector<Acc>& logits, Acc lse, Acc scale) {
  if constexpr (!std::is_floating_point_v<Acc>) {  // the error-bound type: the correct form only
    return lse;
  } else {
    if (form == LseForm::Natural || form == LseForm::Base2 || logits.empty()) return lse;
    Acc m = logits[0];
    for (Acc l : logits) m = std::max(m, l);
    if (form == LseForm::MaxUnscaled)
      return m / scale + (lse - m);  // m / sigma + log sum exp(l - m)
    Acc sum = 0;                     // Unscaled: log sum exp(l / sigma)
    for (Acc l : logits) sum += std::exp((l - m) / scale);
    return m / scale + std::log(sum);
  }
}

// conventions §1.5: an attention sink multiplies a row's normalized accumulator (out, or
// latent_out) by 1 / (1 + exp(s_h - lse)) in Acc, before the output rounding, as FlashMLA does;
// returns the lse the row reports (unchanged by a correct sink). A design that folds the sink into
// P (`rr.sink_in_p`: attend_row scaled P already) only reports the lse. The error-bound type has
// no proven step for the sink: the registry gives no bounds for sink cases.
template <class Acc>
Acc apply_sink(const Case& k, const Perturbation& p, int h, Acc lse, std::vector<Acc>& acc,
               const RowRounding& rr = {}) {
  if (!k.cfg.attn_sink) return lse;
  if constexpr (!std::is_floating_point_v<Acc>) {
    throw std::logic_error("no proven error bound for an attention sink");
  } else {
    const Acc s = Acc(k.sink(h));
    if (!rr.sink_in_p) {
      // A split-KV order's combine takes the sink as one more split (lse s, output 0): the row's
      // weight exp(lse - L) with L = logaddexp(lse, s) rounded in Acc carries L's absolute
      // rounding, u |L|, where 1 / (1 + exp(s - lse)) has a relative one (zoo seed 103052,
      // kernel_plain fp32 with a sink: worst_row 10.5x the samples' before).
      const bool split = sum_order().splitting() && p.sink == SinkForm::OutOnly &&
                         lse > -std::numeric_limits<Acc>::infinity();
      const Acc f = split ? std::exp(lse - (lse > s ? lse + std::log(Acc(1) + std::exp(s - lse))
                                                    : s + std::log(Acc(1) + std::exp(lse - s))))
                          : hook::sink_scale(p, true, s, lse);
      for (Acc& x : acc) x = product(x, f);
    }
    return hook::sink_lse(p, true, s, lse);
  }
}

// The row rounding of design d for head h: its sink logit where the design folds it into P.
inline RowRounding row_rounding(const Design& d, DType A, const Case& k, int h) {
  RowRounding rr = RowRounding::of(d, A);
  if (rr.sink_in_p && k.cfg.attn_sink) rr.sink = k.sink(h);
  return rr;
}

// A.4-A.5 for one row against one sequence's cache: latent and rope scores of the visible tokens,
// the logit of core/attention_math.hpp, softmax, latent_out [r] (in `lat`, unrounded). The
// perturbation maps a token to the one whose alpha_k scales it, may round the latent score's
// partial sums to bf16, drop alpha_k from the unified rope part, average two KV splits instead
// of weighting them by their lse, or report lse in another form (all correct by default).
template <class Acc>
Acc latent_attend(const MlaConfig& cf, const LatentQuery<Acc>& q, const LatentView<Acc>& cache,
                  int g, const std::vector<int64_t>& tokens, Acc scale, const Perturbation& pt,
                  const RowRounding& rr, std::vector<Acc>& lat) {
  const int r = cf.latent_rank, dr = cf.d_r, G = cf.groups;
  const bool unified = cf.norm == NormMode::Unified;
  // The latent scores of the row's tokens, formed together (ordered_dots: each the dot in the
  // current order); the bf16-partial-sum mutant forms its own.
  std::vector<Acc> scores(  // [T], by token (a sparse row's tokens need not be sorted)
      tokens.empty() ? 0 : size_t(*std::max_element(tokens.begin(), tokens.end()) + 1));
  // Rows read from the case (or rounded as read) land here, a block of tokens at a time.
  const size_t block = std::min(tokens.size(), size_t(kProjectTokens));
  std::vector<Acc> buf(!cache.c || cache.round_c ? std::max<size_t>(block, 1) * size_t(r) : 0);
  const auto slot = [&](size_t n) { return buf.empty() ? nullptr : &buf[n * size_t(r)]; };
  const auto alpha_k = [&](int64_t t) {
    return cache.alpha_k[size_t(hook::alpha_k_token(pt, t) * G + g)];
  };
  // A folded design's keys: alpha_k x the row, stored (the value side reads the row unscaled).
  std::vector<Acc> keys(rr.key_fold ? block * size_t(r) : 0);
  const auto key_row = [&](int64_t t, size_t n) {
    const Acc* row = cache.row(t, slot(n));
    if (!rr.key_fold) return row;
    const Acc a = alpha_k(t);
    const DType f = *rr.key_fold;
    Acc* key = &keys[n * size_t(r)];
    for (int l = 0; l < r; ++l) key[l] = store(f, a * row[l]);
    return static_cast<const Acc*>(key);
  };
  if (!pt.score_lowp) {  // a block of tokens at a time: each score is its own dot
    std::vector<const Acc*> rows;
    std::vector<Acc> s(block);
    for (size_t n0 = 0; n0 < tokens.size(); n0 += block) {
      const size_t m = std::min(tokens.size() - n0, block);
      rows.clear();
      for (size_t n = 0; n < m; ++n) rows.push_back(key_row(tokens[n0 + n], n));
      ordered_dots(q.q_latent.data(), rows.data(), int64_t(m), r, s.data());
      for (size_t n = 0; n < m; ++n) scores[size_t(tokens[n0 + n])] = s[n];
    }
  }
  std::vector<Acc> rope_key(rr.key_fold && unified ? size_t(dr) : 0);  // a folded rope key [d_r]
  const bool chain = logit_dither().draw >= 0 && logit_dither().chain;
  auto logit = [&](int64_t t) {
    Acc latent = pt.score_lowp ? dot_maybe_lowp(q.q_latent.data(), cache.row(t, slot(0)), r, true)
                               : scores[size_t(t)];
    Acc rope = dot(q.rope.data(), cache.rope + t * dr, dr);
    // a folded design's alpha_k is in the keys; under the unified norm in the rope key too
    const Acc ak = rr.key_fold ? Acc(1) : alpha_k(t);
    if (rr.key_fold && unified) {
      const Acc a = alpha_k(t);
      for (int j = 0; j < dr; ++j)
        rope_key[size_t(j)] = store(*rr.key_fold, a * cache.rope[t * dr + j]);
      rope = dot(q.rope.data(), rope_key.data(), dr);
    }
    if (rr.score) latent = store(*rr.score, latent), rope = store(*rr.score, rope);
    if (rr.eager) {  // as a module's ops: ((latent x alpha_q) x alpha_k + rope) x sigma (unified:
      // (latent + rope) x alpha_q x alpha_k x sigma), every product and sum stored, each dithered
      // in a chain draw: another module rounds each one differently (zoo seed 104680, an fp8
      // `large_logits` near tie 0.63 off in a correct eager module, 11x what draws of the final
      // logit reached).
      const auto e = [&](Acc x) {
        return chain ? dithered_store(*rr.eager, x) : store(*rr.eager, x);
      };
      const Acc x = unified ? e(e(e(e(latent) + e(rope)) * q.row_scale) * ak)
                            : e(e(e(e(latent) * q.row_scale) * ak) + e(rope));
      return e(scale * x);
    }
    const Acc s = q.row_scale * ak;
    if (unified && pt.rope_unscaled_by_alpha_k)
      return Acc(scale * (s * latent + q.row_scale * rope));
    return latent_logit(unified, scale, s, latent, rope);
  };
  // ordered_accumulate reads one value row at a time: one buffer serves.
  auto value = [&](int64_t t) { return cache.row(t, slot(0)); };
  Acc lse = attend_row(tokens, logit, value, r, lat, rr);
  if (pt.split_average && tokens.size() >= 2) {  // each half normalized alone, then averaged
    const size_t half = tokens.size() / 2;
    std::vector<Acc> a, b;
    attend_row(std::vector<int64_t>(tokens.begin(), tokens.begin() + std::ptrdiff_t(half)), logit,
               value, r, a, rr);
    attend_row(std::vector<int64_t>(tokens.begin() + std::ptrdiff_t(half), tokens.end()), logit,
               value, r, b, rr);
    for (int l = 0; l < r; ++l) lat[size_t(l)] = (a[size_t(l)] + b[size_t(l)]) / Acc(2);
  }
  if (pt.lse_form != LseForm::Natural) {
    std::vector<Acc> logits;
    for (int64_t t : tokens) logits.push_back(logit(t));
    lse = lse_in_form(pt.lse_form, logits, lse, scale);
  }
  return lse;
}

}  // namespace qkmla::impl
