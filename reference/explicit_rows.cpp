#include "reference/explicit_rows.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/attention_math.hpp"
#include "reference/mp_matmul.hpp"

namespace qkmla::ref {

QueryRow query_row(const Case& k, int b, int i, int h, const Mp& eps) {
  const MlaConfig& c = k.cfg;
  const Tensor& qn = k.get("q_nope");
  const Tensor& qp = k.get("q_pe");
  QueryRow row;
  row.qc = to_mp(qn.ptr({b, i, h, 0}), c.d_c);  // [d_c]
  row.qr = to_mp(qp.ptr({b, i, h, 0}), c.d_r);  // [d_r]
  const int64_t pos = k.pos(b, i);
  const bool has_pos = pos >= 0;  // T_b = 0: no position, no visible key
  const bool ntr = c.rope_order == RopeOrder::NormThenRope;
  if (c.norm == NormMode::None) {  // plain MLA: raw content, rotated raw rope part
    row.alpha_q = 1;
    if (has_pos) rotate(row.qr, k, pos);
    return row;
  }
  if (c.norm == NormMode::Blockwise) {
    row.alpha_q = inv_rms(sum_squares(row.qc), c.d_c, eps);           // E.2
    scale_gain(row.qc, 0, c.d_c, k.get("gamma_cq"), 0, row.alpha_q);  // E.3
    if (!has_pos) return row;
    if (!ntr) rotate(row.qr, k, pos);  // E.4 (rope_then_norm)
    scale_gain(row.qr, 0, c.d_r, k.get("gamma_rq"), 0, inv_rms(sum_squares(row.qr), c.d_r, eps));
    if (ntr) rotate(row.qr, k, pos);  // E.4 (norm_then_rope)
    return row;
  }
  // U.1: one statistic over [content; rope], the rope part rotated first in rope_then_norm.
  if (!ntr) {
    if (!has_pos) {
      row.alpha_q = std::numeric_limits<double>::quiet_NaN();  // depends on a position
      return row;
    }
    rotate(row.qr, k, pos);
  }
  row.alpha_q = inv_rms(sum_squares(row.qc) + sum_squares(row.qr), c.d_c + c.d_r, eps);
  scale_gain(row.qc, 0, c.d_c, k.get("gamma_q"), 0, row.alpha_q);
  scale_gain(row.qr, 0, c.d_r, k.get("gamma_q"), c.d_c, row.alpha_q);
  if (ntr && has_pos) rotate(row.qr, k, pos);
  return row;
}

namespace {

// Tokens of a block processed together: per group, their keys are formed one after another, so a
// group's query rows stay in cache (MPFR values are scattered on the heap; this order measured ~5 %
// faster per run than token by token over every group). The order of the operations on each value
// is unchanged, so the bits are too.
constexpr int64_t kChunk = 64;
// Tokens whose p enter E.7's exact products with c[t] (X.4) together: 256, as A.5 takes them.
constexpr int64_t kLatentBlock = 256;

// Significant bits of a finite double (53 for non-finite ones: the caller's bound then holds).
int significant_bits(double d) {
  if (d == 0 || !std::isfinite(d)) return d == 0 ? 1 : 53;
  int e = 0;
  auto m = uint64_t(std::ldexp(std::fabs(std::frexp(d, &e)), 53));  // 53-bit integer significand
  return 53 - std::countr_zero(m);
}

}  // namespace

ExplicitRows::ExplicitRows(const Case& k, const Dots& d, int b, const std::vector<QueryRow>& rows,
                           int h0, int h1, bool with_latent_out, bool counts, Outputs& o)
    : k_(k),
      c_(k.cfg),
      b_(b),
      T_(k.cfg.seqlens[size_t(b)]),
      rows_(rows),
      latent_(with_latent_out),
      o_(o),
      eps_(k.cfg.eps),
      scale_(k.cfg.softmax_scale),
      needed_(size_t(k.cfg.groups), 0),
      owned_(size_t(k.cfg.groups), 0),
      k0c_(d.cursor(k, b, counts)) {
  for (int i = 0; i < c_.s_q; ++i)
    for (int h = h0; h < h1; ++h) ids_.push_back(i * c_.heads + h);
  const size_t n = ids_.size();
  by_group_.resize(size_t(c_.groups));
  for (size_t x = 0; x < n; ++x) by_group_[size_t(c_.group_of(ids_[x] % c_.heads))].push_back(x);
  for (int h = h0; h < h1; ++h) needed_[size_t(c_.group_of(h))] = 1;
  for (int g = 0; g < c_.groups; ++g) {
    const int first = g * c_.heads_per_group();  // the first head of g
    owned_[size_t(g)] = first >= h0 && first < h1;
  }
  logits_.resize(n);
  for (PackedMpVec& l : logits_) l.reserve(size_t(T_));
  lse_.resize(n);
  lat_.assign(n * size_t(c_.latent_rank), ExactSum());
  seen_.assign(n, 0);
  key_.resize(size_t(c_.d_c));
  qg_.resize(n);
  if (c_.norm == NormMode::None) {  // plain MLA: the raw key, no gain
    for (size_t x = 0; x < n; ++x) qg_[x] = rows_[size_t(ids_[x])].qc;
    return;
  }
  const bool uni = c_.norm == NormMode::Unified;
  const Tensor& gr = k.get(uni ? "gamma_k" : "gamma_rk");
  gain_r_ = to_mp(gr.data.data() + (uni ? c_.d_c : 0), c_.d_r);        // exact Mp: rounds as mul_d
  const double* gc = k.get(uni ? "gamma_k" : "gamma_ck").data.data();  // [d_c]
  int gain_bits = 1;  // the gains' widest significand: qc^_j * gamma_j fits prec + gain_bits
  for (int j = 0; j < c_.d_c; ++j) gain_bits = std::max(gain_bits, significant_bits(gc[j]));
  for (size_t x = 0; x < n; ++x) {
    const MpVec& qc = rows_[size_t(ids_[x])].qc;
    qg_[x].resize(qc.size());
    for (size_t j = 0; j < qc.size(); ++j) {
      mpfr_ptr y = qg_[x][j].backend().data();
      mpfr_set_prec(y, mpfr_get_prec(qc[j].backend().data()) + gain_bits);
      mpfr_mul_d(y, qc[j].backend().data(), gc[j], MPFR_RNDN);  // exact at that precision
    }
  }
}

bool ExplicitRows::visible(size_t x, int64_t t) const {
  return k_.visible(b_, ids_[x] / c_.heads, t);
}

// E.1-E.4 of the rope part of token t's key (blockwise, none: one for every group) and, for each
// visible row, its rope logit term; unified: the part its norm sees and that part's sum of squares.
void ExplicitRows::token_rope(int64_t t, size_t slot) {
  const bool ntr = c_.rope_order == RopeOrder::NormThenRope;
  const Tensor& kpe = k_.get("k_pe");
  std::vector<double> held;
  const double* zk_raw = kpe.rows(kpe.index({b_, t, 0}), c_.d_r, held);
  MpVec& z = rope_[slot];                                     // [d_r]
  for (int j = 0; j < c_.d_r; ++j) z[size_t(j)] = zk_raw[j];  // exact
  if (c_.norm == NormMode::Unified) {  // U.1: the rope part the norm sees (rotated: rope_then_norm)
    if (!ntr) rotate(z, k_, t);
    rope_ss_[slot] = sum_squares(z);
    // the gained part, rotated in norm_then_rope; its 1/S scales the whole logit (group_key)
    scale_gain(z, 0, c_.d_r, gain_r_, 0, Mp(1));
    if (ntr) rotate(z, k_, t);
    return;
  }
  if (c_.norm == NormMode::None) {
    rotate(z, k_, t);
  } else {  // E.2-E.4 with the rope gain
    if (!ntr) rotate(z, k_, t);
    scale_gain(z, 0, c_.d_r, gain_r_, 0, inv_rms(sum_squares(z), c_.d_r, eps_));
    if (ntr) rotate(z, k_, t);
  }
  for (size_t x = 0; x < ids_.size(); ++x)
    if (visible(x, t)) rope_dot_[x][slot] = dot(rows_[size_t(ids_[x])].qr, z);
}

// E.1-E.5 for group g on token t. The key k0c[t, g] stays exact (X.7): its sum of squares is
// exact, rounded once into E.2's statistic, and each visible row's content term is the exact sum
// sum_j (qc^_j gamma_j) k0c_j rounded once, times 1/S (E.3's gain and statistic applied to the
// dot instead of to each key value: the same value in exact arithmetic, E.5). Unified: the rope
// part qr^ . Rot(gamma_r ⊙ z) joins the same exact sum, since 1/S scales both parts (U.1).
void ExplicitRows::group_key(int g, int64_t t, size_t slot) {
  const bool uni = c_.norm == NormMode::Unified;
  // S.6: the content sum is the same exact value at both precisions only for plain MLA, whose
  // query is the raw q_nope; a normalized query is rounded at each run's own precision (E.3).
  const bool plain = c_.norm == NormMode::None;
  const bool take_content = take_ && plain;
  if (!take_content)
    for (int j = 0; j < c_.d_c; ++j) key_[size_t(j)] = k0c_.entry(t, g * c_.d_c + j);
  Mp alpha_k = 1;  // plain MLA: the raw key
  if (!plain) {
    Mp sum_sq;
    const auto at = [&](KeySums::Sequence* s) { return size_t((t - s->t0) * c_.groups + g); };
    if (take_) {
      take_->sum_sq.get(at(take_), sum_sq);
    } else {
      ExactSum& ss = scratch_sum();
      for (const auto& e : key_) ss.add_square(e);
      ss.round(sum_sq.backend().data());
      if (give_ && owned_[size_t(g)]) {
        ss.round(handed_.backend().data());
        give_->sum_sq.set(at(give_), handed_);
      }
    }
    alpha_k = c_.norm == NormMode::Blockwise
                  ? inv_rms(sum_sq, c_.d_c, eps_)                             // E.2
                  : inv_rms(sum_sq + rope_ss_[slot], c_.d_c + c_.d_r, eps_);  // U.1
  }
  if (owned_[size_t(g)]) {
    store(o_, "alpha_k", o_.tensors.at("alpha_k").index({b_, t, g}), alpha_k);
    if (keep_) keep_->set(size_t(t * c_.groups + g), alpha_k);
  }
  Mp content;
  for (size_t x : by_group_[size_t(g)]) {
    if (!visible(x, t)) continue;
    const auto id = size_t(ids_[x]);
    if (take_content) {
      take_->content[id].get(take_->read[id]++, content);
    } else {
      ExactSum& acc = scratch_sum();
      acc.add_dot(qg_[x], key_);
      if (uni) acc.add_dot(rows_[id].qr, rope_[slot]);
      acc.round(content.backend().data());
      if (give_ && plain) {
        acc.round(handed_.backend().data());
        give_->content[id].push_back(handed_);
      }
    }
    if (!plain) content *= alpha_k;
    logits_[x].push_back(plain_logit(scale_, content, uni ? Mp(0) : rope_dot_[x][slot]));  // E.5
  }
}

void KeySums::begin_phase(const Case& k, int b, int64_t t0, int64_t t1) {
  const MlaConfig& c = k.cfg;
  Sequence& s = per_sequence.at(size_t(b));  // sized by the run, which holds pointers into it
  s.t0 = t0;
  s.sum_sq = PackedMpVec(bits);
  s.sum_sq.resize(size_t((t1 - t0) * c.groups));
  s.content.assign(size_t(c.s_q * c.heads), PackedMpVec(bits));
  s.read.assign(size_t(c.s_q * c.heads), 0);
}

void ExplicitRows::give_sums(KeySums::Sequence* give, int bits) {
  give_ = give;
  mpfr_set_prec(handed_.backend().data(), bits);
}

void ExplicitRows::keys(int64_t t0, int64_t t1) {
  const size_t chunk = size_t(std::min(kChunk, t1 - t0));
  rope_.assign(chunk, MpVec(size_t(c_.d_r)));
  rope_ss_.resize(chunk);
  rope_dot_.assign(ids_.size(), MpVec(chunk));
  for (int64_t c0 = t0; c0 < t1; c0 += kChunk) {
    const int64_t c1 = std::min(t1, c0 + kChunk);
    for (int64_t t = c0; t < c1; ++t) token_rope(t, size_t(t - c0));
    for (int g = 0; g < c_.groups; ++g)
      if (needed_[size_t(g)])
        for (int64_t t = c0; t < c1; ++t) group_key(g, t, size_t(t - c0));
  }
}

void ExplicitRows::softmax() {  // E.6; p = exp(logit - lse) is formed again as E.7 reads it
  for (size_t x = 0; x < logits_.size(); ++x) {
    lse_[x] = softmax_lse(logits_[x]);
    store(o_, "lse", int64_t(b_ * c_.s_q * c_.heads + ids_[x]), lse_[x]);
  }
}

// E.7 (X.8): out = sum_t p v[t, g(h)] with v = c[t] WV_g exact, evaluated as the same exact value
// (sum_t p c[t]) WV_g: here the exact sums L = sum_t p c[t] of every row over a block of tokens
// (X.4 into X.6: p rounded once, its products with c[t] exact); finish() multiplies them by WV
// exactly and rounds once. L rounded once is latent_out.
void ExplicitRows::values(int64_t t0, int64_t t1) {
  const Tensor& kv = k_.latent();
  const int64_t r = c_.latent_rank;
  std::vector<double> held;  // c of the block, [nb, r]
  Mp logit;
  for (int64_t s0 = t0; s0 < t1; s0 += kLatentBlock) {
    const int64_t s1 = std::min(t1, s0 + kLatentBlock);
    std::vector<MpVec> p(ids_.size(), MpVec(size_t(s1 - s0)));  // [rows][nb]: p_t, 0 not visible
    for (size_t x = 0; x < ids_.size(); ++x)
      for (int64_t t = s0; t < s1; ++t) {
        if (!visible(x, t)) continue;
        logits_[x].get(seen_[x]++, logit);
        p[x][size_t(t - s0)] = exp(logit - lse_[x]);
      }
    add_mp_times_doubles(p, s1 - s0, kv.rows(kv.index({b_, s0, 0}), (s1 - s0) * r, held), r, r,
                         lat_);
  }
}

void ExplicitRows::finish() {
  const Mp one = 1;
  const Tensor& wv = k_.get("w_uv");  // [r, G d_v]
  const int64_t r = c_.latent_rank, ld = wv.shape[1];
  std::vector<ExactSum> out(size_t(c_.d_v));  // [d_v]
  Mp v, L;
  for (size_t x = 0; x < ids_.size(); ++x) {
    const int64_t base = int64_t(b_ * c_.s_q * c_.heads + ids_[x]);
    const int64_t g = c_.group_of(ids_[x] % c_.heads);
    // K.1: the sink scales out (and latent_out); lse is stored without it
    const Mp f = c_.attn_sink ? sink_factor(Mp(k_.sink(ids_[x] % c_.heads)), lse_[x]) : one;
    auto put = [&](const char* name, int64_t flat, const ExactSum& sum) {
      sum.round(v.backend().data());
      if (c_.attn_sink) v *= f;
      store(o_, name, flat, v);
    };
    for (ExactSum& o : out) o.clear();
    for (int64_t l = 0; l < r; ++l) {  // out = L WV_g, every product exact (X.8)
      const ExactSum& sum = lat_[x * size_t(r) + size_t(l)];
      if (latent_) put("latent_out", base * r + l, sum);
      sum.value(L.backend().data());
      ExactSum::add_scaled(
          out, L.backend().data(),
          std::span<const double>(&wv.data[size_t(l * ld + g * c_.d_v)], size_t(c_.d_v)));
    }
    for (int j = 0; j < c_.d_v; ++j) put("out", base * c_.d_v + j, out[size_t(j)]);
  }
}

}  // namespace qkmla::ref
