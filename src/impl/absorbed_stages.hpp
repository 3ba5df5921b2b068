// The two stages of the absorbed form in a precision profile (conventions §1.2, §3): the append
// step that builds a sequence's latent cache (A.3) and the query step (A.1-A.2). Shared by
// cpu.absorbed.* (cpu_absorbed.cpp) and the kernel-level case, whose inputs are exactly these
// stages' outputs (kernel_level.cpp). Every deviation from the paper goes through a Perturbation
// hook.
#pragma once
#include <limits>

#include "core/design.hpp"
#include "core/variant.hpp"
#include "impl/attention_core.hpp"
#include "impl/norm_stage.hpp"

namespace qkmla::impl {

// The Gram matrices WK_g WK_g^T of the groups, [G, r, r] in Acc, each entry one sum over d_c in
// the current order: entry (i, j) is ordered_sum over d of wk[i, g, d] * wk[j, g, d], computed for
// a whole row i at once (ordered_accumulate: each output's own terms in that order, across j).
template <class Acc>
std::vector<Acc> gram_of(const std::vector<Acc>& wk, int r, int G, int dc) {
  std::vector<Acc> out(size_t(G) * r * r), wt(size_t(dc) * r);  // wt: WK_g transposed, [d_c, r]
  const auto at = [&](int i, int g, int d) { return wk[size_t(i) * G * dc + size_t(g) * dc + d]; };
  for (int g = 0; g < G; ++g) {
    for (int d = 0; d < dc; ++d)
      for (int j = 0; j < r; ++j) wt[size_t(d) * r + j] = at(j, g, d);
    for (int i = 0; i < r; ++i)
      ordered_accumulate<Acc>(
          dc, r, [&](int64_t d) { return at(i, g, int(d)); },
          [&](int64_t d) { return wt.data() + size_t(d) * r; },
          out.data() + (size_t(g) * r + i) * r);
  }
  return out;
}

// c^T M c for the rows of c ([n, r]), each as a three-operand einsum evaluates it: one sum over
// the r^2 terms (c_i M_ij) c_j, n = i r + j, in the current order (ordered_sum's lanes and
// direction). The flat sum is the less accurate of the usual orders (the nested sum_i c_i (M c)_i
// has shorter sums), and a yardstick wants the least accurate. Every row's sum is sequential; the
// loops run across rows (a block of them transposed) so that they vectorize.
template <class Acc>
std::vector<Acc> gram_quads(const Acc* M, const Acc* c, int64_t n, int r) {
  constexpr int64_t kBlock = 64;
  const SumOrder o = forward_order() ? SumOrder{} : sum_order();
  const int64_t terms = int64_t(r) * r, step = o.reverse ? -1 : 1;
  std::vector<Acc> out(size_t(n), Acc(0)), ct(size_t(r) * kBlock), s(kBlock);
  for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
    const int64_t w = std::min(kBlock, n - t0);
    for (int i = 0; i < r; ++i)  // ct[i, t] = c[t0 + t, i]
      for (int64_t t = 0; t < w; ++t) ct[size_t(i) * kBlock + t] = c[(t0 + t) * r + i];
    for (int lane = 0; lane < o.lanes && lane < terms; ++lane) {
      std::fill(s.begin(), s.end(), Acc(0));
      const int64_t first = o.reverse ? terms - 1 - lane : lane;
      int64_t i = first / r, j = first % r;
      for (int64_t k = lane; k < terms; k += o.lanes) {
        const Acc m = M[i * r + j];
        const Acc* ci = ct.data() + i * kBlock;
        const Acc* cj = ct.data() + j * kBlock;
        for (int64_t t = 0; t < w; ++t) s[size_t(t)] += (ci[t] * m) * cj[t];
        j += step * o.lanes;  // this lane's next term: o.lanes on, row by row
        while (j >= r) j -= r, ++i;
        while (j < 0) j += r, --i;
      }
      for (int64_t t = 0; t < w; ++t) out[size_t(t0 + t)] += s[size_t(t)];
    }
  }
  return out;
}

