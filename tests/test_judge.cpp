// judge.*: designs as data (parse and print), the design each registered implementation is judged
// by, the candidate designs of a third-party audit, and the yardstick sampling the rounding points
// of the judged design (not only its summation order).
#include <doctest/doctest.h>

#include <set>

#include "core/design.hpp"
#include "core/presets.hpp"
#include "harness/truth.hpp"
#include "harness/yardstick.hpp"
#include "helpers.hpp"
#include "impl/cpu_impls.hpp"

using namespace qkmla;

TEST_CASE("judge.design.parse_and_print_round_trip") {
  for (Profile p : {Profile::FP32, Profile::BF16, Profile::FP16, Profile::FP8})
    for (const char* text : {"", "q_latent=acc,p=stored", "form=explicit,kv=acc,out=fp32",
                             "form=explicit,rope_key=stored", "gains=merged,alpha_k=bf16",
                             "latent_out=fp32,gains=runtime"}) {
      const Design d = parse_design(text, p, Form::Absorbed);
      CAPTURE(text);
      CHECK(parse_design(to_string(d), p, Form::Absorbed) == d);
    }
  CHECK(parse_design("gains=merged", Profile::BF16, Form::Absorbed).gains_merged);
  CHECK_FALSE(parse_design("", Profile::BF16, Form::Absorbed).gains_merged);
  CHECK_THROWS_AS(parse_design("gains=yes", Profile::BF16, Form::Absorbed), ConfigError);
  CHECK_THROWS_AS(parse_design("q_latent=fp4", Profile::BF16, Form::Absorbed), ConfigError);
  // fp8 (e4m3) is a point of an all-FP8 kernel's query and P only (judge.design.fp8_query_and_p)
  CHECK_THROWS_AS(parse_design("alpha_k=fp8", Profile::BF16, Form::Absorbed), ConfigError);
  CHECK_THROWS_AS(parse_design("cache=fp8", Profile::BF16, Form::Absorbed), ConfigError);
  CHECK_THROWS_AS(parse_design("softmax=fp32", Profile::BF16, Form::Absorbed), ConfigError);
  // An unknown point is named as such whatever its value (it had been "unknown format '1'").
  CHECK_THROWS_WITH(parse_design("q_latent=bf16,zz=1", Profile::BF16, Form::Absorbed),
                    doctest::Contains("design.zz: unknown rounding point"));
  CHECK_THROWS_AS(parse_design("q_latent", Profile::BF16, Form::Absorbed), ConfigError);
}

TEST_CASE("judge.design_of.registered_variants") {
  const Profile p = Profile::FP16;
  CHECK(design_of(parse_impl_id("cpu.absorbed.fp16"), p) == spec_design(p, Form::Absorbed));
  CHECK(design_of(parse_impl_id("cpu.explicit.fp16"), p) == spec_design(p, Form::Explicit));
  CHECK(design_of(parse_impl_id("cpu.absorbed.fp16.gamma_merged"), p).gains_merged);
  CHECK_FALSE(design_of(parse_impl_id("cpu.absorbed.fp16.alpha_q_folded"), p).gains_merged);
  CHECK(design_of(parse_impl_id("cpu.absorbed.bf16.alpha_k_bf16"), Profile::BF16).alpha_k ==
        DType::BF16);
}

