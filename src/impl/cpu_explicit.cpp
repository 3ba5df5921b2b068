// cpu.explicit.<profile>: SPEC §1.1 with full key caching. Rounding points (SPEC §3): k0c and v
// accumulated in Acc; qc^, qr^, kc^ (per group), kr^, v rounded to the stored dtype D; logits,
// softmax and p.v in Acc with p unrounded; out rounded to D; lse, alpha_q, alpha_k kept in Acc.
#include <chrono>

#include "bounds/error_bound.hpp"
#include "impl/attention_core.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/norm_stage.hpp"

namespace qkmla::impl {

namespace {

template <class Acc>
struct ExplicitQuery {
  std::vector<Acc> qc, qr;  // qc^ [d_c], qr^ [d_r], rounded to D
  Acc alpha_q = 0;
};

template <class Acc>
ExplicitQuery<Acc> query(const Case& k, int b, int i, int h, Acc eps, const Design& d) {
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
    q.alpha_q = inv_rms_from(sum_sq(q.qc.data(), c.d_c), c.d_c, eps);
    scale_gain(q.qc.data(), c.d_c, to_acc<Acc>(k.get("gamma_cq")).data(), q.alpha_q);
    if (pos >= 0) blockwise_rope(q.qr.data(), to_acc<Acc>(k.get("gamma_rq")).data(), pos, k, eps);
  } else {
    const std::vector<Acc> gq = to_acc<Acc>(k.get("gamma_q"));
    const bool ntr = c.rope_order == RopeOrder::NormThenRope;
    if (!ntr && pos < 0) {
      q.alpha_q = std::numeric_limits<Acc>::quiet_NaN();
    } else {
      if (!ntr) rotate(q.qr.data(), k, pos);
      q.alpha_q = unified_inv(q.qc.data(), q.qr.data(), k, eps);
      scale_gain(q.qc.data(), c.d_c, gq.data(), q.alpha_q);
      scale_gain(q.qr.data(), c.d_r, gq.data() + c.d_c, q.alpha_q);
      if (ntr && pos >= 0) rotate(q.qr.data(), k, pos);
    }
  }
  for (Acc& x : q.qc) x = round_point(d.q, A, x);
  for (Acc& x : q.qr) x = round_point(d.rope, A, x);
  return q;
}

// Everything an explicit attention kernel reads for one cached token.
template <class Acc>
struct ExplicitKey {
  std::vector<Acc> kc, kr, v;  // kc^ [G, d_c]; kr^ [1 or G, d_r]; v [G, d_v]; all rounded to D
  std::vector<Acc> alpha_k;    // [G]
};

template <class Acc>
ExplicitKey<Acc> key(const Case& k, int b, int64_t t, const Acc* k0c, const Acc* v, Acc eps,
                     const Design& d) {
  const MlaConfig& c = k.cfg;
  const DType A = accumulate_dtype(c.profile);
  const Tensor& kpe = k.get("k_pe");
  const int G = c.groups, dc = c.d_c, dr = c.d_r;
  const bool ntr = c.rope_order == RopeOrder::NormThenRope;
  std::vector<Acc> zk(kpe.data.begin() + kpe.index({b, t, 0}),
                      kpe.data.begin() + kpe.index({b, t, 0}) + dr);
  ExplicitKey<Acc> e;
  e.kc.assign(k0c, k0c + G * dc);  // E.1: k0c [G*d_c], accumulated in Acc over r
  e.v.assign(v, v + G * c.d_v);
  if (c.norm == NormMode::None) {
    e.alpha_k.assign(size_t(G), Acc(1));
    e.kr = zk;
    rotate(e.kr.data(), k, t);
  } else if (c.norm == NormMode::Blockwise) {
    const std::vector<Acc> gck = to_acc<Acc>(k.get("gamma_ck"));
    for (int g = 0; g < G; ++g) {
      Acc* kg = e.kc.data() + g * dc;
      e.alpha_k.push_back(inv_rms_from(sum_sq(kg, dc), dc, eps));
      scale_gain(kg, dc, gck.data(), e.alpha_k.back());
    }
    e.kr = zk;
    blockwise_rope(e.kr.data(), to_acc<Acc>(k.get("gamma_rk")).data(), t, k, eps);
  } else {
    const std::vector<Acc> gk = to_acc<Acc>(k.get("gamma_k"));
    std::vector<Acc> zrot = zk;
    rotate(zrot.data(), k, t);
    for (int g = 0; g < G; ++g) {
      Acc* kg = e.kc.data() + g * dc;
      const Acc inv = unified_inv(kg, ntr ? zk.data() : zrot.data(), k, eps);
      e.alpha_k.push_back(inv);
      scale_gain(kg, dc, gk.data(), inv);
      std::vector<Acc> kr = ntr ? zk : zrot;
      if (d.rope_key == A) {
        scale_gain(kr.data(), dr, gk.data() + dc, inv);
        if (ntr) rotate(kr.data(), k, t);
      } else {  // the cached rotated, gain-applied key, stored before alpha_k scales it
        scale_gain(kr.data(), dr, gk.data() + dc, Acc(1));
        if (ntr) rotate(kr.data(), k, t);
        for (Acc& x : kr) x = store(d.rope_key, x) * inv;
      }
      e.kr.insert(e.kr.end(), kr.begin(), kr.end());
    }
  }
  for (Acc& x : e.kc) x = round_point(d.kv, A, x);
  for (Acc& x : e.kr) x = round_point(d.rope, A, x);
  for (Acc& x : e.v) x = round_point(d.kv, A, x);
  if (d.alpha_k != A)
    for (Acc& x : e.alpha_k) x = store(d.alpha_k, x);
  return e;
}

template <class Acc>
Outputs run(const Case& k, const Design& d) {
  const MlaConfig& c = k.cfg;
  const DType A = accumulate_dtype(c.profile);
  const Acc eps = constant<Acc>(c.eps), scale = constant<Acc>(c.softmax_scale);
  const std::vector<Acc> wk = to_acc<Acc>(k.get("w_uk")), wv = to_acc<Acc>(k.get("w_uv"));
  const bool stats = c.norm != NormMode::None;
  Outputs o;
  Tensor& out = o.tensors["out"] = make_output(k, "out", d.out, 0.0);
  Tensor& lse = o.tensors["lse"] = make_output(k, "lse", A, 0.0);
  Tensor aq = make_output(k, "alpha_q", A, 0.0);
  Tensor ak = make_output(k, "alpha_k", A, std::numeric_limits<double>::quiet_NaN());
  const int H = c.heads, S = c.s_q, dc = c.d_c, dr = c.d_r, dv = c.d_v;
  for (int b = 0; b < c.batch; ++b) {
    const int64_t T = c.seqlens[size_t(b)];
    std::vector<ExplicitKey<Acc>> keys;                     // the full-key cache of sequence b
    const std::vector<Acc> cb = latent_rows<Acc>(k, b, T);  // [T, r]
    std::vector<Acc> k0c, v;  // [block, G*d_c], [block, G*d_v]: a block of tokens at a time
    for (int64_t t0 = 0; t0 < T; t0 += kProjectTokens) {
      const int64_t n = std::min(kProjectTokens, T - t0);
      const Acc* rows = cb.data() + t0 * c.latent_rank;
      k0c.resize(size_t(n * c.groups * dc));
      v.resize(size_t(n * c.groups * dv));
      rows_mat(rows, n, c.latent_rank, wk.data(), c.groups * dc, c.groups * dc, k0c.data());
      rows_mat(rows, n, c.latent_rank, wv.data(), c.groups * dv, c.groups * dv, v.data());
      for (int64_t t = t0; t < t0 + n; ++t) {
        keys.push_back(key(k, b, t, &k0c[size_t((t - t0) * c.groups * dc)],
                           &v[size_t((t - t0) * c.groups * dv)], eps, d));
        for (int g = 0; g < c.groups; ++g)
          ak.at({b, t, g}) = double(keys.back().alpha_k[size_t(g)]);
      }
    }
    for (int i = 0; i < S; ++i)
      for (int h = 0; h < H; ++h) {
        const ExplicitQuery<Acc> q = query<Acc>(k, b, i, h, eps, d);
        aq.at({b, i, h}) = double(q.alpha_q);
        const int g = c.group_of(h);
        std::vector<int64_t> tokens;
        for (int64_t t = 0; t < T; ++t)
          if (token_visible(c.causal, T, S, i, t)) tokens.push_back(t);
        auto logit = [&](int64_t t) {  // E.5
          const ExplicitKey<Acc>& e = keys[size_t(t)];
          const Acc* kr = e.kr.data() + (e.kr.size() == size_t(dr) ? 0 : g * dr);
          return plain_logit(scale, dot(q.qc.data(), e.kc.data() + g * dc, dc),
                             dot(q.qr.data(), kr, dr));
        };
        auto value = [&](int64_t t) { return keys[size_t(t)].v.data() + g * dv; };
        std::vector<Acc> acc;
        lse.at({b, i, h}) =
            double(attend_row(tokens, logit, value, dv, acc,
                              d.p == A ? std::nullopt : std::optional<DType>(d.p)));  // E.6-E.7
        for (int j = 0; j < dv; ++j)
          out.at({b, i, h, j}) = double(round_point(d.out, A, acc[size_t(j)]));
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
