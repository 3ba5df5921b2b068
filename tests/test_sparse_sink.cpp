// sparse.* and sink.*: sparse top-k index sets and attention sinks (conventions §1.5,
// proofs/absorption.md K.1-K.2) in the generator, the case checks, the reference of both forms,
// certify and the CPU implementations.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "all_impls.hpp"
#include "core/generator.hpp"
#include "core/rng.hpp"
#include "harness/registry.hpp"
#include "helpers.hpp"
#include "impl/mutants.hpp"
#include "reference/certify.hpp"
#include "reference/mp.hpp"
#include "reference/reference.hpp"

using namespace qkmla;

namespace {

MlaConfig sparse_config(const std::string& preset, NormMode norm, int topk, bool sink,
                        uint64_t seed) {
  MlaConfig c = test::tiny_config(Profile::BF16, {0, 2, 17, 40}, 2, norm, seed, preset);
  c.topk = topk;
  c.attn_sink = sink;
  return c;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape != b.shape) return false;
  for (int64_t n = 0; n < a.numel(); ++n)
    if (!(a[n] == b[n] || (std::isnan(a[n]) && std::isnan(b[n])))) return false;
  return true;
}

}  // namespace

TEST_CASE("sparse.generator.index_sets_inside_the_window") {
  const uint64_t seed = test::seed(501);
  const MlaConfig c = sparse_config("tiny", NormMode::Blockwise, 7, false, seed);
  CAPTURE(seed);
  const Case k = generate_case(c);
  const Tensor& ix = k.get("indices");
  CHECK(ix.dtype == DType::I32);
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.s_q; ++i) {
      const int64_t T = c.seqlens[size_t(b)];
      const int64_t window = T == 0 ? 0 : T - c.s_q + i + 1;
      const int64_t n = std::min<int64_t>(7, window);
      const std::vector<int64_t> got = k.tokens(b, i);
      CHECK(int64_t(got.size()) <= n);
      CHECK(int64_t(got.size()) >= (n + 1) / 2);
      for (int64_t t : got) CHECK((t >= 0 && t < window));
      std::vector<int64_t> sorted = got;
      std::sort(sorted.begin(), sorted.end());
      CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    }
  // The dense tensors are those of the same seed without --topk and --attn-sink.
  MlaConfig dense = c;
  dense.topk = 0;
  const Case kd = generate_case(dense);
  for (const auto& [name, t] : kd.tensors) CHECK(same_bits(t, k.get(name)));
}

TEST_CASE("sparse.case.bad_indices_refused_naming_the_tensor") {
  Case k = generate_case(sparse_config("tiny", NormMode::Blockwise, 4, false, 5));
  validate_case(k);
  Tensor& ix = k.tensors.at("indices");
  ix.at({3, 0, 0}) = 40;  // T_b = 40: one past the end
  CHECK_THROWS_WITH_AS(validate_case(k), doctest::Contains("outside [0, T_b = 40)"), ConfigError);
  ix.at({3, 0, 0}) = ix.at({3, 0, 1});
  CHECK_THROWS_WITH_AS(validate_case(k), doctest::Contains("lists a slot twice"), ConfigError);
  ix.at({3, 0, 0}) = -2;
  CHECK_THROWS_AS(validate_case(k), ConfigError);
}

// K.2: top-k whose sets list the whole causal window (shuffled) is the dense case, exactly for the
// reference (the same sums up to order, at 113 bits) and bit for bit for no implementation but in
// value within rounding; checked on the reference forms.
TEST_CASE("sparse.reference.full_window_equals_dense") {
  const uint64_t seed = test::seed(502);
  CAPTURE(seed);
  MlaConfig c = sparse_config("tiny", NormMode::Blockwise, 40, false, seed);
  Case k = generate_case(c);
  Tensor& ix = k.tensors.at("indices");
  Rng rng(seed);
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.s_q; ++i) {
      const int64_t T = c.seqlens[size_t(b)];
      std::vector<int64_t> all(size_t(T == 0 ? 0 : T - c.s_q + i + 1));
      std::iota(all.begin(), all.end(), 0);
      for (size_t j = all.size(); j > 1; --j) std::swap(all[j - 1], all[rng.below(j)]);
      for (int j = 0; j < c.topk; ++j)
        ix.at({b, i, j}) = j < int(all.size()) ? double(all[size_t(j)]) : -1.0;
    }
  attach_latent(k);
  MlaConfig dc = c;
  dc.topk = 0;
  Case kd = generate_case(dc);
  const ref::Dots d = ref::exact_dots(k), dd = ref::exact_dots(kd);
  ref::PrecisionScope scope(113);
  for (bool absorbed : {false, true}) {
    const Outputs s = absorbed ? ref::ref_absorbed(k, d) : ref::ref_explicit(k, d, true);
    const Outputs x = absorbed ? ref::ref_absorbed(kd, dd) : ref::ref_explicit(kd, dd, true);
    for (const std::string t : {"out", "lse"}) {
      CAPTURE(t);
      const Tensor &a = s.tensors.at(t), &y = x.tensors.at(t);
      for (int64_t n = 0; n < y.numel(); ++n)  // -inf: an empty row in both
        CHECK((a[n] == y[n] || std::fabs(a[n] - y[n]) <= 1e-15 * std::max(1.0, std::fabs(y[n]))));
    }
  }
}

