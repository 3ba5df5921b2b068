// cpu.explicit.<profile>: conventions §1.1 with full key caching (one key group at a time).
// Rounding points (conventions §3): k0c and v accumulated in Acc; qc^, qr^, kc^ (per group), kr^, v
// rounded to the stored dtype D; logits, softmax and p.v in Acc with p unrounded; out rounded to D;
// lse, alpha_q, alpha_k kept in Acc. A design's module prelude (Design::prelude) also stores k0c
// and each step of the norms and rotations.
#include <chrono>

#include "bounds/error_bound.hpp"
#include "impl/attention_core.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/norm_stage.hpp"

namespace qkmla::impl {

namespace {

// A statistic 1/S as the design computes it: exact in Acc, or through an approximate rsqrt; the
// query's stored at its point.
template <class Acc>
Acc rsqrt_of(const Design& d, Acc inv, DType point = DType::F64, DType A = DType::F64) {
  const Acc x = d.approx_rsqrt ? approx_rsqrt_of(inv) : inv;
  return rounds_at(point, A) ? store(point, x) : x;
}

template <class Acc>
struct ExplicitQuery {
  std::vector<Acc> qc, qr;  // qc^ [d_c], qr^ [d_r], rounded to D
  Acc alpha_q = 0;
};

template <class Acc>
ExplicitQuery<Acc> query(const Case& k, int b, int i, int h, Acc eps, const Design& d, Acc sigma) {
  const MlaConfig& c = k.cfg;
  const DType A = accumulate_dtype(c.profile);
  const Tensor& qn = k.get("q_nope");
  const Tensor& qp = k.get("q_pe");
  ExplicitQuery<Acc> q;
  q.qc.assign(qn.data.begin() + qn.index({b, i, h, 0}),
              qn.data.begin() + qn.index({b, i, h, 0}) + c.d_c);
  q.qr.assign(qp.data.begin() + qp.index({b, i, h, 0}),
              qp.data.begin() + qp.index({b, i, h, 0}) + c.d_r);
  const int64_t pos = k.pos(b, i);
  if (c.norm == NormMode::None) {  // plain MLA: raw content, rotated raw rope part
    q.alpha_q = Acc(1);
    if (pos >= 0) rotate(q.qr.data(), k, pos);
  } else if (c.norm == NormMode::Blockwise) {
    q.alpha_q = rsqrt_of(d, inv_rms_from(sum_sq(q.qc.data(), c.d_c), c.d_c, eps), d.alpha_q, A);
    norm_gain(q.qc.data(), c.d_c, to_acc<Acc>(k.get("gamma_cq")).data(), q.alpha_q, d.prelude);
    if (pos >= 0)
      blockwise_rope(q.qr.data(), to_acc<Acc>(k.get("gamma_rq")).data(), pos, k, eps, {},
                     d.prelude);
  } else {
    const std::vector<Acc> gq = to_acc<Acc>(k.get("gamma_q"));
    const bool ntr = c.rope_order == RopeOrder::NormThenRope;
    if (!ntr && pos < 0) {
      q.alpha_q = std::numeric_limits<Acc>::quiet_NaN();
    } else {
      if (!ntr) rotate(q.qr.data(), k, pos), eager_step(d.prelude, q.qr.data(), c.d_r);
      q.alpha_q = rsqrt_of(d, unified_inv(q.qc.data(), q.qr.data(), k, eps), d.alpha_q, A);
      norm_gain(q.qc.data(), c.d_c, gq.data(), q.alpha_q, d.prelude);
      norm_gain(q.qr.data(), c.d_r, gq.data() + c.d_c, q.alpha_q, d.prelude);
      if (ntr && pos >= 0) rotate(q.qr.data(), k, pos), eager_step(d.prelude, q.qr.data(), c.d_r);
    }
  }
  if (d.scale_in_q) {  // sigma enters the query before it is stored (design_scale is then 1)
    for (Acc& x : q.qc) x *= sigma;
    for (Acc& x : q.qr) x *= sigma;
  }
  for (Acc& x : q.qc) x = round_point(d.q, A, x);
  for (Acc& x : q.qr) x = round_point(d.rope, A, x);
  return q;
}

// The key gains, converted once: blockwise gamma_ck [d_c] and gamma_rk [d_r]; unified gamma_k
// [d_c + d_r].
template <class Acc>
struct KeyGains {
  std::vector<Acc> ck, rk, k;
  explicit KeyGains(const Case& k_) {
    if (k_.cfg.norm == NormMode::Blockwise)
      ck = to_acc<Acc>(k_.get("gamma_ck")), rk = to_acc<Acc>(k_.get("gamma_rk"));
    if (k_.cfg.norm == NormMode::Unified) k = to_acc<Acc>(k_.get("gamma_k"));
  }
};

// Everything an explicit attention kernel reads of one key group over one sequence. The groups
// are cached one at a time (each query row reads its own group only), so that the full-key cache
// takes 1/G of the memory of all groups' at once, and every value is the same.
template <class Acc>
struct GroupCache {
  std::vector<Acc> kc, kr, v;  // kc^ [T, d_c]; kr^ [T, d_r]; v [T, d_v]; all rounded to D
  std::vector<Acc> alpha_k;    // [T]
};

// E.2-E.4 for token t of one group: kc [d_c] holds k0c on entry and kc^ on return, kr [d_r]
// receives kr^ (both rounded to D); returns alpha_k (stored as the design keeps it).
template <class Acc>
Acc group_key(const Case& k, int b, int64_t t, const KeyGains<Acc>& gains, Acc eps, const Design& d,
              Acc* kc, Acc* kr) {
  const MlaConfig& c = k.cfg;
  const DType A = accumulate_dtype(c.profile);
  const Tensor& kpe = k.get("k_pe");
  const int dc = c.d_c, dr = c.d_r;
  const bool ntr = c.rope_order == RopeOrder::NormThenRope;
  std::vector<double> held;
  const double* zk = kpe.rows(kpe.index({b, t, 0}), dr, held);  // [d_r] the raw rope key
  std::copy(zk, zk + dr, kr);
  Acc alpha_k = 1;
  if (c.norm == NormMode::None) {
    rotate(kr, k, t);
  } else if (c.norm == NormMode::Blockwise) {
    alpha_k = rsqrt_of(d, inv_rms_from(sum_sq(kc, dc), dc, eps));
    norm_gain(kc, dc, gains.ck.data(), alpha_k, d.prelude);
    blockwise_rope(kr, gains.rk.data(), t, k, eps, {}, d.prelude);
  } else {
    const std::vector<Acc> z(zk, zk + dr);                      // [d_r]
    if (!ntr) rotate(kr, k, t), eager_step(d.prelude, kr, dr);  // kr: rotated (rope first), or raw
    alpha_k = rsqrt_of(d, unified_inv(kc, ntr ? z.data() : kr, k, eps));
    norm_gain(kc, dc, gains.k.data(), alpha_k, d.prelude);
    if (d.rope_key == A) {
      norm_gain(kr, dr, gains.k.data() + dc, alpha_k, d.prelude);
      if (ntr) rotate(kr, k, t), eager_step(d.prelude, kr, dr);
    } else {  // the cached rotated, gain-applied key, stored before alpha_k scales it
      scale_gain(kr, dr, gains.k.data() + dc, Acc(1));
      if (ntr) rotate(kr, k, t);
      for (int j = 0; j < dr; ++j) kr[j] = store(d.rope_key, kr[j]) * alpha_k;
    }
  }
  for (int j = 0; j < dc; ++j) kc[j] = round_point(d.kv, A, kc[j]);
  for (int j = 0; j < dr; ++j) kr[j] = round_point(d.rope, A, kr[j]);
  return d.alpha_k != A ? store(d.alpha_k, alpha_k) : alpha_k;
}

// E.1-E.4 for group g of sequence b: its keys and values, projected a block of tokens at a time.
template <class Acc>
GroupCache<Acc> group_cache(const Case& k, int b, int g, const std::vector<Acc>& wk,
                            const std::vector<Acc>& wv, const KeyGains<Acc>& gains, Acc eps,
                            const Design& d) {
  const MlaConfig& c = k.cfg;
  const DType A = accumulate_dtype(c.profile);
  const int64_t T = c.seqlens[size_t(b)];
  const int G = c.groups, dc = c.d_c, dr = c.d_r, dv = c.d_v, r = c.latent_rank;
  GroupCache<Acc> e;
  e.kc.resize(size_t(T * dc));
  e.kr.resize(size_t(T * dr));
  e.v.resize(size_t(T * dv));
  e.alpha_k.resize(size_t(T));
  for (int64_t t0 = 0; t0 < T; t0 += kProjectTokens) {
    const int64_t n = std::min(kProjectTokens, T - t0);
    std::vector<Acc> rows = latent_rows<Acc>(k, b, t0, n);  // [n, r]
    eager_step(rounds_at(d.cache, A) ? d.cache : DType::F64, rows.data(), int(rows.size()));
    // E.1: k0c and v of group g, accumulated in Acc over r (each output's sum is its own).
    rows_mat(rows.data(), n, r, wk.data() + g * dc, G * dc, dc, e.kc.data() + t0 * dc);
    eager_step(d.prelude, e.kc.data() + t0 * dc, int(n * dc));  // a module's k0c, stored
    rows_mat(rows.data(), n, r, wv.data() + g * dv, G * dv, dv, e.v.data() + t0 * dv);
    for (int64_t t = t0; t < t0 + n; ++t)
      e.alpha_k[size_t(t)] =
          group_key(k, b, t, gains, eps, d, e.kc.data() + t * dc, e.kr.data() + t * dr);
  }
  for (Acc& x : e.v) x = round_point(d.kv, A, x);
  return e;
}

template <class Acc>
Outputs run(const Case& k, const Design& d) {
  const MlaConfig& c = k.cfg;
  const DType A = accumulate_dtype(c.profile);
  const Acc eps = constant<Acc>(c.eps), scale = design_scale<Acc>(d, c.softmax_scale);
  const Acc sigma = constant<Acc>(design_sigma(d, c.softmax_scale));
  const std::vector<Acc> wk = to_acc<Acc>(k.get("w_uk")), wv = to_acc<Acc>(k.get("w_uv"));
  const KeyGains<Acc> gains(k);
  const bool stats = c.norm != NormMode::None;
  Outputs o;
  Tensor& out = o.tensors["out"] = make_output(k, "out", d.out, 0.0);
  Tensor& lse = o.tensors["lse"] = make_output(k, "lse", A, 0.0);
  Tensor aq = make_output(k, "alpha_q", A, 0.0);
  Tensor ak = make_output(k, "alpha_k", A, std::numeric_limits<double>::quiet_NaN());
  const int H = c.heads, S = c.s_q, dc = c.d_c, dr = c.d_r, dv = c.d_v;
  for (int b = 0; b < c.batch; ++b) {
    const int64_t T = c.seqlens[size_t(b)];
    for (int g = 0; g < c.groups; ++g) {
      const GroupCache<Acc> e = group_cache(k, b, g, wk, wv, gains, eps, d);
      for (int64_t t = 0; t < T; ++t) ak.at({b, t, g}) = double(e.alpha_k[size_t(t)]);
      for (int i = 0; i < S; ++i)
        for (int h = 0; h < H; ++h) {
          if (c.group_of(h) != g) continue;
          const ExplicitQuery<Acc> q = query<Acc>(k, b, i, h, eps, d, sigma);
          const RowRounding rr = row_rounding(d, A, k, h);
          aq.at({b, i, h}) = double(q.alpha_q);
          const std::vector<int64_t> tokens = k.tokens(b, i);
          auto logit = [&](int64_t t) {  // E.5
            Acc content = dot(q.qc.data(), e.kc.data() + t * dc, dc);
            Acc rope = dot(q.qr.data(), e.kr.data() + t * dr, dr);
            if (rr.score) content = store(*rr.score, content), rope = store(*rr.score, rope);
            return plain_logit(scale, content, rope);
          };
          auto value = [&](int64_t t) { return e.v.data() + t * dv; };
          std::vector<Acc> acc;
          const Acc row_lse = attend_row(tokens, logit, value, dv, acc, rr);  // E.6-E.7
          lse.at({b, i, h}) =
              double(round_point(d.lse, A, apply_sink(k, Perturbation{}, h, row_lse, acc, rr)));
          for (int j = 0; j < dv; ++j)
            out.at({b, i, h, j}) = double(round_point(d.out, A, acc[size_t(j)]));
        }
    }
  }
  if (stats) {
    o.tensors["alpha_q"] = std::move(aq);
    o.tensors["alpha_k"] = std::move(ak);
  }
  return o;
}

}  // namespace

Outputs cpu_explicit_bounds(const Case& k, const std::optional<Design>& d) {
  bounds::units() = bounds::make_units(accumulate_dtype(k.cfg.profile));
  return run<bounds::EB>(k, d.value_or(spec_design(k.cfg.profile, Form::Explicit)));
}

Outputs cpu_explicit(const Case& k, const std::optional<Design>& d) {
  const auto start = std::chrono::steady_clock::now();
  const Design des = d.value_or(spec_design(k.cfg.profile, Form::Explicit));
  Outputs o =
      accumulate_dtype(k.cfg.profile) == DType::F64 ? run<double>(k, des) : run<float>(k, des);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

}  // namespace qkmla::impl
