// cpu.absorbed.<profile>[.<variant>]: SPEC §1.2. Rounding points (SPEC §3): q_latent, the query
// rope part and the cached rope key rounded to D; c as stored; alpha_q and alpha_k in Acc (the
// alpha_k_bf16 variant rounds alpha_k to bf16); logits, softmax and p.c in Acc, p unrounded;
// latent_out rounded to D; out = latent_out . WV accumulated in Acc and rounded to D.
#include <chrono>

#include "impl/cpu_impls.hpp"
#include <algorithm>
#include <type_traits>

#include "bounds/error_bound.hpp"

#include "impl/kernel_level.hpp"
#include "impl/mutants.hpp"
#include "impl/norm_stage.hpp"

namespace qkmla::impl {

std::string variant_suffix(Variant v) {
  switch (v) {
    case Variant::Default: return "";
    case Variant::AlphaQFolded: return ".alpha_q_folded";
    case Variant::QNormedFirst: return ".q_normed_first";
    case Variant::GammaMerged: return ".gamma_merged";
    case Variant::AlphaKBf16: return ".alpha_k_bf16";
  }
  return "";
}

const std::vector<Variant>& all_variants() {
  static const std::vector<Variant> v = {Variant::Default, Variant::AlphaQFolded,
                                         Variant::QNormedFirst, Variant::GammaMerged,
                                         Variant::AlphaKBf16};
  return v;
}

namespace {

// One absorbed implementation: a variant of SPEC §1.2, or the default with one mutant's bug.
struct Flavor {
  Variant v = Variant::Default;
  Mutant m = Mutant::None;
  bool is(Mutant x) const { return m == x; }
};

// E.2 with the eps mutants: 1/sqrt(ss/n + eps) (correct), 1/(sqrt(ss/n) + eps), 1/sqrt(ss/n).
template <class Acc>
Acc stat(Acc ss, int n, Acc eps, const Flavor& f) {
  using std::sqrt;
  if (f.is(Mutant::EpsOutsideSqrt)) return Acc(1) / (sqrt(ss / Acc(n)) + eps);
  if (f.is(Mutant::NoEps)) return Acc(1) / sqrt(ss / Acc(n));
  return inv_rms_from(ss, n, eps);
}

template <class Acc>
Acc sum_sq_lowp(const Acc* z, int n) {  // mutant alpha_k_lowp: partial sums rounded to bf16
  Acc s = 0;
  for (int j = 0; j < n; ++j) s = store(DType::BF16, s + z[j] * z[j]);
  return s;
}

// Blockwise rope normalization in the order `order` (the config's, or swapped by the mutant).
template <class Acc>
void rope_norm(Acc* z, const Acc* gamma, int64_t pos, const Case& k, Acc eps, const Flavor& f) {
  const int dr = k.cfg.d_r;
  bool ntr = k.cfg.rope_order == RopeOrder::NormThenRope;
  if (f.is(Mutant::RopeOrderSwapped)) ntr = !ntr;
  if (!ntr) rotate(z, k, pos);
  scale_gain(z, dr, gamma, stat(sum_sq(z, dr), dr, eps, f));
  if (ntr) rotate(z, k, pos);
}

bool norm_then_rope(const Case& k, const Flavor& f) {
  return (k.cfg.rope_order == RopeOrder::NormThenRope) != f.is(Mutant::RopeOrderSwapped);
}

// The latent cache of one sequence, as a decode kernel reads it.
template <class Acc>
struct LatentCache {
  std::vector<Acc> c;        // [T, r] as stored
  std::vector<Acc> rope;     // [T, d_r] kr^ (blockwise) or gained rotated rope key (unified), D
  std::vector<Acc> alpha_k;  // [T, G]
};

// Append step (A.3): the content key is formed transiently in Acc for its statistic only.
template <class Acc>
LatentCache<Acc> build_cache(const Case& k, int b, const std::vector<Acc>& wk, Acc eps, const Flavor& f) {
  const MlaConfig& cf = k.cfg;
  const DType D = stored_dtype(cf.profile);
  const Tensor& kpe = k.get("k_pe");
  const int G = cf.groups, dc = cf.d_c, dr = cf.d_r, r = cf.latent_rank;
  const int64_t T = cf.seqlens[size_t(b)];
  const bool unified = cf.norm == NormMode::Unified, ntr = norm_then_rope(k, f);
  const bool joint = unified || f.is(Mutant::JointNormInBlockwise);
  const std::vector<Acc> gk = to_acc<Acc>(k.get(unified ? "gamma_k" : "gamma_rk"));
  LatentCache<Acc> lc;
  lc.c = latent_rows<Acc>(k, b, T);
  // The transient keys of this sequence [T, G*d_c]: used for their statistics, then discarded.
  std::vector<Acc> keys(static_cast<size_t>(T * G * dc));
  rows_mat(lc.c.data(), T, r, wk.data(), G * dc, G * dc, keys.data());
  for (int64_t t = 0; t < T; ++t) {
    const Acc* key = &keys[size_t(t * G * dc)];
    std::vector<Acc> z(kpe.data.begin() + kpe.index({b, t, 0}), kpe.data.begin() + kpe.index({b, t, 0}) + dr);
    if (unified && !ntr) rotate(z.data(), k, t);
    const Acc rope_ss = sum_sq(z.data(), dr);  // raw, or rotated (unified rope_then_norm)
    for (int g = 0; g < G; ++g) {
      const Acc* kg = key + g * dc;
      Acc ss = f.is(Mutant::AlphaKLowp) ? sum_sq_lowp(kg, dc) : sum_sq(kg, dc);
      int n = dc;
      if (f.is(Mutant::AlphaKFromLatent)) ss = sum_sq(lc.c.data() + t * r, r), n = r;
      if (joint) ss += rope_ss, n += dr;
      lc.alpha_k.push_back(stat(ss, n, eps, f));
    }
    if (unified) {
      scale_gain(z.data(), dr, gk.data() + dc, Acc(1));
      if (ntr) rotate(z.data(), k, t);
    } else {
      rope_norm(z.data(), gk.data(), t, k, eps, f);
    }
    for (Acc x : z) lc.rope.push_back(store(D, x));
  }
  return lc;
}

template <class Acc>
struct LatentQuery {
  std::vector<Acc> q_latent, rope;  // [r], [d_r], rounded to D
  Acc alpha_q = 0;                  // reported statistic 1 / S^q
  Acc row_scale = 1;                // what multiplies alpha_k after the dot: alpha_q or 1 (folded)
};

template <class Acc>
LatentQuery<Acc> query(const Case& k, int b, int i, int h, const Flavor& f, const std::vector<Acc>& wk,
                       const std::vector<Acc>& wk_merged, Acc eps) {
  const MlaConfig& cf = k.cfg;
  const DType D = stored_dtype(cf.profile);
  const Tensor& qn = k.get("q_nope");
  const Tensor& qp = k.get("q_pe");
  const int G = cf.groups, dc = cf.d_c, dr = cf.d_r, r = cf.latent_rank;
  const int g = f.is(Mutant::GroupMapMod) ? h % G : cf.group_of(h);
  const bool unified = cf.norm == NormMode::Unified, ntr = norm_then_rope(k, f);
  const std::vector<Acc> gq = to_acc<Acc>(k.get(unified ? "gamma_q" : "gamma_cq"));
  const std::vector<Acc> gk = to_acc<Acc>(k.get(unified ? "gamma_k" : "gamma_ck"));
  const int64_t pos = k.pos(b, i);
  LatentQuery<Acc> q;
  std::vector<Acc> w(qn.data.begin() + qn.index({b, i, h, 0}), qn.data.begin() + qn.index({b, i, h, 0}) + dc);
  q.rope.assign(qp.data.begin() + qp.index({b, i, h, 0}), qp.data.begin() + qp.index({b, i, h, 0}) + dr);
  // A.2 / U.1: the query statistic.
  if (unified) {
    if (!ntr && pos < 0) q.alpha_q = std::numeric_limits<Acc>::quiet_NaN();
    else {
      if (!ntr) rotate(q.rope.data(), k, pos);
      q.alpha_q = stat(sum_sq(w.data(), dc) + sum_sq(q.rope.data(), dr), dc + dr, eps, f);
      scale_gain(q.rope.data(), dr, gq.data() + dc, Acc(1));
      if (ntr && pos >= 0) rotate(q.rope.data(), k, pos);
    }
  } else {
    Acc ss = sum_sq(w.data(), dc);
    int n = dc;
    if (f.is(Mutant::JointNormInBlockwise)) ss += sum_sq(q.rope.data(), dr), n += dr;
    q.alpha_q = stat(ss, n, eps, f);
    if (pos >= 0) rope_norm(q.rope.data(), to_acc<Acc>(k.get("gamma_rq")).data(), pos, k, eps, f);
  }
  // A.1: q_latent [r] = w . WK_g^T with w per variant.
  const std::vector<Acc>* W = &wk;
  if (f.v == Variant::GammaMerged) W = &wk_merged;
  else if (f.v == Variant::QNormedFirst) scale_gain(w.data(), dc, gq.data(), q.alpha_q), scale_gain(w.data(), dc, gk.data(), Acc(1));
  else
    for (int j = 0; j < dc; ++j) {
      const Acc gkj = f.is(Mutant::NoGammaK) ? Acc(1) : f.is(Mutant::GammaKTwice) ? gk[size_t(j)] * gk[size_t(j)] : gk[size_t(j)];
      w[size_t(j)] = (w[size_t(j)] * gq[size_t(j)]) * gkj;
    }
  q.q_latent.resize(size_t(r));
  for (int l = 0; l < r; ++l) q.q_latent[size_t(l)] = dot(w.data(), W->data() + int64_t(l) * G * dc + g * dc, dc);
  // Folded and normalized-first queries carry alpha_q themselves; in unified mode alpha_q scales
  // the whole score, so the query rope part carries it as well.
  const bool folded = f.v == Variant::AlphaQFolded, carries = folded || f.v == Variant::QNormedFirst;
  q.row_scale = carries || f.is(Mutant::NoAlphaQ) ? Acc(1) : q.alpha_q;
  if (folded) for (Acc& x : q.q_latent) x *= q.alpha_q;
  if (carries && unified) for (Acc& x : q.rope) x *= q.alpha_q;
  for (Acc& x : q.q_latent) x = store(D, x);
  for (Acc& x : q.rope) x = store(D, x);
  return q;
}

template <class Acc>
Acc latent_dot(const Acc* a, const Acc* b, int n, const Flavor& f) {
  if (!f.is(Mutant::ScoreLowpAccum)) return dot(a, b, n);
  Acc s = 0;  // mutant: partial sums rounded to bf16
  for (int j = 0; j < n; ++j) s = store(DType::BF16, s + a[j] * b[j]);
  return s;
}

std::string flavor_id(const MlaConfig& cf, const Flavor& f) {
  if (f.m != Mutant::None) return "mutant." + mutant_name(f.m) + "." + to_string(cf.profile);
  return "cpu.absorbed." + to_string(cf.profile) + variant_suffix(f.v);
}

template <class Acc>
std::vector<Outputs> run(const Case& k, const std::vector<Flavor>& flavors) {
  const MlaConfig& cf = k.cfg;
  const DType D = stored_dtype(cf.profile), A = accumulate_dtype(cf.profile);
  const Acc eps = Acc(cf.eps);
  const int H = cf.heads, S = cf.s_q, G = cf.groups, dc = cf.d_c, dr = cf.d_r, dv = cf.d_v, r = cf.latent_rank;
  const bool unified = cf.norm == NormMode::Unified;
  const std::vector<Acc> wk = to_acc<Acc>(k.get("w_uk")), wv = to_acc<Acc>(k.get("w_uv"));
  // GammaMerged: WK_g[:, j] * gamma_q_j * gamma_k_j in double, rounded once to the weight dtype.
  std::vector<Acc> wk_merged(wk.size());
  {
    const Tensor& gq = k.get(unified ? "gamma_q" : "gamma_cq");
    const Tensor& gk = k.get(unified ? "gamma_k" : "gamma_ck");
    const Tensor& w = k.get("w_uk");
    for (int64_t n = 0; n < w.numel(); ++n) {
      const int64_t j = n % (G * dc) % dc;
      const double merged = round_to(D, w[n] * gq[j] * gk[j]);  // offline, in double, rounded once
      if constexpr (std::is_floating_point_v<Acc>) wk_merged[size_t(n)] = Acc(merged);
      else wk_merged[size_t(n)] = Acc::rounded_from((long double)w[n] * gq[j] * gk[j], merged);
    }
  }
  std::vector<Outputs> outs;
  for (const Flavor& f : flavors) {
    Outputs o;
    o.impl = flavor_id(cf, f);
    o.tensors["out"] = make_output(k, "out", D, 0.0);
    o.tensors["latent_out"] = make_output(k, "latent_out", D, 0.0);
    o.tensors["lse"] = make_output(k, "lse", A, 0.0);
    o.tensors["alpha_q"] = make_output(k, "alpha_q", A, 0.0);
    o.tensors["alpha_k"] = make_output(k, "alpha_k", f.v == Variant::AlphaKBf16 ? DType::BF16 : A,
                                       std::numeric_limits<double>::quiet_NaN());
    outs.push_back(std::move(o));
  }
  std::vector<double> seconds(flavors.size(), 0.0);
  const bool any_cache_mutant = std::any_of(flavors.begin(), flavors.end(), [](const Flavor& f) { return f.m != Mutant::None; });
  for (int b = 0; b < cf.batch; ++b) {
    const int64_t T = cf.seqlens[size_t(b)];
    const auto t0 = std::chrono::steady_clock::now();
    const LatentCache<Acc> shared = build_cache(k, b, wk, eps, Flavor{});  // the correct cache
    const double cache_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t fi = 0; fi < flavors.size(); ++fi) {
      const auto t1 = std::chrono::steady_clock::now();
      const Flavor& f = flavors[fi];
      const LatentCache<Acc> own = any_cache_mutant && f.m != Mutant::None ? build_cache(k, b, wk, eps, f) : LatentCache<Acc>{};
      const LatentCache<Acc>& cache = f.m != Mutant::None ? own : shared;
      Outputs& o = outs[fi];
      std::vector<Acc> alpha_k = cache.alpha_k;
      if (f.v == Variant::AlphaKBf16) for (Acc& a : alpha_k) a = store(DType::BF16, a);
      for (int64_t t = 0; t < T; ++t)
        for (int g = 0; g < G; ++g) o.tensors["alpha_k"].at({b, t, g}) = double(alpha_k[size_t(t * G + g)]);
      const Acc scale = f.is(Mutant::ScaleDcOnly) ? Acc(1.0 / std::sqrt(double(dc))) : Acc(cf.softmax_scale);
      for (int i = 0; i < S; ++i)
        for (int h = 0; h < H; ++h) {
          const LatentQuery<Acc> q = query(k, b, i, h, f, wk, wk_merged, eps);
          o.tensors["alpha_q"].at({b, i, h}) = double(q.alpha_q);
          const int g = f.is(Mutant::GroupMapMod) ? h % G : cf.group_of(h);
          std::vector<Acc> p;
          std::vector<int64_t> ts;
          for (int64_t t = 0; t < T; ++t) {
            const bool extra = f.is(Mutant::CausalOffByOne) && cf.causal && t == k.pos(b, i) + 1;
            if (!k.causal_visible(b, i, t) && !extra) continue;
            const Acc latent = latent_dot(q.q_latent.data(), cache.c.data() + t * r, r, f);  // A.4
            const Acc rope = dot(q.rope.data(), cache.rope.data() + t * dr, dr);
            const int64_t tk = f.is(Mutant::AlphaKOffByOne) ? std::max<int64_t>(t - 1, 0) : t;
            const Acc ak = alpha_k[size_t(tk * G + g)];
            p.push_back(unified ? scale * ((q.row_scale * ak) * (latent + rope))
                                : scale * ((q.row_scale * ak) * latent + rope));
            ts.push_back(t);
          }
          const Acc lse = softmax(p);
          o.tensors["lse"].at({b, i, h}) = double(f.is(Mutant::LseBase2) ? lse / Acc(std::log(2.0)) : lse);
          std::vector<Acc> lat(size_t(r), Acc(0));  // A.5
          for (size_t n = 0; n < ts.size(); ++n) {
            const Acc* ct = cache.c.data() + ts[n] * r;
            for (int l = 0; l < r; ++l) lat[size_t(l)] += p[n] * ct[l];
          }
          for (Acc& x : lat) x = store(D, x);
          std::vector<Acc> out(size_t(dv), Acc(0));
          vec_mat(lat.data(), r, wv.data(), G * dv, g * dv, dv, out.data());  // A.6
          for (int l = 0; l < r; ++l) o.tensors["latent_out"].at({b, i, h, l}) = double(lat[size_t(l)]);
          for (int j = 0; j < dv; ++j) o.tensors["out"].at({b, i, h, j}) = double(store(D, out[size_t(j)]));
        }
      seconds[fi] += cache_s + std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    }
  }
  for (size_t fi = 0; fi < flavors.size(); ++fi) outs[fi].seconds = seconds[fi];
  return outs;
}

}  // namespace