TEST_CASE("judge.candidate_designs.follow_the_delivered_dtypes") {
  MlaConfig c = test::tiny_config(Profile::BF16, {0, 9}, 2);  // 8 non-empty rows: a small case
  auto outs = [](const std::vector<Candidate>& v) {
    std::set<DType> o;
    for (const Candidate& x : v) o.insert(x.d.out);
    return o;
  };
  auto family = [](const std::vector<Candidate>& v, const std::string& f) {
    for (const Candidate& x : v)
      if (x.family == f) return true;
    return false;
  };
  // F32 out says only that out was not rounded: every earlier point may still be bf16 (it had been
  // read as "everything fp32", which failed conventions §3's own design delivered unrounded).
  const auto f32 = candidate_designs(c, Form::Absorbed, {{"out", {DType::F32}}});
  CHECK(outs(f32) == std::set<DType>{DType::F32});
  for (const std::string f : {"all-fp32 compute", "conventions §3 rounding points",
                              "conventions §3 points mixed", "FlashMLA-style (P stored, exp2)",
                              "softmax scale folded into q", "approximate rsqrt statistic"}) {
    CAPTURE(f);
    CHECK(family(f32, f));
  }
  // A module that stores every op's output stores out too: not consistent with an unrounded out.
  CHECK_FALSE(family(f32, "PyTorch module (every op stored)"));
  bool spec_with_f32_out = false;
  for (const Candidate& x : f32)
    spec_with_f32_out |= x.d.q == DType::BF16 && x.d.rope == DType::BF16 && x.d.out == DType::F32;
  CHECK(spec_with_f32_out);
  // F32 values that bf16 holds exactly (.float() of a bf16 tensor): out bf16 is consistent too.
  const auto both = candidate_designs(c, Form::Absorbed, {{"out", {DType::F32, DType::BF16}}});
  CHECK(outs(both) == std::set<DType>{DType::F32, DType::BF16});
  // bf16 out, small case: every combination of q_latent, rope, p, latent_out among the mixes.
  const auto all = candidate_designs(c, Form::Absorbed, {{"out", {DType::BF16}}});
  int mixes = 0;
  for (const Candidate& x : all) {
    mixes += x.family == "conventions §3 points mixed" ||
             x.family == "conventions §3 rounding points" || x.family == "all-fp32 compute";
    CHECK(x.d.out == DType::BF16);
    // alpha_k in bf16 only where delivered so, or in a module that stores every op's output
    CHECK((x.d.alpha_k == DType::F32 || x.family == "PyTorch module (every op stored)"));
  }
  CHECK(mixes == 16);
  // Many rows: the two extremes of the mixes, and the real-code families.
  c.seqlens = {0, 9, 9, 9, 9, 9, 9, 9, 9, 9};
  c.batch = int(c.seqlens.size());
  const auto few = candidate_designs(c, Form::Absorbed, {{"out", {DType::BF16}}});
  CHECK(few.size() < all.size());
  CHECK(family(few, "PyTorch module (every op stored)"));
  const auto bf =
      candidate_designs(c, Form::Absorbed, {{"out", {DType::BF16}}, {"alpha_k", {DType::BF16}}});
  for (const Candidate& x : bf) CHECK(x.d.alpha_k == DType::BF16);
  // fp8: the cache dequantized to bf16 before the dot products is a family of its own.
  c.profile = Profile::FP8;
  CHECK(family(candidate_designs(c, Form::Absorbed, {{"out", {DType::BF16}}}),
               "fp8 cache dequantized to bf16"));
}

TEST_CASE("judge.consistent_formats.values_not_containers") {
  Tensor x(DType::F32, {4}, 0.0);
  x.data = {1.0, 0.5, -3.25, 1.0 + 1.0 / 128};  // all bf16 values
  CHECK(consistent_formats(x, {}, Profile::BF16) == std::vector<DType>{DType::F32, DType::BF16});
  x.data[3] = 1.0 + 1.0 / 1024;  // fp16 holds it, bf16 does not
  CHECK(consistent_formats(x, {}, Profile::BF16) == std::vector<DType>{DType::F32});
  CHECK(consistent_formats(x, {}, Profile::FP16) == std::vector<DType>{DType::F32, DType::F16});
  // A masked-out position (a padded row) does not count.
  CHECK(consistent_formats(x, {true, true, true, false}, Profile::BF16) ==
        std::vector<DType>{DType::F32, DType::BF16});
}

// Seed 5023 of the held-out gate seeds: fp16 large logits, where the merged weights' rounding
// moves out 19x and latent_out 83x further than the run-time gains' yardstick (measured when the
// yardstick still ignored the merged-gains rounding point). The merged design's yardstick must
// sample it.
TEST_CASE("judge.yardstick.samples_the_merged_gains_rounding_point") {
  MlaConfig c = test::tiny_config(Profile::FP16, {0, 17, 40}, 2, NormMode::Blockwise, 5023);
  c.scenario = "large_logits";
  const Case k = generate_case(c);
  TruthOptions o;
  o.absorbed = true;
  const Truth truth = compute_truth(k, o);
  auto truth_of = [&](const std::string& t) {
    const Outputs* x = truth.of(t);
    return x ? &x->tensors.at(t) : nullptr;
  };
  Design merged = spec_design(c.profile, Form::Absorbed);
  merged.gains_merged = true;
  const auto runtime = measure_yardstick(
      k, std::vector<Design>{spec_design(c.profile, Form::Absorbed)}, truth_of, {"latent_out"});
  const auto with_merged =
      measure_yardstick(k, std::vector<Design>{merged}, truth_of, {"latent_out"});
  CHECK(with_merged.rel_l2.at("latent_out") > 4 * runtime.rel_l2.at("latent_out"));
}

