// ref.explicit: SPEC §1.1 evaluated stage by stage (proofs/reference.md, steps E.1-E.7, U.1).
#include <algorithm>
#include <chrono>
#include <functional>

#include "core/attention_math.hpp"
#include "core/parallel.hpp"
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
  std::vector<MpVec> kc, kr;  // kc^ [G][d_c]; kr^ [G][d_r] (blockwise, none: one shared entry)
  MpVec alpha_k;              // [G]
  MpVec zk, zk_rot;           // raw and rotated k_pe [d_r]
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
      alpha_k = inv_rms(sum_squares(k0c), c.d_c, eps);           // E.2
      scale_gain(k0c, 0, c.d_c, k.get("gamma_ck"), 0, alpha_k);  // E.3
      continue;
    }
    alpha_k = inv_rms(sum_squares(k0c) + sum_squares(rope_stat), c.d_c + c.d_r, eps);  // U.1
    scale_gain(k0c, 0, c.d_c, k.get("gamma_k"), 0, alpha_k);
    MpVec& kr = row.kr[size_t(g)];
    kr = rope_stat;
    scale_gain(kr, 0, c.d_r, k.get("gamma_k"), c.d_c, alpha_k);
    if (ntr) rotate(kr, k, t);
  }
  if (c.norm == NormMode::None) row.kr[0] = row.zk_rot;
  if (c.norm == NormMode::Blockwise) {
    MpVec& kr = row.kr[0];
    kr = rope_stat;
    scale_gain(kr, 0, c.d_r, k.get("gamma_rk"), 0, inv_rms(sum_squares(kr), c.d_r, eps));
    if (ntr) rotate(kr, k, t);
  }
}

// E.5-E.7 for the query rows [r0, r1) of sequence b (row = i * H + h). Rows are independent, so
// shares of them run on separate threads; each share forms the keys and values of the groups its
// rows read, and alpha_k[t, g] is stored by the share holding g's first row. `counts`: this
// share's cursors count towards Dots::blocks_read (one share per run does).
void explicit_rows(const Case& k, const Dots& d, int b, const std::vector<QueryRow>& rows, int r0,
                   int r1, bool with_latent_out, bool counts, Outputs& o) {
  const MlaConfig& c = k.cfg;
  const Mp eps = c.eps, scale = c.softmax_scale;
  const int64_t T = c.seqlens[size_t(b)];
  const size_t n = size_t(r1 - r0);
  std::vector<char> needed(size_t(c.groups), 0), owned(size_t(c.groups), 0);
  for (int row = r0; row < r1; ++row) needed[size_t(c.group_of(row % c.heads))] = 1;
  for (int g = 0; g < c.groups; ++g) {
    const int first = g * c.heads_per_group();  // i = 0, first head of g
    owned[size_t(g)] = first >= r0 && first < r1;
  }
  Tensor& alpha_k_hi = o.tensors.at("alpha_k");
  // E.5: visible logits per row, in t order: the only per-token state kept (keys and values
  // are formed a token at a time, from the exact products' blocks).
  std::vector<MpVec> logits(n);
  Dots::Cursor k0c = d.cursor(k, b, Dots::Which::K0c, counts);
  KeyRow key;
  for (int64_t t = 0; t < T; ++t) {
    key_row(k, k0c, b, t, eps, needed, key);
    for (int g = 0; g < c.groups; ++g)
      if (owned[size_t(g)])
        store(o, "alpha_k", alpha_k_hi.index({b, t, g}), key.alpha_k[size_t(g)]);
    for (size_t x = 0; x < n; ++x) {
      const int row = r0 + int(x), i = row / c.heads, h = row % c.heads;
      if (!token_visible(c.causal, T, c.s_q, i, t)) continue;
      const QueryRow& q = rows[size_t(row)];
      const size_t g = size_t(c.group_of(h));
      const MpVec& kr = key.kr[key.kr.size() == 1 ? 0 : g];
      logits[x].push_back(plain_logit(scale, dot(q.qc, key.kc[g]), dot(q.qr, kr)));
    }
  }
  MpVec lse(n);  // E.6; p = exp(logit - lse) is formed again as E.7 reads it
  for (size_t x = 0; x < n; ++x) {
    lse[x] = softmax_lse(logits[x]);
    store(o, "lse", int64_t(b * c.s_q * c.heads + r0) + int64_t(x), lse[x]);
  }
  // E.7: out = sum_t p v[t, g(h)], v exact then rounded once; latent_out likewise with c[t].
  const Tensor& kv = k.latent();
  std::vector<MpVec> out(n, MpVec(size_t(c.d_v), Mp(0)));
  std::vector<MpVec> lat(with_latent_out ? n : 0, MpVec(size_t(c.latent_rank), Mp(0)));
  std::vector<size_t> seen(n, 0);
  Mp tmp, p;
  Dots::Cursor v_exact = d.cursor(k, b, Dots::Which::V, counts);
  std::vector<MpVec> v(size_t(c.groups), MpVec(size_t(c.d_v)));  // v[t, g] [G][d_v]
  MpVec ct(with_latent_out ? size_t(c.latent_rank) : 0);         // c[t] [r]
  for (int64_t t = 0; t < T; ++t) {
    for (int g = 0; g < c.groups; ++g)
      if (needed[size_t(g)])
        for (int j = 0; j < c.d_v; ++j)
          set_expansion(v[size_t(g)][size_t(j)], v_exact.entry(t, g * c.d_v + j));
    for (size_t j = 0; j < ct.size(); ++j) ct[j] = kv.at({b, t, int64_t(j)});
    for (size_t x = 0; x < n; ++x) {
      const int row = r0 + int(x), i = row / c.heads, h = row % c.heads;
      if (!token_visible(c.causal, T, c.s_q, i, t)) continue;
      p = exp(logits[x][seen[x]++] - lse[x]);
      for (int j = 0; j < c.d_v; ++j)
        mac(out[x][size_t(j)], p, v[size_t(c.group_of(h))][size_t(j)], tmp);
      if (with_latent_out)
        for (int j = 0; j < c.latent_rank; ++j) mac(lat[x][size_t(j)], p, ct[size_t(j)], tmp);
    }
  }
  for (size_t x = 0; x < n; ++x) {
    const int64_t base = int64_t(b * c.s_q * c.heads + r0) + int64_t(x);
    for (int j = 0; j < c.d_v; ++j) store(o, "out", base * c.d_v + j, out[x][size_t(j)]);
    if (with_latent_out)
      for (int j = 0; j < c.latent_rank; ++j)
        store(o, "latent_out", base * c.latent_rank + j, lat[x][size_t(j)]);
  }
}

}  // namespace

