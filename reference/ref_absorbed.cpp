// ref.absorbed: SPEC §1.2 in the reference's precision (proofs/reference.md, steps A.1-A.6, U.1, X.4).
// Row-scaled alpha_q (paper Eq. 12), gains applied at run time, alpha_k from the transient key.
#include <chrono>

#include "mp_matmul.hpp"
#include "ref_common.hpp"
#include "reference.hpp"

namespace qkmla::ref {

namespace {

struct AbsorbedQuery {
  MpVec q_latent;  // A.1: (q_nope (.) gamma_cq (.) gamma_ck) . WK_g^T  [r]
  MpVec rope;      // blockwise: qr^ [d_r]; unified: gained rotated, not normalized [d_r]
  Mp alpha_q;      // A.2
};

// E.2 with the eps mutant.
Mp stat(const Mp& ss, int n, const Mp& eps, const AbsorbedOptions& opt) {
  return opt.eps_outside_sqrt ? Mp(1 / (sqrt(ss / n) + eps)) : inv_rms(ss, n, eps);
}

AbsorbedQuery query_core(const Case& k, int b, int i, int h, const Mp& eps, const AbsorbedOptions& opt) {
  const MlaConfig& c = k.cfg;
  const Tensor& qn = k.get("q_nope");
  const Tensor& qp = k.get("q_pe");
  const Tensor& wk = k.get("w_uk");
  const bool unified = c.norm == NormMode::Unified, ntr = c.rope_order == RopeOrder::NormThenRope;
  const Tensor& g_q = k.get(unified ? "gamma_q" : "gamma_cq");
  const Tensor& g_k = k.get(unified ? "gamma_k" : "gamma_ck");
  AbsorbedQuery a;
  const MpVec q = to_mp(&qn.data[size_t(qn.index({b, i, h, 0}))], c.d_c);  // [d_c]
  a.rope = to_mp(&qp.data[size_t(qp.index({b, i, h, 0}))], c.d_r);         // [d_r]
  const int64_t pos = k.pos(b, i);
  // A.2 first: the normalized-first variant needs alpha_q inside q_latent.
  Mp aq_early = unified ? Mp(0) : stat(sum_squares(q), c.d_c, eps, opt);
  MpVec w(size_t(c.d_c));  // q (.) gamma_q (.) gamma_k  [d_c]
  for (int j = 0; j < c.d_c; ++j) {
    const double gkj = opt.no_gamma_k ? 1.0 : g_k[j];
    w[size_t(j)] = opt.gamma_merged ? q[size_t(j)] : Mp(q[size_t(j)] * g_q[j] * gkj);
    if (opt.q_normed_first && !unified) w[size_t(j)] = (q[size_t(j)] * g_q[j]) * aq_early * gkj;
  }
  const int col0 = c.group_of(h) * c.d_c;
  a.q_latent.assign(size_t(c.latent_rank), Mp(0));
  Mp tmp, wkj;
  for (int l = 0; l < c.latent_rank; ++l)
    for (int j = 0; j < c.d_c; ++j) {
      wkj = wk[int64_t(l) * wk.shape[1] + col0 + j];
      if (opt.gamma_merged) wkj *= Mp(g_q[j]) * g_k[j];  // the merged weight, rounded to P once
      mac(a.q_latent[size_t(l)], w[size_t(j)], wkj, tmp);
    }
  if (!unified) {
    a.alpha_q = aq_early;
    if (pos < 0) return a;
    if (!ntr) rotate(a.rope, k, pos);
    scale_gain(a.rope, 0, c.d_r, k.get("gamma_rq"), 0, stat(sum_squares(a.rope), c.d_r, eps, opt));
    if (ntr) rotate(a.rope, k, pos);
    return a;
  }
  if (pos < 0) {
    a.alpha_q = ntr ? inv_rms(sum_squares(q) + sum_squares(a.rope), c.d_c + c.d_r, eps)
                    : Mp(std::numeric_limits<double>::quiet_NaN());
    return a;
  }
  if (!ntr) rotate(a.rope, k, pos);
  a.alpha_q = stat(sum_squares(q) + sum_squares(a.rope), c.d_c + c.d_r, eps, opt);  // U.1
  scale_gain(a.rope, 0, c.d_r, k.get("gamma_q"), c.d_c, Mp(1));
  if (ntr) rotate(a.rope, k, pos);
  return a;
}

// The folded variant multiplies q_latent by alpha_q (rounded to P) before the latent score; so
// does normalized-first in unified mode, where alpha_q needs the rotated rope part first.
AbsorbedQuery absorbed_query(const Case& k, int b, int i, int h, const Mp& eps, const AbsorbedOptions& opt) {
  AbsorbedQuery a = query_core(k, b, i, h, eps, opt);
  if (opt.alpha_q_folded || (opt.q_normed_first && k.cfg.norm == NormMode::Unified))
    for (Mp& x : a.q_latent) x *= a.alpha_q;
  return a;
}

struct CacheRow {
  MpVec rope;     // blockwise: kr^ [d_r]; unified: gained rotated, not normalized [d_r]
  MpVec alpha_k;  // A.3: [G]
};

// D.5 (Gram form): |c WK_g|^2 = c (WK_g WK_g^T) c^T, with the Gram matrix from exact products
// rounded to P once, and the quadratic form in P.
Mp gram_sum_squares(const Case& k, const ExactProduct& M, int64_t b, int64_t t) {
  const Tensor& kv = k.latent();
  const int r = k.cfg.latent_rank;
  const MpVec ct = to_mp(&kv.data[size_t(kv.index({b, t, 0}))], r);
  Mp acc = 0, mlm, row, tmp;
  for (int l = 0; l < r; ++l) {
    row = 0;
    for (int n = 0; n < r; ++n) {
      set_expansion(mlm, M.entry(l, n));
      mac(row, mlm, ct[size_t(n)], tmp);
    }
    mac(acc, ct[size_t(l)], row, tmp);
  }
  return acc;
}

CacheRow cache_row(const Case& k, const Dots& d, int b, int64_t t, const Mp& eps, const AbsorbedOptions& opt,
                   const std::vector<ExactProduct>& gram) {
  const MlaConfig& cfg = k.cfg;
  const Tensor& kpe = k.get("k_pe");
  const bool unified = cfg.norm == NormMode::Unified, ntr = cfg.rope_order == RopeOrder::NormThenRope;
  CacheRow row;
  row.rope = to_mp(&kpe.data[size_t(kpe.index({b, t, 0}))], cfg.d_r);
  if (!ntr) rotate(row.rope, k, t);
  const Mp rope_sq = sum_squares(row.rope);  // raw (ntr) or rotated (rtn) statistic
  for (int g = 0; g < cfg.groups; ++g) {
    MpVec key(size_t(cfg.d_c));  // the transient key c[t] . WK_g, discarded after its statistic
    for (int j = 0; j < cfg.d_c; ++j)
      set_expansion(key[size_t(j)], d.k0c[size_t(b)].entry(t, g * cfg.d_c + j));
    const Mp key_sq = opt.gram_alpha_k ? gram_sum_squares(k, gram[size_t(g)], b, t) : sum_squares(key);
    row.alpha_k.push_back(unified ? stat(key_sq + rope_sq, cfg.d_c + cfg.d_r, eps, opt) : stat(key_sq, cfg.d_c, eps, opt));
  }
  const Mp rope_inv = unified ? Mp(1) : stat(rope_sq, cfg.d_r, eps, opt);
  scale_gain(row.rope, 0, cfg.d_r, k.get(unified ? "gamma_k" : "gamma_rk"), unified ? cfg.d_c : 0,
             rope_inv);
  if (ntr) rotate(row.rope, k, t);
  return row;
}

}  // namespace

Outputs ref_absorbed(const Case& k, const Dots& d, const AbsorbedOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  const MlaConfig& c = k.cfg;
  const Mp eps = c.eps, scale = c.softmax_scale;
  const bool unified = c.norm == NormMode::Unified;
  const Tensor& wv = k.get("w_uv");
  Outputs o;
  o.impl = "ref.absorbed";
  init_outputs(o, k, {"out", "lse", "alpha_q", "alpha_k", "latent_out", "q_latent"});
  std::vector<ExactProduct> gram;  // WK_g WK_g^T exactly, per group (Gram variant only)
  if (opt.gram_alpha_k) {
    const Tensor& wk = k.get("w_uk");
    const int r = c.latent_rank, dc = c.d_c;
    for (int g = 0; g < c.groups; ++g) {
      std::vector<double> wkt(static_cast<size_t>(dc * r));  // WK_g^T [d_c, r]
      for (int l = 0; l < r; ++l)
        for (int j = 0; j < dc; ++j) wkt[size_t(j * r + l)] = wk[int64_t(l) * c.groups * dc + g * dc + j];
      gram.push_back(exact_matmul(&wk.data[size_t(g * dc)], c.groups * dc, r, dc, wkt.data(), r, r));
    }
  }
  for (int b = 0; b < c.batch; ++b) {
    const int64_t T = c.seqlens[size_t(b)];
    std::vector<AbsorbedQuery> rows;  // [S_q * H]
    for (int i = 0; i < c.s_q; ++i)
      for (int h = 0; h < c.heads; ++h) {
        rows.push_back(absorbed_query(k, b, i, h, eps, opt));
        const int64_t flat = o.tensors["alpha_q"].index({b, i, h});
        store(o, "alpha_q", flat, rows.back().alpha_q);
        for (int l = 0; l < c.latent_rank; ++l)
          store(o, "q_latent", flat * c.latent_rank + l, rows.back().q_latent[size_t(l)]);
      }
    // A.4: q_latent . c[t] for every row and token, exact sums (X.4) of the rounded q_latent.
    const Tensor& kv = k.latent();
    const int r = c.latent_rank;
    std::vector<double> c_t(size_t(r * T));  // c^T [r, T]
    for (int64_t t = 0; t < T; ++t)
      for (int l = 0; l < r; ++l) c_t[size_t(l * T + t)] = kv.at({b, t, l});
    std::vector<MpVec> q_lat;
    for (const AbsorbedQuery& q : rows) q_lat.push_back(q.q_latent);
    const std::vector<MpVec> latent = mp_times_doubles(q_lat, r, c_t.data(), T, T);  // [rows][T]
    std::vector<MpVec> probs(rows.size(), MpVec(size_t(T), Mp(0)));  // [rows][T], 0 if masked
    std::vector<MpVec> logits(rows.size());
    for (int64_t t = 0; t < T; ++t) {
      const CacheRow cr = cache_row(k, d, b, t, eps, opt, gram);
      for (int g = 0; g < c.groups; ++g)
        store(o, "alpha_k", o.tensors["alpha_k"].index({b, t, g}), cr.alpha_k[size_t(g)]);
      for (size_t row = 0; row < rows.size(); ++row) {
        const int i = int(row) / c.heads, h = int(row) % c.heads;
        if (!k.causal_visible(b, i, t)) continue;
        const AbsorbedQuery& q = rows[row];
        const bool carries = opt.alpha_q_folded || opt.q_normed_first;  // q_latent holds alpha_q already
        const Mp ak = carries ? cr.alpha_k[size_t(c.group_of(h))] : Mp(q.alpha_q * cr.alpha_k[size_t(c.group_of(h))]);
        const Mp& lat = latent[row][size_t(t)];
        const Mp rope = dot(q.rope, cr.rope);
        const Mp rope_scaled = carries && unified ? Mp(rope * q.alpha_q) : rope;
        logits[row].push_back(unified ? Mp(scale * ak * (lat + rope_scaled)) : Mp(scale * (ak * lat + rope_scaled)));
      }
    }
    for (size_t row = 0; row < rows.size(); ++row) {
      const int i = int(row) / c.heads;
      Mp lse;
      MpVec p;
      softmax(logits[row], lse, p);  // E.6
      store(o, "lse", int64_t(b * c.s_q * c.heads) + int64_t(row), lse);
      size_t n = 0;
      for (int64_t t = 0; t < T; ++t)
        if (k.causal_visible(b, i, t)) probs[row][size_t(t)] = p[n++];
    }
    // A.5: latent_out = sum_t p c[t] (p spans many binades: plain multiprecision sums).
    std::vector<MpVec> lat(rows.size(), MpVec(static_cast<size_t>(r), Mp(0)));
    MpVec ct(static_cast<size_t>(r));
    Mp prod;
    for (int64_t t = 0; t < T; ++t) {
      for (int l = 0; l < r; ++l) ct[size_t(l)] = kv.at({b, t, l});
      for (size_t row = 0; row < rows.size(); ++row) {
        if (!k.causal_visible(b, int(row) / c.heads, t)) continue;
        for (int l = 0; l < r; ++l) mac(lat[row][size_t(l)], probs[row][size_t(t)], ct[size_t(l)], prod);
      }
    }
    Mp tmp, w;
    for (size_t row = 0; row < rows.size(); ++row) {
      const int h = int(row) % c.heads;
      const int64_t base = int64_t(b * c.s_q * c.heads) + int64_t(row);
      const int col0 = c.group_of(h) * c.d_v;
      for (int j = 0; j < c.d_v; ++j) {  // A.6: out = latent_out . WV_g
        Mp acc = 0;
        for (int l = 0; l < r; ++l) {
          w = wv[int64_t(l) * wv.shape[1] + col0 + j];
          mac(acc, lat[row][size_t(l)], w, tmp);
        }
        store(o, "out", base * c.d_v + j, acc);
      }
      for (int l = 0; l < r; ++l) store(o, "latent_out", base * r + l, lat[row][size_t(l)]);
    }
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

}  // namespace qkmla::ref