std::vector<Variant> variants_for(Profile p) {
  std::vector<Variant> v;
  for (Variant x : all_variants())  // a bf16 alpha_k is an option of the bf16-stored profiles only
    if (x != Variant::AlphaKBf16 || p == Profile::BF16 || p == Profile::FP8) v.push_back(x);
  return v;
}

std::vector<Outputs> cpu_absorbed_bounds(const Case& k) {
  bounds::units() = bounds::make_units(accumulate_dtype(k.cfg.profile));
  std::vector<Flavor> f;
  for (Variant v : variants_for(k.cfg.profile)) f.push_back({v, Mutant::None});
  std::vector<Outputs> out = run<bounds::EB>(k, f);
  for (Outputs& o : out) o.impl = "bound." + o.impl;
  return out;
}

std::vector<Outputs> cpu_absorbed_all(const Case& k) {
  std::vector<Flavor> f;
  for (Variant v : variants_for(k.cfg.profile)) f.push_back({v, Mutant::None});
  return accumulate_dtype(k.cfg.profile) == DType::F64 ? run<double>(k, f) : run<float>(k, f);
}

Outputs cpu_absorbed(const Case& k, Variant v) {
  const std::vector<Flavor> f = {{v, Mutant::None}};
  return accumulate_dtype(k.cfg.profile) == DType::F64 ? run<double>(k, f)[0] : run<float>(k, f)[0];
}

