// extremes.*: numerical extremes through every registered CPU implementation and the kernels'
// model (issue "hardening"): subnormal and huge inputs, a single visible token, all-equal logits,
// inf/NaN in unused cache slots and in a visible one. Never a crash; non-finite positions matched;
// verdicts as conventions §5 says (a correct implementation passes where its arithmetic can
// represent the case; where fp32 overflows and the reference does not, it fails).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "harness/judge.hpp"
#include "harness/registry.hpp"
#include "harness/truth.hpp"
#include "harness/yardstick.hpp"
#include "helpers.hpp"

using namespace qkmla;

namespace {

const std::vector<std::string> kTensors = {"out", "lse", "alpha_k", "latent_out"};

struct Judgement {
  int rows = 0, failed = 0;
  double worst_out = 0;  // the largest rel_l2 of out
  int64_t nonfinite_mismatch = 0;
  std::vector<std::string> failures;
};

// Every registered CPU and gpu.model implementation of the case, judged against its truth as the
// gate judges it (the yardstick of its own design, budgets, and for cpu.* the proven bound).
Judgement judge_all(const Case& k) {
  TruthOptions o;
  o.absorbed = true;
  const Truth t = compute_truth(k, o);
  REQUIRE(t.ok());
  std::vector<ImplId> ids;
  for (const ImplId& id : registered_ids(k.cfg, kReport))
    if (id.family == Family::Cpu || id.family == Family::GpuModel) ids.push_back(id);
  REQUIRE(!ids.empty());
  auto truth_of = [&](const std::string& name) {
    const Outputs* x = t.of(name);
    return x ? &x->tensors.at(name) : nullptr;
  };
  Judgement j;
  const std::vector<Outputs> outs = run_impls(k, ids);
  std::vector<ImplId> bounded;
  for (const ImplId& id : ids)
    if (id.family == Family::Cpu) bounded.push_back(id);
  const std::map<std::string, Outputs> bounds = run_bounds(k, bounded);
  for (size_t n = 0; n < ids.size(); ++n) {
    const Outputs& out = outs[n];
    // The gate's yardstick: correct implementations of the implementation's own design.
    const Yardstick y = measure_yardstick(k, std::vector<Design>{design_of(ids[n], k.cfg.profile)},
                                          truth_of, kTensors);
    const auto b = bounds.find(to_string(out.id));
    for (const Judged& x : judge_outputs(default_rule(), k, t, out, kTensors, y.rel_l2,
                                         b == bounds.end() ? nullptr : &b->second)) {
      ++j.rows;
      if (x.tensor == "out") j.worst_out = std::max(j.worst_out, x.m.rel_l2);
      j.nonfinite_mismatch += x.m.nonfinite_mismatch;
      if (!x.v.pass) ++j.failed, j.failures.push_back(to_string(out.id) + "/" + x.tensor);
    }
  }
  return j;
}

// What every correct implementation must show on a case it can represent.
void check_all_pass(const Judgement& j) {
  CAPTURE(j.failures.size() ? j.failures[0] : "");
  CHECK(j.rows > 0);
  CHECK(j.failed == 0);
  CHECK(j.nonfinite_mismatch == 0);
}

Case make(Profile p, std::vector<int> seqlens, int sq, NormMode n, uint64_t seed) {
  MlaConfig c = test::tiny_config(p, std::move(seqlens), sq, n, seed);
  c.set_default_scale();
  return generate_case(c);
}

void scale(Case& k, const std::string& name, double f) {
  for (double& x : k.tensors.at(name).data)
    x = std::isnan(x) ? x : round_to(k.get(name).dtype, x * f);
  attach_latent(k);
}

}  // namespace

TEST_CASE("extremes.single_visible_token_every_profile") {
  for (Profile p : {Profile::FP32, Profile::BF16, Profile::FP16, Profile::FP8})
    for (NormMode n : {NormMode::Blockwise, NormMode::None}) {
      CAPTURE(to_string(p));
      CAPTURE(to_string(n));
      check_all_pass(judge_all(make(p, {1, 0}, 1, n, test::seed(71))));
    }
}

// Subnormal fp32 keys: the key statistic underflows to 0 and eps alone decides alpha_k, as in the
// reference (eps dominates there too).
TEST_CASE("extremes.subnormal_fp32_keys") {
  Case k = make(Profile::FP32, {0, 17}, 2, NormMode::Blockwise, test::seed(72));
  scale(k, "kv_c", 0x1p-140);
  scale(k, "k_pe", 0x1p-140);
  check_all_pass(judge_all(k));
}

