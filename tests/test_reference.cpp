// reference.*: the multiprecision reference's building blocks, its two forms' equivalence, and
// closed-form cases every implementation must reproduce.
#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "all_impls.hpp"
#include "helpers.hpp"
#include "metrics/compare.hpp"
#include "reference/mp.hpp"
#include "reference/ref_common.hpp"
#include "reference/reference.hpp"

using namespace qkmla;

TEST_CASE("reference.rmsnorm.eps_inside_sqrt") {
  ref::PrecisionScope scope(200);
  const ref::MpVec z = {ref::Mp(3), ref::Mp(4)};  // mean square 12.5
  const ref::Mp eps = 0.5;
  const ref::Mp inv = ref::inv_rms(ref::sum_squares(z), 2, eps);
  CHECK(abs(inv - 1 / sqrt(ref::Mp(13))) < ref::Mp(1e-55));           // 1/sqrt(12.5 + 0.5)
  CHECK(abs(inv - 1 / (sqrt(ref::Mp(12.5)) + eps)) > ref::Mp(1e-3));  // not eps outside
}

TEST_CASE("reference.rmsnorm.scale_invariance_up_to_eps") {
  ref::PrecisionScope scope(200);
  ref::MpVec z = {ref::Mp(1.5), ref::Mp(-2), ref::Mp(0.25), ref::Mp(7)};
  const ref::Mp eps = 1e-6;
  const ref::Mp ms = ref::sum_squares(z) / 4;
  for (double s : {1e-3, 10.0, 1e4}) {
    ref::MpVec y = z;
    for (ref::Mp& v : y) v *= s;
    // N(s z) = s z / sqrt(s^2 ms + eps) vs N(z) = z / sqrt(ms + eps): the ratio depends on eps
    // only.
    const ref::Mp ratio =
        (s * ref::inv_rms(ref::sum_squares(y), 4, eps)) / ref::inv_rms(ref::sum_squares(z), 4, eps);
    const ref::Mp expect = sqrt((ms + eps) / (ms + eps / (ref::Mp(s) * s)));
    CHECK(abs(ratio - expect) < ref::Mp(1e-50));
    // and with eps -> 0 the norm is exactly scale invariant
    const ref::Mp r0 = (s * ref::inv_rms(ref::sum_squares(y), 4, ref::Mp(0))) /
                       ref::inv_rms(ref::sum_squares(z), 4, ref::Mp(0));
    CHECK(abs(r0 - 1) < ref::Mp(1e-55));
  }
}

namespace {

// ref.absorbed against ref.explicit at P bits: out and lse within 2^-(P-16) (normwise per row).
void check_equivalence(const MlaConfig& cfg) {
  CAPTURE(config_to_json(cfg));
  const Case k = generate_case(cfg);
  const ref::Dots d = ref::exact_dots(k);
  ref::PrecisionScope scope(113);
  const int P = ref::PrecisionScope::current_bits();
  const Outputs ex = ref::ref_explicit(k, d, true);
  const Outputs ab = ref::ref_absorbed(k, d);
  const double bits = agreeing_bits(k, ab, ex, {"out", "lse", "alpha_q", "alpha_k", "latent_out"});
  CAPTURE(bits);
  // Both forms round at every step at P bits; their agreement loses a few bits to the conditioning
  // of softmax and sums (measured 103-108 for these cases); 16 bits of margin below P.
  CHECK(bits >= P - 16);
}

}  // namespace

TEST_CASE("reference.equivalence.tiny") {
  const uint64_t s = test::seed(21);
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified})
    for (int sq : {1, 2})
      for (RopeOrder order : {RopeOrder::NormThenRope, RopeOrder::RopeThenNorm}) {
        MlaConfig c = test::tiny_config(Profile::BF16, {0, sq, 37}, sq, norm, s);
        c.rope_order = order;
        c.rope_style = order == RopeOrder::NormThenRope ? RopeStyle::Interleaved : RopeStyle::Half;
        check_equivalence(c);
      }
}

TEST_CASE("reference.equivalence.paper_decode_short") {
  const uint64_t s = test::seed(22);
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified})
    for (int sq : {1, 2})
      check_equivalence(test::tiny_config(Profile::BF16, {0, 24}, sq, norm, s, "paper-decode"));
}

TEST_CASE("reference.equivalence.scenarios_and_profiles") {
  const uint64_t s = test::seed(23);
  for (const std::string& sc : scenario_names())
    for (Profile p : {Profile::FP64, Profile::FP32, Profile::FP16}) {
      MlaConfig c = test::tiny_config(p, {5, 20}, 2, NormMode::Blockwise, s);
      c.scenario = sc;
      check_equivalence(c);
    }
}