// Held-out audit seeds 1518 and 1742 (and fit seed 286): fp16, unified norm, tiny keys. A correct
// explicit kernel that caches its rotated, gain-applied rope keys stores them in fp16 before
// alpha_k scales them; tiny keys make them fp16 subnormals, so lse moves far beyond the conventions
// §3 design's yardstick (false alarms at ratios 4.67-8.94 before the explicit lattice had this
// point).
TEST_CASE("judge.yardstick.samples_the_cached_rope_key_rounding_point") {
  MlaConfig c = test::tiny_config(Profile::FP16, {0, 17, 40}, 2, NormMode::Unified, 1518);
  c.scenario = "tiny_keys";
  const Case k = generate_case(c);
  const Truth truth = compute_truth(k, TruthOptions{});
  auto truth_of = [&](const std::string& t) {
    const Outputs* x = truth.of(t);
    return x ? &x->tensors.at(t) : nullptr;
  };
  Design cached = spec_design(c.profile, Form::Explicit);
  cached.rope_key = DType::F16;
  const auto spec = measure_yardstick(
      k, std::vector<Design>{spec_design(c.profile, Form::Explicit)}, truth_of, {"out", "lse"});
  const auto with_cached =
      measure_yardstick(k, std::vector<Design>{cached}, truth_of, {"out", "lse"});
  for (const std::string t : {"out", "lse"})
    MESSAGE(t << " rel_l2: spec design " << spec.rel_l2.at(t) << ", cached rope key "
              << with_cached.rel_l2.at(t));
  // Measured 3.95x on lse (out unchanged) at this commit; a factor above 2 moves verdicts (k = 4).
  CHECK(with_cached.rel_l2.at("lse") > 2 * spec.rel_l2.at("lse"));
  // The explicit lattice has the point under the unified norm only (elsewhere it is a no-op).
  auto has_point = [](const std::vector<Candidate>& ds) {
    for (const Candidate& d : ds)
      if (d.d.rope_key == DType::F16) return true;
    return false;
  };
  CHECK(has_point(candidate_designs(c, Form::Explicit, {{"out", {DType::F16}}})));
  c.norm = NormMode::Blockwise;
  CHECK_FALSE(has_point(candidate_designs(c, Form::Explicit, {{"out", {DType::F16}}})));
  CHECK_FALSE(has_point(candidate_designs(c, Form::Absorbed, {{"out", {DType::F16}}})));
}

// Zoo sweep seed 101537 (fitted): mlx-lm's S_q > 1 branch is the explicit form, and an audit that
// read an undeclared form as absorbed failed it (worst_row 5.45x). Undeclared, both forms are
// candidates where the explicit samples are affordable; a declaration, or a delivered latent_out
// (formed by the absorbed form only), decides it, and a case too large says so.
TEST_CASE("judge.audit_forms.undeclared_takes_both_where_affordable") {
  MlaConfig c = test::tiny_config(Profile::BF16, {0, 9}, 2);
  const Delivered out = {{"out", {DType::BF16}}};
  std::string note;
  const std::vector<Form> both = {Form::Absorbed, Form::Explicit};
  CHECK(audit_forms(c, "", out, &note) == both);
  CHECK(note.empty());
  CHECK(audit_forms(c, "explicit", out, &note) == std::vector<Form>{Form::Explicit});
  CHECK(audit_forms(c, "absorbed", out, &note) == std::vector<Form>{Form::Absorbed});
  Delivered with_latent = out;
  with_latent["latent_out"] = {DType::BF16};
  CHECK(audit_forms(c, "", with_latent, &note) == std::vector<Form>{Form::Absorbed});
  int explicit_designs = 0, prefixed = 0;
  for (const Candidate& x : candidate_designs(c, both, out)) {
    explicit_designs += x.d.form == Form::Explicit;
    prefixed += x.family.rfind("explicit form: ", 0) == 0;
  }
  CHECK(explicit_designs > 0);
  CHECK(prefixed == explicit_designs);
  const MlaConfig large = config_for(find_preset("paper-g8"), 4096);
  CHECK(audit_forms(large, "", out, &note) == std::vector<Form>{Form::Absorbed});
  CHECK(note.find("--form explicit") != std::string::npos);
}