// Queries of 2^70: their fp32 mean square overflows to inf in the implementations (alpha_q = 0)
// but not in the reference. The yardstick's correct implementations overflow alike, so the
// baseline ratio cannot tell; the proven bound (which assumes no overflow, proofs/error_bounds.md)
// can: the outputs are far outside it, so the cpu.* rows fail, and nothing crashes.
TEST_CASE("extremes.huge_fp32_queries_fail_without_crashing") {
  Case k = make(Profile::FP32, {0, 17}, 2, NormMode::Blockwise, test::seed(73));
  scale(k, "q_nope", 0x1p70);
  const Judgement j = judge_all(k);
  CHECK(j.rows > 0);
  MESSAGE("worst out rel_l2 " << j.worst_out << ", failed " << j.failed << " of " << j.rows);
  CHECK(j.worst_out > 1e-3);
  CHECK(j.failed > 0);
  CHECK(std::find(j.failures.begin(), j.failures.end(), "cpu.explicit.fp32/out") !=
        j.failures.end());
}

// Every cache slot past each sequence holds +inf or NaN: never read, so nothing changes.
TEST_CASE("extremes.nonfinite_unused_cache_slots_are_never_read") {
  for (double poison : {INFINITY, -INFINITY, NAN}) {
    Case k = make(Profile::BF16, {0, 5, 9}, 2, NormMode::Unified, test::seed(74));
    const int64_t T = k.t_max();
    for (const char* name : {"kv_c", "k_pe"}) {
      Tensor& x = k.tensors.at(name);
      const int64_t w = x.shape[2];
      for (int b = 0; b < k.cfg.batch; ++b)
        for (int64_t t = k.cfg.seqlens[size_t(b)]; t < T; ++t)
          for (int64_t e = 0; e < w; ++e) x.data[size_t((b * T + t) * w + e)] = poison;
    }
    attach_latent(k);
    CAPTURE(poison);
    check_all_pass(judge_all(k));
  }
}

// A NaN or inf in a visible token's latent cannot be judged (every comparison would be
// meaningless): the case check refuses it naming the tensor and the index (exit 2 in the CLI).
TEST_CASE("extremes.nonfinite_in_a_visible_token_is_refused_with_its_index") {
  for (double poison : {NAN, INFINITY}) {
    Case k = make(Profile::FP32, {0, 9, 12}, 2, NormMode::Blockwise, test::seed(75));
    Tensor& c = k.tensors.at("kv_c");
    c.data[size_t((1 * k.t_max() + 3) * c.shape[2] + 5)] = poison;  // sequence 1, token 3
    try {
      validate_case(k);
      FAIL("accepted a non-finite visible cache value");
    } catch (const ConfigError& e) {
      CHECK(e.field == "kv_c");
      CHECK(e.problem == "non-finite value at [1, 3, 5]");
    }
  }
}

// Held-out gate seed 1007 (reports/gate-baselines.md): plain MLA with outlier channels. Every
// element's proven bound must be a finite number; where the implementation errs it is positive.
TEST_CASE("extremes.plain_mla_outliers_have_finite_bounds") {
  MlaConfig c = test::tiny_config(Profile::BF16, {0, 17, 40}, 2, NormMode::None, 1007, "tiny-g1");
  c.scenario = "outliers";
  c.set_default_scale();
  const Case k = generate_case(c);
  const std::vector<ImplId> ids = test::cpu_ids(c);
  const std::vector<Outputs> outs = run_impls(k, ids);
  const std::map<std::string, Outputs> bounds = run_bounds(k, ids);
  TruthOptions o;
  o.absorbed = true;
  const Truth t = compute_truth(k, o);
  int64_t checked = 0;
  for (const Outputs& out : outs)
    for (const char* name : {"out", "latent_out"}) {
      if (!bounds.count(to_string(out.id)) || !bounds.at(to_string(out.id)).tensors.count(name))
        continue;
      const Tensor& b = bounds.at(to_string(out.id)).tensors.at(name);
      const Tensor& x = out.tensors.at(name);
      const Tensor& y = t.of(name)->tensors.at(name);
      const std::vector<bool> mask = valid_mask(k, name);
      for (int64_t i = 0; i < b.numel(); ++i) {
        if (!mask.empty() && !mask[size_t(i)]) continue;
        ++checked;
        CAPTURE(to_string(out.id));
        CAPTURE(name);
        CAPTURE(i);
        CAPTURE(x[i]);
        CAPTURE(y[i]);
        REQUIRE(std::isfinite(b[i]));
        if (x[i] != y[i]) REQUIRE(b[i] + std::ldexp(std::fabs(y[i]), -100) > 0);
      }
    }
  CHECK(checked > 0);
}
