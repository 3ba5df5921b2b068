// ref.absorbed[.<variant>]: conventions §1.2 in the reference's precision (proofs/reference.md,
// steps A.1-A.6, U.1, X.4). Default: alpha_q row-scaled after the dot (paper Eq. 12), gains at run
// time, alpha_k from the transient key. Variants and perturbations (mutants, for converge) enter
// only through core/variant.hpp and the hooks of core/perturbation.hpp.
#include <chrono>
#include <limits>
#include <memory>

#include "reference/exact_sum.hpp"
#include "reference/explicit_rows.hpp"
#include "reference/latent_core.hpp"
#include "reference/reference.hpp"

namespace qkmla::ref {

namespace {

struct Ctx {
  const Case& k;
  Variant v;
  const Perturbation& p;
  Mp eps;
};

// Blockwise rope part (E.2-E.4 with the hooks): normalized with its own gain, rotated at pos.
void blockwise_rope(const Ctx& x, MpVec& z, const Tensor& gamma, int64_t pos) {
  const bool ntr = hook::norm_then_rope(x.p, x.k.cfg);
  const int dr = x.k.cfg.d_r;
  if (!ntr) rotate(z, x.k, pos);
  scale_gain(z, 0, dr, gamma, 0, hook::inv_rms(x.p, sum_squares(z), dr, x.eps));
  if (ntr) rotate(z, x.k, pos);
}

// A.1-A.2 (U.1) for row (b, i, h): q_latent, the query rope part, alpha_q; returns the row scale.
Mp absorbed_query(const Ctx& x, int b, int i, int h, MpVec& q_latent, MpVec& rope, Mp& alpha_q) {
  const MlaConfig& c = x.k.cfg;
  const Tensor& qn = x.k.get("q_nope");
  const Tensor& qp = x.k.get("q_pe");
  const Tensor& wk = x.k.get("w_uk");
  const bool none = c.norm == NormMode::None, unified = c.norm == NormMode::Unified;
  const bool ntr = hook::norm_then_rope(x.p, c);
  const MpVec q = to_mp(qn.ptr({b, i, h, 0}), c.d_c);  // [d_c]
  rope = to_mp(qp.ptr({b, i, h, 0}), c.d_r);           // [d_r]
  const int64_t pos = x.k.pos(b, i);
  alpha_q = 1;
  if (!none && !unified) {  // A.2 first: the normalized-first variant needs it inside q_latent
    Mp ss = sum_squares(q);
    int n = c.d_c;
    if (x.p.joint_stat_in_blockwise) ss += sum_squares(rope), n += c.d_r;
    alpha_q = hook::inv_rms(x.p, ss, n, x.eps);
  }
  MpVec w(size_t(c.d_c));  // the vector projected by WK_g^T [d_c]
  const bool merged = !none && x.v == Variant::GammaMerged;
  const Tensor* gq = none ? nullptr : &x.k.get(unified ? "gamma_q" : "gamma_cq");
  const Tensor* gk = none ? nullptr : &x.k.get(unified ? "gamma_k" : "gamma_ck");
  for (int j = 0; j < c.d_c; ++j) {
    const size_t sj = size_t(j);
    if (none || merged)
      w[sj] = q[sj];
    else if (x.v == Variant::QNormedFirst && !unified)
      w[sj] = (q[sj] * (*gq)[j]) * alpha_q * hook::gain_k(x.p, Mp((*gk)[j]));
    else
      w[sj] = q[sj] * (*gq)[j] * hook::gain_k(x.p, Mp((*gk)[j]));
  }
  const int col0 = hook::group_of(x.p, c, h) * c.d_c;
  q_latent.assign(size_t(c.latent_rank), Mp(0));
  Mp wkj;
  ExactSum acc;  // A.1's sums over j, exact (X.6), rounded once
  for (int l = 0; l < c.latent_rank; ++l) {
    acc.clear();
    for (int j = 0; j < c.d_c; ++j) {
      wkj = wk[int64_t(l) * wk.shape[1] + col0 + j];
      if (merged) wkj *= Mp((*gq)[j]) * (*gk)[j];  // the merged weight, rounded to P once
      acc.add_product(w[size_t(j)].backend().data(), wkj.backend().data());
    }
    acc.round(q_latent[size_t(l)].backend().data());
  }
  if (none) {
    if (pos >= 0) rotate(rope, x.k, pos);
  } else if (!unified) {
    if (pos >= 0) blockwise_rope(x, rope, x.k.get("gamma_rq"), pos);
  } else if (!ntr && pos < 0) {
    alpha_q = std::numeric_limits<double>::quiet_NaN();  // depends on a position
  } else {
    if (!ntr) rotate(rope, x.k, pos);
    alpha_q =
        hook::inv_rms(x.p, Mp(sum_squares(q) + sum_squares(rope)), c.d_c + c.d_r, x.eps);  // U.1
    scale_gain(rope, 0, c.d_r, x.k.get("gamma_q"), c.d_c, Mp(1));
    if (ntr && pos >= 0) rotate(rope, x.k, pos);
  }
  // Folded (and unified normalized-first) queries carry alpha_q: q_latent and, in unified mode
  // where alpha_q scales the whole score, the rope part.
  const bool carries = x.v == Variant::AlphaQFolded || x.v == Variant::QNormedFirst;
  if (x.v == Variant::AlphaQFolded || (x.v == Variant::QNormedFirst && unified))
    for (Mp& y : q_latent) y *= alpha_q;
  if (carries && unified)
    for (Mp& y : rope) y *= alpha_q;
  return carries || none ? Mp(1) : hook::alpha_q_applied(x.p, alpha_q);
}

// D.5 (Gram form): |c WK_g|^2 = c (WK_g WK_g^T) c^T, with the Gram matrix from exact products
// rounded to P once, and the quadratic form in P.
Mp gram_sum_squares(const Case& k, const ExactProduct& M, int64_t b, int64_t t) {
  const Tensor& kv = k.latent();
  const int r = k.cfg.latent_rank;
  std::vector<double> held;
  const MpVec ct = to_mp(kv.rows(kv.index({b, t, 0}), r, held), r);  // c[t] [r]
  Mp mlm, row, out;
  ExactSum acc, row_sum;  // the sums exact (X.6), each rounded once
  for (int l = 0; l < r; ++l) {
    row_sum.clear();
    for (int n = 0; n < r; ++n) {
      set_expansion(mlm, M.entry(l, n));
      row_sum.add_product(mlm.backend().data(), ct[size_t(n)].backend().data());
    }
    row_sum.round(row.backend().data());
    acc.add_product(ct[size_t(l)].backend().data(), row.backend().data());
  }
  acc.round(out.backend().data());
  return out;
}

// A.3 (U.1): the cached rope part of token t and its alpha_k per group; `given` (may be null, and
// then k0c may not be): ref.explicit's alpha_k of this sequence, the same values (reference.hpp).
void cache_row(const Ctx& x, Dots::Cursor* k0c, int b, int64_t t,
               const std::vector<ExactProduct>& gram, const PackedMpVec* given, MpVec& rope,
               MpVec& alpha_k) {
  const MlaConfig& c = x.k.cfg;
  const Tensor& kpe = x.k.get("k_pe");
  const bool none = c.norm == NormMode::None, unified = c.norm == NormMode::Unified;
  const bool ntr = hook::norm_then_rope(x.p, c);
  // In place (exact assignments): the caller's vectors keep their values' storage across tokens.
  std::vector<double> held;
  const double* zk = kpe.rows(kpe.index({b, t, 0}), c.d_r, held);  // [d_r]
  rope.resize(size_t(c.d_r));
  for (int j = 0; j < c.d_r; ++j) rope[size_t(j)] = zk[j];
  alpha_k.resize(size_t(c.groups));
  for (Mp& a : alpha_k) a = 1;
  if (none) {
    rotate(rope, x.k, t);
    return;
  }
  if (unified && !ntr) rotate(rope, x.k, t);
  const Mp rope_sq = sum_squares(rope);  // raw, or rotated (unified rope_then_norm)
  for (int g = 0; g < c.groups; ++g) {
    if (given) {
      given->get(size_t(t * c.groups + g), alpha_k[size_t(g)]);
      continue;
    }
    Mp ss;
    if (x.v == Variant::GramAlphaK) {
      ss = gram_sum_squares(x.k, gram[size_t(g)], b, t);
    } else {  // the transient key c[t] . WK_g, exact: its squares summed exactly (X.7), as E.2
      ExactSum& key_ss = scratch_sum();
      for (int j = 0; j < c.d_c; ++j) key_ss.add_square(k0c->entry(t, g * c.d_c + j));
      key_ss.round(ss.backend().data());
    }
    int n = c.d_c;
    if (x.p.key_stat_from_latent) {
      const Tensor& kv = x.k.latent();
      std::vector<double> held;
      ss = sum_squares(to_mp(kv.rows(kv.index({b, t, 0}), c.latent_rank, held), c.latent_rank));
      n = c.latent_rank;
    }
    if (hook::joint_key_stat(x.p, c)) ss += rope_sq, n += c.d_r;
    alpha_k[size_t(g)] = hook::inv_rms(x.p, ss, n, x.eps);
  }
  if (unified) {
    scale_gain(rope, 0, c.d_r, x.k.get("gamma_k"), c.d_c, Mp(1));
    if (ntr) rotate(rope, x.k, t);
  } else {
    blockwise_rope(x, rope, x.k.get("gamma_rk"), t);
  }
}

// WK_g WK_g^T exactly, per group (the Gram variant only).
std::vector<ExactProduct> gram_matrices(const Case& k) {
  const MlaConfig& c = k.cfg;
  const Tensor& wk = k.get("w_uk");
  const int r = c.latent_rank, dc = c.d_c;
  std::vector<ExactProduct> gram;
  for (int g = 0; g < c.groups; ++g) {
    std::vector<double> wkt(static_cast<size_t>(dc * r));  // WK_g^T [d_c, r]
    for (int l = 0; l < r; ++l)
      for (int j = 0; j < dc; ++j)
        wkt[size_t(j * r + l)] = wk[int64_t(l) * c.groups * dc + g * dc + j];
    gram.push_back(exact_matmul(&wk.data[size_t(g * dc)], c.groups * dc, r, dc, wkt.data(), r, r));
  }
  return gram;
}

}  // namespace

Outputs ref_absorbed(const Case& k, const Dots& d, Variant v, const Perturbation& p, int threads,
                     const AlphaKByToken* alpha_k) {
  const auto start = std::chrono::steady_clock::now();
  const MlaConfig& c = k.cfg;
  const Ctx x{k, v, p, Mp(c.eps)};
  const Tensor& wv = k.get("w_uv");
  const int r = c.latent_rank;
  Outputs o;
  o.id = ref_id(Form::Absorbed);
  init_outputs(o, k, {"out", "lse", "alpha_q", "alpha_k", "latent_out", "q_latent"});
  const std::vector<ExactProduct> gram =
      v == Variant::GramAlphaK ? gram_matrices(k) : std::vector<ExactProduct>{};
  const Mp ln2 = log(Mp(2));
  for (int b = 0; b < c.batch; ++b) {
    MpLatentRows q;  // [S_q * H] rows
    for (int i = 0; i < c.s_q; ++i)
      for (int h = 0; h < c.heads; ++h) {
        MpVec ql, rope;
        Mp aq;
        q.row_scale.push_back(absorbed_query(x, b, i, h, ql, rope, aq));
        const int64_t flat = o.tensors["alpha_q"].index({b, i, h});
        store(o, "alpha_q", flat, aq);
        for (int l = 0; l < r; ++l) store(o, "q_latent", flat * r + l, ql[size_t(l)]);
        q.q_latent.push_back(std::move(ql));
        q.rope.push_back(std::move(rope));
      }
    // A.3, token by token on the core's threads, each chunk of tokens with its own cursor.
    // ref.explicit's alpha_k where A.3's statistic is its own: then no key is formed here
    const PackedMpVec* given = alpha_k && v != Variant::GramAlphaK && p.is_none()
                                   ? &alpha_k->per_sequence.at(size_t(b))
                                   : nullptr;
    const CacheRows cache = [&](int64_t t0) -> CacheRow {
      auto k0c = given ? nullptr : std::make_shared<Dots::Cursor>(d.cursor(k, b, t0 == 0));
      return [&, b, k0c](int64_t t, MpVec& rope, MpVec& ak) {
        cache_row(x, k0c.get(), b, t, gram, given, rope, ak);
        for (int g = 0; g < c.groups; ++g)
          store(o, "alpha_k", o.tensors.at("alpha_k").index({b, t, g}), ak[size_t(g)]);
      };
    };
    const MpLatentResult res =  // A.4-A.5
        mp_latent_attend(k, b, q, cache, p, deep_capture() ? 1 : threads);
    Mp w;
    ExactSum acc;
    for (size_t row = 0; row < q.q_latent.size(); ++row) {
      const int64_t base = int64_t(b * c.s_q * c.heads) + int64_t(row);
      const int col0 = hook::group_of(p, c, int(row) % c.heads) * c.d_v;
      store(o, "lse", base, hook::lse_out(p, res.lse[row], ln2));
      for (int j = 0; j < c.d_v; ++j) {  // A.6: out = latent_out . WV_g
        acc.clear();                     // exact (X.6), rounded once
        for (int l = 0; l < r; ++l)
          acc.add_product(res.latent_out[row][size_t(l)].backend().data(),
                          wv[int64_t(l) * wv.shape[1] + col0 + j]);
        acc.round(w.backend().data());
        store(o, "out", base * c.d_v + j, w);
      }
      for (int l = 0; l < r; ++l)
        store(o, "latent_out", base * r + l, res.latent_out[row][size_t(l)]);
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