// MLX's `mx.scalar(scale) * q` and JAX's weak typing store the softmax scale in the array's dtype
// before it multiplies (design sigma): a temperature change on every logit. The point must reach
// the arithmetic where sigma is not representable, and be a no-op where it is.
TEST_CASE("judge.design.stored_softmax_scale") {
  const Design d = parse_design("scale_in_q=yes,sigma=bf16", Profile::BF16, Form::Absorbed);
  CHECK(d.sigma == DType::BF16);
  CHECK(parse_design(to_string(d), Profile::BF16, Form::Absorbed) == d);
  CHECK(parse_design("sigma=fp32", Profile::FP32, Form::Absorbed).sigma == DType::F64);
  MlaConfig c = test::tiny_config(Profile::BF16, {0, 17, 40}, 2, NormMode::Blockwise, 101537);
  Design plain = d;
  plain.sigma = DType::F64;
  for (double sigma : {0.07202, 0.25}) {
    c.softmax_scale = sigma;
    const Case k = generate_case(c);
    const auto runs =
        impl::cpu_absorbed(k, {{Variant::Default, {}, d}, {Variant::Default, {}, plain}});
    const bool same = runs[0].tensors.at("lse").data == runs[1].tensors.at("lse").data;
    CAPTURE(sigma);
    CHECK(same == (round_to(DType::BF16, sigma) == sigma));
  }
}

// ggml-org/llama.cpp's ggml graph and mlx-lm's SDPA take no per-key scale, so alpha_k enters the
// keys and each product is stored in the cache type (design key_fold): one more rounding of every
// key element, which zoo seed 102007 (ggml_cpu, fp16 large_logits) showed at 7.2x the candidates'
// out rel_l2. The point must reach the arithmetic under a QK-norm, and the family exist there
// only (norm none has no alpha_k to fold).
TEST_CASE("judge.design.alpha_k_folded_into_stored_keys") {
  const Design d = parse_design("key_fold=stored", Profile::FP16, Form::Absorbed);
  CHECK(d.key_fold == DType::F16);
  CHECK(parse_design(to_string(d), Profile::FP16, Form::Absorbed) == d);
  Design plain = d;
  plain.key_fold = DType::F64;
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified}) {
    const MlaConfig c = test::tiny_config(Profile::FP16, {0, 17, 40}, 2, norm, 102007);
    const Case k = generate_case(c);
    const auto runs =
        impl::cpu_absorbed(k, {{Variant::Default, {}, d}, {Variant::Default, {}, plain}});
    CHECK(runs[0].tensors.at("lse").data != runs[1].tensors.at("lse").data);
    auto has_family = [](const std::vector<Candidate>& ds) {
      for (const Candidate& x : ds)
        if (x.d.key_fold == DType::F16) return true;
      return false;
    };
    CHECK(has_family(candidate_designs(c, Form::Absorbed, {{"out", {DType::F32}}})));
    CHECK_FALSE(has_family(candidate_designs(c, Form::Explicit, {{"out", {DType::F32}}})));
  }
  const MlaConfig none = test::tiny_config(Profile::FP16, {0, 17}, 2, NormMode::None, 102007);
  for (const Candidate& x : candidate_designs(none, Form::Absorbed, {{"out", {DType::F32}}}))
    CHECK(x.d.key_fold == DType::F64);
}

// A JAX module stores every einsum's output as a PyTorch module does, but jnp promotion keeps its
// fp8 cache in fp32 (zoo seed 102011): a family of fp8 module-level candidates only.
TEST_CASE("judge.candidate_designs.jax_module_keeps_the_fp8_cache") {
  MlaConfig c = test::tiny_config(Profile::FP8, {0, 17}, 2, NormMode::None, 102011);
  auto jax = [](const std::vector<Candidate>& ds) {
    for (const Candidate& x : ds)
      if (x.family.rfind("JAX module", 0) == 0) {
        CHECK(x.d.score != DType::F64);
        CHECK(x.d.cache == DType::F64);
        return true;
      }
    return false;
  };
  CHECK(jax(candidate_designs(c, Form::Absorbed, {{"out", {DType::BF16}}})));
  CHECK_FALSE(jax(candidate_designs(c, Form::Absorbed, {{"out", {DType::F32}}})));
  c.profile = Profile::BF16;
  CHECK_FALSE(jax(candidate_designs(c, Form::Absorbed, {{"out", {DType::BF16}}})));
}