Outputs ref_explicit(const Case& k, const Dots& d, bool with_latent_out, int threads) {
  const auto start = std::chrono::steady_clock::now();
  const MlaConfig& c = k.cfg;
  const Mp eps = c.eps;
  Outputs o;
  o.impl = "ref.explicit";
  init_outputs(o, k, {"out", "lse", "alpha_q", "alpha_k"});
  if (with_latent_out) init_outputs(o, k, {"latent_out"});
  const int n_rows = c.s_q * c.heads;
  const int shares = deep_capture() ? 1 : std::max(1, std::min(threads, n_rows));
  for (int b = 0; b < c.batch; ++b) {
    std::vector<QueryRow> rows;  // [S_q * H]
    for (int i = 0; i < c.s_q; ++i)
      for (int h = 0; h < c.heads; ++h) {
        rows.push_back(query_row(k, b, i, h, eps));
        store(o, "alpha_q", o.tensors.at("alpha_q").index({b, i, h}), rows.back().alpha_q);
      }
    std::vector<std::function<void()>> tasks;
    for (int s = 0; s < shares; ++s) {
      const int r0 = n_rows * s / shares, r1 = n_rows * (s + 1) / shares;
      tasks.push_back(
          [&, b, r0, r1, s] { explicit_rows(k, d, b, rows, r0, r1, with_latent_out, s == 0, o); });
    }
    run_parallel(tasks, shares);
  }
  if (c.norm == NormMode::None) {  // plain MLA reports no statistics
    o.tensors.erase("alpha_q"), o.lo.erase("alpha_q");
    o.tensors.erase("alpha_k"), o.lo.erase("alpha_k");
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

}  // namespace qkmla::ref