namespace {
template <class Acc>
Case kernel_case_t(const Case& k) {
  const MlaConfig& cf = k.cfg;
  const DType D = stored_dtype(cf.profile), A = accumulate_dtype(cf.profile);
  const int H = cf.heads, S = cf.s_q, G = cf.groups, dr = cf.d_r, r = cf.latent_rank;
  const int64_t T = k.t_max();
  const std::vector<Acc> wk = to_acc<Acc>(k.get("w_uk"));
  const Flavor f{};
  Case kc{cf, {}, nullptr};
  kc.cfg.level = Level::Kernel;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor& ql = kc.tensors["q_latent"] = Tensor(D, {cf.batch, S, H, r});
  Tensor& aq = kc.tensors["alpha_q"] = Tensor(A, {cf.batch, S, H});
  Tensor& qr = kc.tensors["q_rope"] = Tensor(D, {cf.batch, S, H, dr});
  Tensor& kv = kc.tensors["kv_c"] = Tensor(D, {cf.batch, T, r}, nan);
  Tensor& kr = kc.tensors["k_rope"] = Tensor(D, {cf.batch, T, dr}, nan);
  Tensor& ak = kc.tensors["alpha_k"] = Tensor(A, {cf.batch, T, G}, nan);
  kc.tensors["seqlens"] = k.get("seqlens");
  for (int b = 0; b < cf.batch; ++b) {
    const LatentCache<Acc> cache = build_cache(k, b, wk, Acc(cf.eps), f);
    for (int64_t t = 0; t < cf.seqlens[size_t(b)]; ++t) {
      for (int l = 0; l < r; ++l) kv.at({b, t, l}) = double(cache.c[size_t(t * r + l)]);
      for (int j = 0; j < dr; ++j) kr.at({b, t, j}) = double(cache.rope[size_t(t * dr + j)]);
      for (int g = 0; g < G; ++g) ak.at({b, t, g}) = double(cache.alpha_k[size_t(t * G + g)]);
    }
    for (int i = 0; i < S; ++i)
      for (int h = 0; h < H; ++h) {
        const LatentQuery<Acc> q = query(k, b, i, h, f, wk, wk, Acc(cf.eps));
        aq.at({b, i, h}) = double(q.alpha_q);
        for (int l = 0; l < r; ++l) ql.at({b, i, h, l}) = double(q.q_latent[size_t(l)]);
        for (int j = 0; j < dr; ++j) qr.at({b, i, h, j}) = double(q.rope[size_t(j)]);
      }
  }
  if (cf.profile == Profile::FP8) {  // the kernel reads the e4m3 codes and their scales themselves
    kc.tensors["kv_c"] = k.get("kv_c");
    kc.tensors["kv_c_scale"] = k.get("kv_c_scale");
    attach_latent(kc);
  }
  return kc;
}
}  // namespace

Case kernel_case(const Case& k) {
  return accumulate_dtype(k.cfg.profile) == DType::F64 ? kernel_case_t<double>(k) : kernel_case_t<float>(k);
}

Outputs cpu_mutant(const Case& k, Mutant m) {
  const std::vector<Flavor> f = {{Variant::Default, m}};
  return accumulate_dtype(k.cfg.profile) == DType::F64 ? run<double>(k, f)[0] : run<float>(k, f)[0];
}

}  // namespace qkmla::impl
