// ref.explicit: SPEC §1.1 evaluated stage by stage (proofs/reference.md, steps E.1-E.7, U.1).
#include <chrono>

#include "core/attention_math.hpp"
#include "reference/ref_common.hpp"
#include "reference/reference.hpp"

namespace qkmla::ref {

namespace {

struct QueryRow {
  MpVec qc, qr;  // qc^ [d_c], qr^ [d_r]
  Mp alpha_q;    // 1 / S^q
};

// E.2-E.4 on one query row (b, i, h).
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

struct KeyRow {
  std::vector<MpVec> kc, kr;  // kc^ [G][d_c]; kr^ [G][d_r] (blockwise: one shared entry)
  MpVec alpha_k;              // [G]
};

// E.1-E.4 on cached token t of sequence b.
KeyRow key_row(const Case& k, Dots::Cursor& k0c_exact, int b, int64_t t, const Mp& eps) {
  const MlaConfig& c = k.cfg;
  const Tensor& kpe = k.get("k_pe");
  const bool ntr = c.rope_order == RopeOrder::NormThenRope;
  KeyRow row;
  const MpVec zk = to_mp(kpe.ptr({b, t, 0}), c.d_r);  // raw k_pe [d_r]
  MpVec zk_rot = zk;
  rotate(zk_rot, k, t);
  for (int g = 0; g < c.groups; ++g) {
    MpVec k0c(size_t(c.d_c));  // E.1: k0c[t, g] = c[t] . WK_g, exact then rounded once
    for (int j = 0; j < c.d_c; ++j)
      set_expansion(k0c[size_t(j)], k0c_exact.entry(t, g * c.d_c + j));
    if (c.norm == NormMode::None) {  // plain MLA: the raw key
      row.alpha_k.push_back(Mp(1));
      row.kc.push_back(std::move(k0c));
      continue;
    }
    if (c.norm == NormMode::Blockwise) {
      row.alpha_k.push_back(inv_rms(sum_squares(k0c), c.d_c, eps));         // E.2
      scale_gain(k0c, 0, c.d_c, k.get("gamma_ck"), 0, row.alpha_k.back());  // E.3
      row.kc.push_back(std::move(k0c));
      continue;
    }
    const MpVec& rope_stat = ntr ? zk : zk_rot;  // U.1
    row.alpha_k.push_back(inv_rms(sum_squares(k0c) + sum_squares(rope_stat), c.d_c + c.d_r, eps));
    scale_gain(k0c, 0, c.d_c, k.get("gamma_k"), 0, row.alpha_k.back());
    MpVec kr = ntr ? zk : zk_rot;
    scale_gain(kr, 0, c.d_r, k.get("gamma_k"), c.d_c, row.alpha_k.back());
    if (ntr) rotate(kr, k, t);
    row.kc.push_back(std::move(k0c));
    row.kr.push_back(std::move(kr));
  }
  if (c.norm == NormMode::None) row.kr.push_back(zk_rot);
  if (c.norm == NormMode::Blockwise) {
    MpVec kr = ntr ? zk : zk_rot;
    scale_gain(kr, 0, c.d_r, k.get("gamma_rk"), 0, inv_rms(sum_squares(kr), c.d_r, eps));
    if (ntr) rotate(kr, k, t);
    row.kr.push_back(std::move(kr));
  }
  return row;
}

}  // namespace

Outputs ref_explicit(const Case& k, const Dots& d, bool with_latent_out) {
  const auto start = std::chrono::steady_clock::now();
  const MlaConfig& c = k.cfg;
  const Mp eps = c.eps, scale = c.softmax_scale;
  Outputs o;
  o.impl = "ref.explicit";
  init_outputs(o, k, {"out", "lse", "alpha_q", "alpha_k"});
  if (with_latent_out) init_outputs(o, k, {"latent_out"});
  const Tensor& kv = k.latent();
  for (int b = 0; b < c.batch; ++b) {
    const int64_t T = c.seqlens[size_t(b)];
    std::vector<QueryRow> rows;  // [S_q * H]
    for (int i = 0; i < c.s_q; ++i)
      for (int h = 0; h < c.heads; ++h) {
        rows.push_back(query_row(k, b, i, h, eps));
        store(o, "alpha_q", o.tensors["alpha_q"].index({b, i, h}), rows.back().alpha_q);
      }
    // E.5: visible logits per row, in t order: the only per-token state kept (keys and values
    // are formed a token at a time, from the exact products' blocks).
    std::vector<MpVec> logits(rows.size());
    Dots::Cursor k0c = d.cursor(k, b, Dots::Which::K0c);
    for (int64_t t = 0; t < T; ++t) {
      const KeyRow key = key_row(k, k0c, b, t, eps);
      for (int g = 0; g < c.groups; ++g)
        store(o, "alpha_k", o.tensors["alpha_k"].index({b, t, g}), key.alpha_k[size_t(g)]);
      for (int i = 0; i < c.s_q; ++i)
        for (int h = 0; h < c.heads; ++h) {
          if (!token_visible(c.causal, T, c.s_q, i, t)) continue;
          const QueryRow& q = rows[size_t(i * c.heads + h)];
          const size_t g = size_t(c.group_of(h));
          const MpVec& kr = key.kr[key.kr.size() == 1 ? 0 : g];
          logits[size_t(i * c.heads + h)].push_back(
              plain_logit(scale, dot(q.qc, key.kc[g]), dot(q.qr, kr)));
        }
    }
    MpVec lse(rows.size());  // E.6; p = exp(logit - lse) is formed again as E.7 reads it
    for (size_t row = 0; row < rows.size(); ++row) {
      lse[row] = softmax_lse(logits[row]);
      store(o, "lse", int64_t(b * c.s_q * c.heads) + int64_t(row), lse[row]);
    }
    // E.7: out = sum_t p v[t, g(h)], v exact then rounded once; latent_out likewise with c[t].
    std::vector<MpVec> out(rows.size(), MpVec(size_t(c.d_v), Mp(0)));
    std::vector<MpVec> lat(with_latent_out ? rows.size() : 0, MpVec(size_t(c.latent_rank), Mp(0)));
    std::vector<size_t> seen(rows.size(), 0);
    Mp tmp, p;
    Dots::Cursor v_exact = d.cursor(k, b, Dots::Which::V);
    std::vector<MpVec> v(size_t(c.groups), MpVec(size_t(c.d_v)));  // v[t, g] [G][d_v]
    MpVec ct(with_latent_out ? size_t(c.latent_rank) : 0);         // c[t] [r]
    for (int64_t t = 0; t < T; ++t) {
      for (int g = 0; g < c.groups; ++g)
        for (int j = 0; j < c.d_v; ++j)
          set_expansion(v[size_t(g)][size_t(j)], v_exact.entry(t, g * c.d_v + j));
      for (size_t j = 0; j < ct.size(); ++j) ct[j] = kv.at({b, t, int64_t(j)});
      for (size_t row = 0; row < rows.size(); ++row) {
        const int i = int(row) / c.heads, h = int(row) % c.heads;
        if (!token_visible(c.causal, T, c.s_q, i, t)) continue;
        p = exp(logits[row][seen[row]++] - lse[row]);
        for (int j = 0; j < c.d_v; ++j)
          mac(out[row][size_t(j)], p, v[size_t(c.group_of(h))][size_t(j)], tmp);
        if (with_latent_out)
          for (int j = 0; j < c.latent_rank; ++j) mac(lat[row][size_t(j)], p, ct[size_t(j)], tmp);
      }
    }
    for (size_t row = 0; row < rows.size(); ++row) {
      const int64_t base = int64_t(b * c.s_q * c.heads) + int64_t(row);
      for (int j = 0; j < c.d_v; ++j) store(o, "out", base * c.d_v + j, out[row][size_t(j)]);
      if (with_latent_out)
        for (int j = 0; j < c.latent_rank; ++j)
          store(o, "latent_out", base * c.latent_rank + j, lat[row][size_t(j)]);
    }
  }
  if (c.norm == NormMode::None) {  // plain MLA reports no statistics
    o.tensors.erase("alpha_q"), o.lo.erase("alpha_q");
    o.tensors.erase("alpha_k"), o.lo.erase("alpha_k");
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

}  // namespace qkmla::ref