// A.3: the content key c[t] . WK_g is formed transiently in Acc for its statistic only; the rope
// key is cached in `rope_format` (a design's rounding point), alpha_k in Acc. Eager (a design's
// `eager` format, not F64): the transient key and every step of the rope key stored in it.
// `gram`: the content statistic as c (WK_g WK_g^T) c instead (gram_of: one [r, r] per group).
template <class Acc>
LatentCache<Acc> build_cache(const Case& k, int b, const std::vector<Acc>& wk, Acc eps,
                             const Perturbation& p, DType rope_format, DType eager = DType::F64,
                             const std::vector<Acc>* gram = nullptr) {
  const MlaConfig& cf = k.cfg;
  const DType A = accumulate_dtype(cf.profile);
  const Tensor& kpe = k.get("k_pe");
  const int G = cf.groups, dc = cf.d_c, dr = cf.d_r, r = cf.latent_rank;
  const int64_t T = cf.seqlens[size_t(b)];
  const bool none = cf.norm == NormMode::None, unified = cf.norm == NormMode::Unified;
  const bool ntr = hook::norm_then_rope(p, cf), joint = hook::joint_key_stat(p, cf);
  const std::vector<Acc> gk =
      none ? std::vector<Acc>{} : to_acc<Acc>(k.get(unified ? "gamma_k" : "gamma_rk"));
  LatentCache<Acc> lc;
  attach_rows(lc, k, b, T);
  // A block of tokens at a time (each row's sums are its own): its latent rows [block, r] (held,
  // or read from the case), keys [block, G*d_c] for their statistics, Gram-form statistics
  // [G, block].
  std::vector<Acc> read, keys, quads;
  const Acc* rows = nullptr;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t t0 = t - t % kProjectTokens;  // the block of t, projected as t enters it
    const int64_t n = std::min(kProjectTokens, T - t0);
    if (t == t0) {
      if (lc.c.empty()) read.resize(size_t(n * r)), lc.source.read(t0, n, read.data());
      rows = lc.c.empty() ? read.data() : lc.c.data() + t0 * r;
      quads.clear();
      for (int g = 0; gram && g < G; ++g) {
        const std::vector<Acc> q = gram_quads(gram->data() + size_t(g) * r * r, rows, n, r);
        quads.insert(quads.end(), q.begin(), q.end());
      }
      if (!none) {
        keys.resize(size_t(n * G * dc));
        rows_mat(rows, n, r, wk.data(), G * dc, G * dc, keys.data());
        eager_step(eager, keys.data(), int(keys.size()));
      }
    }
    std::vector<Acc> z(static_cast<size_t>(dr));  // [d_r]
    kpe.read(kpe.index({b, t, 0}), dr, z.data());
    if (none) {  // plain MLA: the rotated raw rope key, alpha_k = 1
      rotate(z.data(), k, t);
      lc.alpha_k.insert(lc.alpha_k.end(), size_t(G), Acc(1));
    } else {
      if (unified && !ntr) rotate(z.data(), k, t), eager_step(eager, z.data(), dr);
      const Acc rope_ss = sum_sq(z.data(), dr);  // raw, or rotated (unified rope_then_norm)
      for (int g = 0; g < G; ++g) {
        const Acc* kg = &keys[size_t((t - t0) * G * dc + g * dc)];
        Acc ss = gram ? quads[size_t(g * n + t - t0)] : dot_maybe_lowp(kg, kg, dc, p.key_stat_lowp);
        int terms = dc;
        if (p.key_stat_from_latent) ss = sum_sq(rows + (t - t0) * r, r), terms = r;
        if (joint) ss += rope_ss, terms += dr;
        lc.alpha_k.push_back(hook::inv_rms(p, ss, terms, eps));
      }
      if (unified) {
        if (!p.no_rope_gain_k) scale_gain(z.data(), dr, gk.data() + dc, Acc(1));
        eager_step(eager, z.data(), dr);
        if (ntr) rotate(z.data(), k, t), eager_step(eager, z.data(), dr);
      } else {
        blockwise_rope(z.data(),
                       p.no_rope_gain_k ? std::vector<Acc>(size_t(dr), Acc(1)).data() : gk.data(),
                       t, k, eps, p, eager);
      }
    }
    for (Acc x : z) lc.rope.push_back(round_point(rope_format, A, x));
  }
  return lc;
}

