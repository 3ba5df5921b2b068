#include "reference/explicit_rows.hpp"

#include <limits>

#include "core/attention_math.hpp"

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

struct KeyRow {
  std::vector<MpVec> kc, kr;  // kc^ [G][d_c]; kr^ [G][d_r] (blockwise, none: one shared entry)
  MpVec alpha_k;              // [G]
  MpVec zk, zk_rot;           // raw and rotated k_pe [d_r]
  MpVec gain_c, gain_r;       // the key gains (exact): content [d_c], rope [d_r]
};

// E.1-E.4 on cached token t of sequence b, for the groups marked in `needed` (the others keep
// stale values), into `row`: one KeyRow serves every token, so its MPFR values are allocated once.
void key_row(const Case& k, Dots::Cursor& k0c_exact, int b, int64_t t, const Mp& eps,
             const std::vector<char>& needed, KeyRow& row) {
  const MlaConfig& c = k.cfg;
  const Tensor& kpe = k.get("k_pe");
  const bool ntr = c.rope_order == RopeOrder::NormThenRope;
  const bool per_group_rope = c.norm == NormMode::Unified;
  if (row.kc.empty()) {  // first token: allocate
    row.kc.assign(size_t(c.groups), MpVec(size_t(c.d_c)));
    row.alpha_k.resize(size_t(c.groups));
    row.kr.assign(per_group_rope ? size_t(c.groups) : 1, MpVec(size_t(c.d_r)));
    row.zk.resize(size_t(c.d_r));
    if (c.norm != NormMode::None) {  // multiplying by an exact Mp rounds as mpfr_mul_d does
      const bool uni = c.norm == NormMode::Unified;
      const Tensor& gc = k.get(uni ? "gamma_k" : "gamma_ck");
      const Tensor& gr = k.get(uni ? "gamma_k" : "gamma_rk");
      row.gain_c = to_mp(gc.data.data(), c.d_c);
      row.gain_r = to_mp(gr.data.data() + (uni ? c.d_c : 0), c.d_r);
    }
  }
  const double* zk_raw = kpe.ptr({b, t, 0});
  for (int j = 0; j < c.d_r; ++j) row.zk[size_t(j)] = zk_raw[j];  // exact
  row.zk_rot = row.zk;
  rotate(row.zk_rot, k, t);
  const MpVec& rope_stat = ntr ? row.zk : row.zk_rot;  // the rope part the norms see
  for (int g = 0; g < c.groups; ++g) {
    if (!needed[size_t(g)]) continue;
    MpVec& k0c = row.kc[size_t(g)];  // E.1: k0c[t, g] = c[t] . WK_g, exact then rounded once
    for (int j = 0; j < c.d_c; ++j)
      set_expansion(k0c[size_t(j)], k0c_exact.entry(t, g * c.d_c + j));
    Mp& alpha_k = row.alpha_k[size_t(g)];
    if (c.norm == NormMode::None) {  // plain MLA: the raw key
      alpha_k = 1;
      continue;
    }
    if (c.norm == NormMode::Blockwise) {
      alpha_k = inv_rms(sum_squares(k0c), c.d_c, eps);    // E.2
      scale_gain(k0c, 0, c.d_c, row.gain_c, 0, alpha_k);  // E.3
      continue;
    }
    alpha_k = inv_rms(sum_squares(k0c) + sum_squares(rope_stat), c.d_c + c.d_r, eps);  // U.1
    scale_gain(k0c, 0, c.d_c, row.gain_c, 0, alpha_k);
    MpVec& kr = row.kr[size_t(g)];
    kr = rope_stat;
    scale_gain(kr, 0, c.d_r, row.gain_r, 0, alpha_k);
    if (ntr) rotate(kr, k, t);
  }
  if (c.norm == NormMode::None) row.kr[0] = row.zk_rot;
  if (c.norm == NormMode::Blockwise) {
    MpVec& kr = row.kr[0];
    kr = rope_stat;
    scale_gain(kr, 0, c.d_r, row.gain_r, 0, inv_rms(sum_squares(kr), c.d_r, eps));
    if (ntr) rotate(kr, k, t);
  }
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
      k0c_(d.cursor(k, b, Dots::Which::K0c, counts)),
      v_(d.cursor(k, b, Dots::Which::V, counts)) {
  for (int i = 0; i < c_.s_q; ++i)
    for (int h = h0; h < h1; ++h) ids_.push_back(i * c_.heads + h);
  const size_t n = ids_.size();
  for (int h = h0; h < h1; ++h) needed_[size_t(c_.group_of(h))] = 1;
  for (int g = 0; g < c_.groups; ++g) {
    const int first = g * c_.heads_per_group();  // the first head of g
    owned_[size_t(g)] = first >= h0 && first < h1;
  }
  logits_.resize(n);
  for (PackedMpVec& l : logits_) l.reserve(size_t(T_));
  lse_.resize(n);
  out_.assign(n, MpVec(size_t(c_.d_v), Mp(0)));
  lat_.assign(latent_ ? n : 0, MpVec(size_t(c_.latent_rank), Mp(0)));
  seen_.assign(n, 0);
}

void ExplicitRows::keys(int64_t t0, int64_t t1) {
  Tensor& alpha_k_hi = o_.tensors.at("alpha_k");
  KeyRow key;
  for (int64_t t = t0; t < t1; ++t) {
    key_row(k_, k0c_, b_, t, eps_, needed_, key);
    for (int g = 0; g < c_.groups; ++g)
      if (owned_[size_t(g)])
        store(o_, "alpha_k", alpha_k_hi.index({b_, t, g}), key.alpha_k[size_t(g)]);
    for (size_t x = 0; x < logits_.size(); ++x) {
      const int row = ids_[x], i = row / c_.heads, h = row % c_.heads;
      if (!token_visible(c_.causal, T_, c_.s_q, i, t)) continue;
      const QueryRow& q = rows_[size_t(row)];
      const size_t g = size_t(c_.group_of(h));
      const MpVec& kr = key.kr[key.kr.size() == 1 ? 0 : g];
      logits_[x].push_back(plain_logit(scale_, dot(q.qc, key.kc[g]), dot(q.qr, kr)));  // E.5
    }
  }
}

void ExplicitRows::softmax() {  // E.6; p = exp(logit - lse) is formed again as E.7 reads it
  for (size_t x = 0; x < logits_.size(); ++x) {
    lse_[x] = softmax_lse(logits_[x]);
    store(o_, "lse", int64_t(b_ * c_.s_q * c_.heads + ids_[x]), lse_[x]);
  }
}

// E.7: out = sum_t p v[t, g(h)], v exact then rounded once; latent_out likewise with c[t].
void ExplicitRows::values(int64_t t0, int64_t t1) {
  const Tensor& kv = k_.latent();
  Mp tmp, p, logit;
  std::vector<MpVec> v(size_t(c_.groups), MpVec(size_t(c_.d_v)));  // v[t, g] [G][d_v]
  MpVec ct(latent_ ? size_t(c_.latent_rank) : 0);                  // c[t] [r]
  for (int64_t t = t0; t < t1; ++t) {
    for (int g = 0; g < c_.groups; ++g)
      if (needed_[size_t(g)])
        for (int j = 0; j < c_.d_v; ++j)
          set_expansion(v[size_t(g)][size_t(j)], v_.entry(t, g * c_.d_v + j));
    for (size_t j = 0; j < ct.size(); ++j) ct[j] = kv.at({b_, t, int64_t(j)});
    for (size_t x = 0; x < out_.size(); ++x) {
      const int row = ids_[x], i = row / c_.heads, h = row % c_.heads;
      if (!token_visible(c_.causal, T_, c_.s_q, i, t)) continue;
      logits_[x].get(seen_[x]++, logit);
      p = exp(logit - lse_[x]);
      for (int j = 0; j < c_.d_v; ++j)
        mac(out_[x][size_t(j)], p, v[size_t(c_.group_of(h))][size_t(j)], tmp);
      for (size_t j = 0; j < ct.size(); ++j) mac(lat_[x][j], p, ct[j], tmp);
    }
  }
}

void ExplicitRows::finish() {
  for (size_t x = 0; x < out_.size(); ++x) {
    const int64_t base = int64_t(b_ * c_.s_q * c_.heads + ids_[x]);
    for (int j = 0; j < c_.d_v; ++j) store(o_, "out", base * c_.d_v + j, out_[x][size_t(j)]);
    if (latent_)
      for (int j = 0; j < c_.latent_rank; ++j)
        store(o_, "latent_out", base * c_.latent_rank + j, lat_[x][size_t(j)]);
  }
}

}  // namespace qkmla::ref