// K.1: a sink scales out by 1 / (1 + exp(s_h - lse)) and leaves lse; -inf is no sink.
TEST_CASE("sink.reference.factor_closed_form_and_minus_inf") {
  const uint64_t seed = test::seed(503);
  CAPTURE(seed);
  const MlaConfig c = sparse_config("tiny", NormMode::Blockwise, 0, true, seed);
  const Case k = generate_case(c);
  REQUIRE(k.sink(c.heads - 1) == -INFINITY);  // H = 4: the last head has none
  MlaConfig nc = c;
  nc.attn_sink = false;
  const Case kn = generate_case(nc);
  const ref::Dots d = ref::exact_dots(k), dn = ref::exact_dots(kn);
  ref::PrecisionScope scope(113);
  for (bool absorbed : {false, true}) {
    const Outputs s = absorbed ? ref::ref_absorbed(k, d) : ref::ref_explicit(k, d, true);
    const Outputs n = absorbed ? ref::ref_absorbed(kn, dn) : ref::ref_explicit(kn, dn, true);
    CHECK(same_bits(s.tensors.at("lse"), n.tensors.at("lse")));
    int64_t scaled = 0;
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < c.s_q; ++i)
        for (int h = 0; h < c.heads; ++h) {
          const double lse = n.tensors.at("lse").at({b, i, h});
          const double f = lse == -INFINITY ? 0.0 : 1.0 / (1.0 + std::exp(k.sink(h) - lse));
          scaled += f > 0 && f < 0.999;
          for (int j = 0; j < c.d_v; ++j) {
            const double want = f * n.tensors.at("out").at({b, i, h, j});
            CHECK(std::fabs(s.tensors.at("out").at({b, i, h, j}) - want) <=
                  1e-14 * std::fabs(want) + 1e-300);
          }
        }
    CHECK(scaled > 0);  // the check can fail: some rows are really scaled
  }
}

TEST_CASE("sink.impls.every_cpu_implementation_applies_it") {
  const uint64_t seed = test::seed(504);
  CAPTURE(seed);
  const Case k = generate_case(sparse_config("tiny", NormMode::Blockwise, 6, true, seed));
  const std::vector<Outputs> v = test::all_impls(k);
  const Tensor& truth = v[0].tensors.at("out");
  for (const Outputs& o : v) {
    CAPTURE(to_string(o.id));
    const Tensor& x = o.tensors.at("out");
    double num = 0, den = 0;
    for (int64_t n = 0; n < truth.numel(); ++n)
      num += (x[n] - truth[n]) * (x[n] - truth[n]), den += truth[n] * truth[n];
    CHECK(std::sqrt(num / den) < 2e-2);  // bf16 rounding level; a missing sink is off by ~50 %
  }
}

TEST_CASE("sparse.certify.every_shape_class_exact_and_mutants_refuted") {
  const uint64_t seed = test::seed(505);
  CAPTURE(seed);
  for (const char* preset : {"tiny", "tiny-nope", "tiny-g1"})
    for (NormMode norm : {NormMode::Blockwise, NormMode::Unified, NormMode::None}) {
      const MlaConfig c = sparse_config(preset, norm, 6, true, seed);
      CAPTURE(config_to_json(c));
      const Case k = generate_case(c);
      const ref::CertifyResult r = ref::certify(k);
      CHECK_FALSE(r.refuted);
      CHECK(r.sink_rows == int64_t(c.heads) * 6);  // every non-empty row: 3 sequences x S_q 2
      for (const std::string m : {"topk_off_by_one", "sink_in_lse", "sink_ignored"}) {
        CAPTURE(m);
        CHECK(ref::certify(k, impl::find_mutant(m).p).refuted);
      }
    }
}