namespace {

using test::all_impls;

// Tolerance of one element in a closed-form check. The closed-form value is computed in double
// here (at most ~64 terms of magnitude <= 10: off by < 1e-13). The reference agrees with the exact
// value to > 100 bits (reference.equivalence), so 1e-13 is its tolerance; a cpu.* implementation
// gets its proven forward error bound on the case (proofs/error_bounds.md) on top.
struct Tolerance {
  std::map<std::string, Outputs> bounds;  // cpu.* implementations' element bounds, by id
  double of(const Outputs& o, const std::string& tensor, int64_t flat) const {
    const auto b = bounds.find(to_string(o.id));
    return 1e-13 + (b == bounds.end() ? 0.0 : b->second.tensors.at(tensor)[flat]);
  }
};

Tolerance tolerance(const Case& k) { return {run_bounds(k, test::cpu_ids(k.cfg))}; }

}  // namespace

TEST_CASE("reference.closed_form.identical_keys_give_mean_of_values") {
  // Keys identical for all tokens, values not: the first half of each latent vector is shared,
  // the second half differs, and WK reads only the first half, WV only the second.
  for (Profile p : {Profile::FP64, Profile::BF16}) {
    MlaConfig cfg = test::tiny_config(p, {9, 4}, 2, NormMode::Blockwise, test::seed(31));
    Case k = generate_case(cfg);
    const int r = cfg.latent_rank, half = r / 2;
    Tensor& kv = k.tensors["kv_c"];
    Tensor& wk = k.tensors["w_uk"];
    Tensor& wv = k.tensors["w_uv"];
    for (int b = 0; b < cfg.batch; ++b)
      for (int t = 1; t < cfg.seqlens[size_t(b)]; ++t)
        for (int l = 0; l < half; ++l) kv.at({b, t, l}) = kv.at({b, 0, l});
    for (int l = 0; l < r; ++l)
      for (int64_t j = 0; j < wk.shape[1]; ++j) (l < half ? wv : wk).at({l, j}) = 0;
    for (double& x : k.tensors["k_pe"].data) x = std::isnan(x) ? x : 0;  // no rope score either
    const Tolerance tol = tolerance(k);
    int64_t zero_would_fail = 0;  // elements where an all-zero output is caught: the check can fail
    for (const Outputs& o : all_impls(k)) {
      CAPTURE(to_string(o.id));
      for (int b = 0; b < cfg.batch; ++b)
        for (int i = 0; i < cfg.s_q; ++i) {
          const int64_t visible = cfg.seqlens[size_t(b)] - cfg.s_q + i + 1;
          for (int h = 0; h < cfg.heads; ++h)
            for (int j = 0; j < cfg.d_v; ++j) {
              double mean = 0;  // exact mean of the visible values v[t] = c[t] . WV_g
              for (int t = 0; t < visible; ++t) {
                double v = 0;
                for (int l = half; l < r; ++l)
                  v += kv.at({b, t, l}) * wv.at({l, cfg.group_of(h) * cfg.d_v + j});
                mean += v / double(visible);
              }
              const Tensor& out = o.tensors.at("out");
              const double t = tol.of(o, "out", out.index({b, i, h, j}));
              CHECK(std::fabs(out.at({b, i, h, j}) - mean) <= t);
              zero_would_fail += std::fabs(mean) > t;
            }
        }
    }
    CHECK(zero_would_fail > 0);
  }
}

TEST_CASE("reference.closed_form.zero_query_gives_uniform_weights") {
  MlaConfig cfg = test::tiny_config(Profile::FP32, {6, 11}, 2, NormMode::Blockwise, test::seed(32));
  Case k = generate_case(cfg);
  for (const char* q : {"q_nope", "q_pe"})
    for (double& x : k.tensors[q].data) x = 0;
  const Tolerance tol = tolerance(k);
  for (const Outputs& o : all_impls(k)) {
    CAPTURE(to_string(o.id));
    for (int b = 0; b < cfg.batch; ++b)
      for (int i = 0; i < cfg.s_q; ++i)
        for (int h = 0; h < cfg.heads; ++h) {
          const int64_t visible = cfg.seqlens[size_t(b)] - cfg.s_q + i + 1;
          const Tensor& lse = o.tensors.at("lse");
          const double t = tol.of(o, "lse", lse.index({b, i, h}));
          CHECK(std::fabs(lse.at({b, i, h}) - std::log(double(visible))) <= t);
          CHECK(t < 1e-3);  // tight enough that a wrong row count (log(visible +- 1)) fails
        }
  }
}

TEST_CASE("reference.closed_form.empty_sequence") {
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified}) {
    const Case k = generate_case(test::tiny_config(Profile::BF16, {0, 3}, 1, norm, test::seed(33)));
    for (const Outputs& o : all_impls(k)) {
      CAPTURE(to_string(o.id));
      for (int h = 0; h < k.cfg.heads; ++h) {
        CHECK(o.tensors.at("lse").at({0, 0, h}) == -INFINITY);
        for (int j = 0; j < k.cfg.d_v; ++j) CHECK(o.tensors.at("out").at({0, 0, h, j}) == 0.0);
        CHECK(std::isfinite(o.tensors.at("lse").at({1, 0, h})));
      }
      for (int64_t t = 0; t < k.t_max(); ++t)  // no alpha_k for slots past T_b
        CHECK(std::isnan(o.tensors.at("alpha_k").at({0, t, 0})));
    }
  }
}