// The query statistic and the rope part of one row (A.2, U.1); w [d_c] is the raw content query.
// Eager: each step of the rope part stored in that format (as build_cache's key).
template <class Acc>
void query_norm(const Case& k, int64_t pos, const Perturbation& p, Acc eps,
                const std::vector<Acc>& w, LatentQuery<Acc>& q, DType eager = DType::F64) {
  const MlaConfig& cf = k.cfg;
  const int dc = cf.d_c, dr = cf.d_r;
  const bool ntr = hook::norm_then_rope(p, cf);
  if (cf.norm == NormMode::None) {
    q.alpha_q = Acc(1);
    if (pos >= 0) rotate(q.rope.data(), k, hook::query_rope_pos(p, pos));
  } else if (cf.norm == NormMode::Unified) {
    const std::vector<Acc> gq = to_acc<Acc>(k.get("gamma_q"));
    if (!ntr && pos < 0) {
      q.alpha_q = std::numeric_limits<Acc>::quiet_NaN();  // the statistic needs a position
      return;
    }
    if (!ntr)
      rotate(q.rope.data(), k, hook::query_rope_pos(p, pos)), eager_step(eager, q.rope.data(), dr);
    q.alpha_q = hook::inv_rms(p, sum_sq(w.data(), dc) + sum_sq(q.rope.data(), dr), dc + dr, eps);
    if (!p.no_rope_gain_q) scale_gain(q.rope.data(), dr, gq.data() + dc, Acc(1));
    eager_step(eager, q.rope.data(), dr);
    if (ntr && pos >= 0)
      rotate(q.rope.data(), k, hook::query_rope_pos(p, pos)), eager_step(eager, q.rope.data(), dr);
  } else {
    Acc ss = sum_sq(w.data(), dc);
    int n = dc;
    if (p.joint_stat_in_blockwise) ss += sum_sq(q.rope.data(), dr), n += dr;
    q.alpha_q = hook::inv_rms(p, ss, n, eps);
    if (pos >= 0)
      blockwise_rope(q.rope.data(),
                     p.no_rope_gain_q ? std::vector<Acc>(size_t(dr), Acc(1)).data()
                                      : to_acc<Acc>(k.get("gamma_rq")).data(),
                     hook::query_rope_pos(p, pos), k, eps, p, eager);
  }
}

// WK [r, G*d_c] laid out as each group's WK_g^T [d_c, r], one group after another ([G*d_c, r]), so
// that q_latent = w . WK_g^T is vec_mat's sums across r (the dots over d_c in their order, each
// the same terms in the same order as a dot of w with a row of WK_g).
template <class Acc>
std::vector<Acc> query_weights(const std::vector<Acc>& wk, int r, int G, int dc) {
  std::vector<Acc> t(wk.size());  // [G*d_c, r]; none without weights (no gamma_merged variant)
  if (wk.empty()) return t;
  const int64_t cols = int64_t(G) * dc;
  for (int64_t l = 0; l < r; ++l)
    for (int64_t j = 0; j < cols; ++j) t[size_t(j * r + l)] = wk[size_t(l * cols + j)];
  return t;
}

