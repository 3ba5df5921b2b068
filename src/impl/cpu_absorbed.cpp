// cpu.absorbed.<profile>[.<variant>] (and the mutants, the same code under a Perturbation):
// conventions §1.2. Rounding points: a Design (core/design.hpp); by default conventions §3's:
// q_latent, the query rope part and the cached rope key rounded to D; c as stored; alpha_q and
// alpha_k in Acc (the alpha_k_bf16 variant rounds alpha_k to bf16); logits, softmax and p.c in Acc,
// p unrounded; latent_out rounded to D; out = latent_out . WV accumulated in Acc and rounded to D.
#include <chrono>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>

#include "bounds/error_bound.hpp"
#include "impl/absorbed_stages.hpp"
#include "impl/cpu_impls.hpp"

namespace qkmla::impl {

namespace {

// WK with gamma_q (.) gamma_k merged into each column: in double, rounded once to the weight dtype
// (the gamma_merged variant; empty when no spec asks for it).
template <class Acc>
std::vector<Acc> merged_weights(const Case& k, const std::vector<AbsorbedSpec>& specs) {
  const MlaConfig& cf = k.cfg;
  bool wanted = false;
  for (const AbsorbedSpec& s : specs) wanted |= s.v == Variant::GammaMerged;
  if (!wanted || cf.norm == NormMode::None) return {};
  const bool unified = cf.norm == NormMode::Unified;
  const Tensor& gq = k.get(unified ? "gamma_q" : "gamma_cq");
  const Tensor& gk = k.get(unified ? "gamma_k" : "gamma_ck");
  const Tensor& w = k.get("w_uk");
  const DType D = stored_dtype(cf.profile);
  std::vector<Acc> out(size_t(w.numel()));
  for (int64_t n = 0; n < w.numel(); ++n) {
    const int64_t j = n % (int64_t(cf.groups) * cf.d_c) % cf.d_c;
    const double merged = round_to(D, w[n] * gq[j] * gk[j]);  // offline, in double, rounded once
    if constexpr (std::is_floating_point_v<Acc>)
      out[size_t(n)] = Acc(merged);
    else
      out[size_t(n)] = Acc::rounded_from((long double)w[n] * gq[j] * gk[j], merged);
  }
  return out;
}

template <class Acc>
Outputs empty_outputs(const Case& k, const Design& d) {
  const MlaConfig& cf = k.cfg;
  const DType A = accumulate_dtype(cf.profile);
  Outputs o;
  o.tensors["out"] = make_output(k, "out", d.out, 0.0);
  o.tensors["latent_out"] =
      make_output(k, "latent_out", rounds_at(d.latent_file, A) ? d.latent_file : d.latent_out, 0.0);
  o.tensors["lse"] = make_output(k, "lse", A, 0.0);
  if (cf.norm == NormMode::None) return o;  // plain MLA: no statistics
  o.tensors["alpha_q"] = make_output(k, "alpha_q", A, 0.0);
  o.tensors["alpha_k"] =
      make_output(k, "alpha_k", d.alpha_k, std::numeric_limits<double>::quiet_NaN());
  return o;
}

// One sequence b of one implementation: every query row against the sequence's cache.
template <class Acc>
void run_sequence(const Case& k, int b, const AbsorbedSpec& s, const LatentCache<Acc>& cache,
                  const std::vector<Acc>& wk_t, const std::vector<Acc>& wk_merged_t,
                  const std::vector<Acc>& wv, Outputs& o) {
  const MlaConfig& cf = k.cfg;
  const DType A = accumulate_dtype(cf.profile);
  const Perturbation& p = s.p;
  const Design d = design_of(s, cf.profile);
  const int G = cf.groups, dv = cf.d_v, r = cf.latent_rank;
  const int64_t T = cf.seqlens[size_t(b)];
  const bool stats = cf.norm != NormMode::None;
  // A design that caches alpha_k narrower or takes it through an approximate rsqrt reads its own
  // alpha_k [T, G]; one that stores the dequantized latent cache rounds each row as it reads it;
  // the rest is the shared cache's (no design holds a second copy of the rows).
  LatentView<Acc> lc(cache);
  std::vector<Acc> own_alpha_k;
  if (d.alpha_k != A || d.approx_rsqrt) {
    own_alpha_k = cache.alpha_k;
    if (d.approx_rsqrt)
      for (Acc& a : own_alpha_k) a = approx_rsqrt_of(a);
    if (d.alpha_k != A)
      for (Acc& a : own_alpha_k) a = store(d.alpha_k, a);
    lc.alpha_k = own_alpha_k.data();
  }
  if (rounds_at(d.cache, A)) lc.round_c = d.cache;
  // Looked up once: a name lookup per element costs more than the element's store.
  Tensor &o_out = o.tensors["out"], &o_lse = o.tensors["lse"], &o_lat = o.tensors["latent_out"];
  if (stats) {
    Tensor& o_ak = o.tensors["alpha_k"];
    for (int64_t t = 0; t < T; ++t)
      for (int g = 0; g < G; ++g) o_ak.at({b, t, g}) = double(lc.alpha_k[size_t(t * G + g)]);
  }
  const Acc scale = design_scale<Acc>(d, hook::softmax_scale(p, cf));
  for (int i = 0; i < cf.s_q; ++i)
    for (int h = 0; h < cf.heads; ++h) {
      const LatentQuery<Acc> q =
          latent_query(k, b, i, h, s.v, p, wk_t, wk_merged_t, constant<Acc>(cf.eps), d);
      if (stats) o.tensors["alpha_q"].at({b, i, h}) = double(q.alpha_q);
      const int g = hook::group_of(p, cf, h);
      const std::vector<int64_t> tokens = hook::tokens(p, k, b, i);
      std::vector<Acc> lat;
      const RowRounding rr = row_rounding(d, A, k, h);
      const Acc lse = latent_attend(cf, q, lc, g, tokens, scale, p, rr, lat);
      o_lse.at({b, i, h}) = double(round_point(
          d.lse, A, hook::lse_out(p, apply_sink(k, p, h, lse, lat, rr), Acc(std::log(2.0)))));
      for (Acc& x : lat) x = round_point(d.latent_out, A, x);
      std::vector<Acc> out(size_t(dv), Acc(0));
      vec_mat(lat.data(), r, wv.data(), G * dv, g * dv, dv, out.data());  // A.6
      for (int l = 0; l < r; ++l)
        o_lat.at({b, i, h, l}) = double(round_point(d.latent_file, A, lat[size_t(l)]));
      for (int j = 0; j < dv; ++j)
        o_out.at({b, i, h, j}) = double(round_point(d.out, A, out[size_t(j)]));
    }
}

template <class Acc>
std::vector<Outputs> run(const Case& k, const std::vector<AbsorbedSpec>& specs) {
  const MlaConfig& cf = k.cfg;
  const Acc eps = constant<Acc>(cf.eps);
  const std::vector<Acc> wk = to_acc<Acc>(k.get("w_uk")), wv = to_acc<Acc>(k.get("w_uv"));
  const std::vector<Acc> wk_merged = merged_weights<Acc>(k, specs);
  const int r = cf.latent_rank, G = cf.groups, dc = cf.d_c;
  const std::vector<Acc> wk_t = query_weights(wk, r, G, dc),
                         wk_merged_t = query_weights(wk_merged, r, G, dc);
  bool any_gram = false;
  std::vector<Outputs> outs;
  for (const AbsorbedSpec& s : specs) {
    outs.push_back(empty_outputs<Acc>(k, design_of(s, cf.profile)));
    any_gram = any_gram || design_of(s, cf.profile).gram_alpha_k;
  }
  const std::vector<Acc> gram = any_gram && cf.norm != NormMode::None
                                    ? gram_of(wk, cf.latent_rank, cf.groups, cf.d_c)
                                    : std::vector<Acc>{};
  std::vector<double> seconds(specs.size(), 0.0);
  for (int b = 0; b < cf.batch; ++b) {
    // The correct caches, one per rope format the specs ask for, shared by every unperturbed spec.
    // The rope key's rounding point, the eager format, the Gram-form statistic.
    using Formats = std::tuple<DType, DType, bool>;
    std::map<Formats, LatentCache<Acc>> correct;
    std::map<Formats, double> cache_s;
    const auto formats = [&](const AbsorbedSpec& s) {
      const Design d = design_of(s, cf.profile);
      return Formats{d.rope, d.eager, d.gram_alpha_k && !gram.empty()};
    };
    const auto cache_of = [&](const Formats& f, const Perturbation& p) {
      return build_cache(k, b, wk, eps, p, std::get<0>(f), std::get<1>(f),
                         std::get<2>(f) ? &gram : nullptr);
    };
    for (const AbsorbedSpec& s : specs) {
      const Formats rope = formats(s);
      if (!s.p.is_none() || correct.count(rope)) continue;
      const auto t0 = std::chrono::steady_clock::now();
      correct[rope] = cache_of(rope, Perturbation{});
      cache_s[rope] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    for (size_t n = 0; n < specs.size(); ++n) {
      const auto t1 = std::chrono::steady_clock::now();
      const Formats rope = formats(specs[n]);
      const bool perturbed = !specs[n].p.is_none();
      const LatentCache<Acc> own = perturbed ? cache_of(rope, specs[n].p) : LatentCache<Acc>{};
      run_sequence(k, b, specs[n], perturbed ? own : correct.at(rope), wk_t, wk_merged_t, wv,
                   outs[n]);
      seconds[n] += (perturbed ? 0.0 : cache_s[rope]) +
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    }
  }
  for (size_t n = 0; n < specs.size(); ++n) outs[n].seconds = seconds[n];
  return outs;
}

}  // namespace

Design design_of(const AbsorbedSpec& s, Profile p) {
  if (s.design) return *s.design;
  Design d = spec_design(p, Form::Absorbed);
  if (s.v == Variant::AlphaKBf16) d.alpha_k = DType::BF16;
  return d;
}

std::vector<Variant> variants_for(Profile p, NormMode norm) {
  std::vector<Variant> v = {Variant::Default};
  if (norm == NormMode::None) return v;  // no statistics, no gains: nothing to vary
  for (Variant x : {Variant::AlphaQFolded, Variant::QNormedFirst, Variant::GammaMerged})
    v.push_back(x);
  if (p == Profile::BF16 || is_fp8(p)) v.push_back(Variant::AlphaKBf16);  // conventions §3
  return v;
}

std::vector<Outputs> cpu_absorbed(const Case& k, const std::vector<AbsorbedSpec>& specs) {
  if (specs.empty()) return {};
  return accumulate_dtype(k.cfg.profile) == DType::F64 ? run<double>(k, specs)
                                                       : run<float>(k, specs);
}

std::vector<Outputs> cpu_absorbed_bounds(const Case& k, const std::vector<AbsorbedSpec>& specs) {
  bounds::units() = bounds::make_units(accumulate_dtype(k.cfg.profile));
  return run<bounds::EB>(k, specs);
}

}  // namespace qkmla::impl