// A.1-A.2 for row (b, i, h): q_latent [r] = w . WK_g^T with w per variant, the rope part, alpha_q;
// q_latent and the rope part stored at the design's rounding points. `wk_t` is query_weights(WK),
// `wk_merged_t` the same of WK with both content gains merged in (the gamma_merged variant only).
template <class Acc>
LatentQuery<Acc> latent_query(const Case& k, int b, int i, int h, Variant v, const Perturbation& p,
                              const std::vector<Acc>& wk_t, const std::vector<Acc>& wk_merged_t,
                              Acc eps, const Design& d) {
  const MlaConfig& cf = k.cfg;
  const DType A = accumulate_dtype(cf.profile);
  const Tensor& qn = k.get("q_nope");
  const Tensor& qp = k.get("q_pe");
  const int dc = cf.d_c, dr = cf.d_r, r = cf.latent_rank;
  const int g = hook::group_of(p, cf, h);
  const bool none = cf.norm == NormMode::None, unified = cf.norm == NormMode::Unified;
  LatentQuery<Acc> q;
  std::vector<Acc> w(qn.data.begin() + qn.index({b, i, h, 0}),
                     qn.data.begin() + qn.index({b, i, h, 0}) + dc);
  q.rope.assign(qp.data.begin() + qp.index({b, i, h, 0}),
                qp.data.begin() + qp.index({b, i, h, 0}) + dr);
  query_norm(k, k.pos(b, i), p, eps, w, q, d.eager);
  if (d.approx_rsqrt) q.alpha_q = approx_rsqrt_of(q.alpha_q);
  if (rounds_at(d.alpha_q, accumulate_dtype(cf.profile))) q.alpha_q = store(d.alpha_q, q.alpha_q);
  const std::vector<Acc>* W = &wk_t;
  if (!none) {
    const std::vector<Acc> gq = to_acc<Acc>(k.get(unified ? "gamma_q" : "gamma_cq"));
    const std::vector<Acc> gk = to_acc<Acc>(k.get(unified ? "gamma_k" : "gamma_ck"));
    if (v == Variant::GammaMerged) {
      W = &wk_merged_t;
    } else if (v == Variant::QNormedFirst) {
      scale_gain(w.data(), dc, gq.data(), q.alpha_q);
      scale_gain(w.data(), dc, gk.data(), Acc(1));
    } else if (d.eager != DType::F64) {  // q_nope * (gamma_q * gamma_k), each product stored
      for (int j = 0; j < dc; ++j)
        w[size_t(j)] =
            store(d.eager, w[size_t(j)] * store(d.eager, hook::gain_q(p, gq[size_t(j)]) *
                                                             hook::gain_k(p, gk[size_t(j)])));
    } else {
      for (int j = 0; j < dc; ++j)
        w[size_t(j)] =
            (w[size_t(j)] * hook::gain_q(p, gq[size_t(j)])) * hook::gain_k(p, gk[size_t(j)]);
    }
  }
  // A module's normalized query, stored before the absorption product, carries alpha_q (under
  // the unified norm its rope part too, below).
  const bool normed_stored = !none && v == Variant::Default && rounds_at(d.q_normed, A);
  if (normed_stored)
    for (Acc& x : w) x = store(d.q_normed, x * q.alpha_q);
  q.q_latent.resize(size_t(r));
  vec_mat(w.data(), dc, W->data() + int64_t(g) * dc * r, r, 0, r, q.q_latent.data());
  // Folded and normalized-first queries carry alpha_q themselves; in unified mode alpha_q scales
  // the whole score, so the query rope part carries it as well.
  const bool folded = v == Variant::AlphaQFolded,
             carries = folded || v == Variant::QNormedFirst || normed_stored;
  q.row_scale = carries ? Acc(1) : hook::alpha_q_applied(p, q.alpha_q);
  if (folded)
    for (Acc& x : q.q_latent) x *= q.alpha_q;
  if (carries && unified)
    for (Acc& x : q.rope) x *= q.alpha_q;
  if (d.scale_in_q) {  // sigma enters the query before it is stored (design_scale is then 1)
    const Acc sigma = constant<Acc>(design_sigma(d, hook::softmax_scale(p, cf)));
    for (Acc& x : q.q_latent) x *= sigma;
    for (Acc& x : q.rope) x *= sigma;
  }
  for (Acc& x : q.rope) x = round_point(d.rope, A, x);
  if (d.q == DType::F8_E4M3)
    quantize_row_e4m3(q.q_latent, q.rope);
  else
    for (Acc& x : q.q_latent) x = round_point(d.q, A, x);
  return q;
}

}  // namespace qkmla::impl
