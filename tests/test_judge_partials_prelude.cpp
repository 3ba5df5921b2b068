// judge.design.split_partials_stored, judge.design.explicit_module_prelude: two designs real code
// uses that zoo style chunked_merge (SGLang's chunked-prefix MHA, FlashInfer's merge_state; written
// from the conventions alone) met on its first fresh seeds (105662-105861, fitted): split-KV
// partial outputs stored in the activation dtype and merged one by one (seed 105743: out bias
// 11.1x the other families'), and an explicit module's key up-projected into that dtype before its
// norm (seed 105681: lse worst_row 8.3x). Each point must reach the arithmetic, and the explicit
// family that has them exist only where they round. zoo.chunked_prefill runs the style on both.
#include <doctest/doctest.h>

#include <string>

#include "harness/yardstick.hpp"
#include "helpers.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/profile_math.hpp"

using namespace qkmla;

namespace {

struct SplitScope {  // a yardstick's split-KV order for the scope's lifetime
  explicit SplitScope(int splits) { impl::sum_order().splits = splits; }
  ~SplitScope() { impl::sum_order() = {}; }
};

const std::vector<double>& out_of(const Outputs& o) { return o.tensors.at("out").data; }

// A --design text parsed, after checking that its printed form reads back as the same design.
Design parsed(const std::string& text, Profile p, Form f) {
  const Design d = parse_design(text, p, f);
  CHECK(parse_design(to_string(d), p, f) == d);
  return d;
}

}  // namespace

TEST_CASE("judge.design.split_partials_stored") {
  const Design d = parsed("p=stored,exp2=yes,partials=stored", Profile::FP16, Form::Absorbed);
  CHECK(d.partials == DType::F16);
  Design plain = d;
  plain.partials = DType::F64;
  MlaConfig c =
      test::tiny_config(Profile::FP16, {0, 37, 64}, 2, NormMode::Blockwise, test::seed(105743));
  c.scenario = "tiny_keys";
  CAPTURE(c.seed);
  const Case k = generate_case(c);
  auto both = [&] {
    return impl::cpu_absorbed(k, {{Variant::Default, {}, d}, {Variant::Default, {}, plain}});
  };
  const auto forward = both();  // one chunk: nothing is merged, so nothing differs
  CHECK(out_of(forward[0]) == out_of(forward[1]));
  {
    SplitScope split(3);
    const auto merged = both();
    CHECK(out_of(merged[0]) != out_of(merged[1]));
    CHECK(merged[0].tensors.at("lse").data != merged[1].tensors.at("lse").data);
  }
  // a family of the explicit form only (serving engines' chunked prefill); absorbed split-KV
  // kernels keep fp32 partials
  auto has_family = [](const std::vector<Candidate>& ds) {
    for (const Candidate& x : ds)
      if (x.d.partials != DType::F64) return true;
    return false;
  };
  CHECK(has_family(candidate_designs(c, Form::Explicit, {{"out", {DType::F16}}})));
  CHECK_FALSE(has_family(candidate_designs(c, Form::Absorbed, {{"out", {DType::F16}}})));
  c.level = Level::Kernel;
  CHECK_FALSE(has_family(candidate_designs(c, Form::Absorbed, {{"out", {DType::F16}}})));
  c.level = Level::Module;
  c.profile = Profile::FP64;  // stored = accumulate type: no such rounding
  CHECK_FALSE(has_family(candidate_designs(c, Form::Explicit, {{"out", {DType::F64}}})));
}

TEST_CASE("judge.design.explicit_module_prelude") {
  const Design d = parsed("prelude=stored", Profile::FP16, Form::Explicit);
  CHECK(d.prelude == DType::F16);
  Design plain = d;
  plain.prelude = DType::F64;
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified}) {
    MlaConfig c = test::tiny_config(Profile::FP16, {0, 17, 40}, 2, norm, test::seed(105681));
    c.scenario = "tiny_keys";  // k0c of ~1e-5: an fp16 subnormal when stored
    CAPTURE(c.seed);
    CAPTURE(int(norm));
    const Case k = generate_case(c);
    const Outputs with = impl::cpu_explicit(k, d), without = impl::cpu_explicit(k, plain);
    // tiny keys make every logit ~0: the stored k0c moves lse; out, a near-uniform mean, hardly
    CHECK(with.tensors.at("lse").data != without.tensors.at("lse").data);
    bool prelude_family = false;
    for (const Candidate& x : candidate_designs(c, Form::Explicit, {{"out", {DType::F16}}}))
      prelude_family = prelude_family || x.d.prelude == DType::F16;
    CHECK(prelude_family);
    for (const Candidate& x : candidate_designs(c, Form::Absorbed, {{"out", {DType::F16}}}))
      CHECK(x.d.prelude == DType::F64);  // the absorbed form forms no module key
  }
  const MlaConfig none = test::tiny_config(Profile::FP16, {0, 17}, 2, NormMode::None, 105681);
  for (const Candidate& x : candidate_designs(none, Form::Explicit, {{"out", {DType::F16}}}))
    CHECK(x.d.prelude == DType::F64);  // no norm: k0c is the key, stored at the kv point anyway
}

// An explicit module reads the fp8 latent into bf16 before its up-projection (SGLang's
// _get_mla_kv_buffer with q's dtype): chunked_merge's seed 106060 (fp8 normal) had out bias 5.6x
// the explicit candidates' until the chunked family took that point. The explicit form's CPU
// implementation must honour it.
TEST_CASE("judge.design.explicit_fp8_latent_read_in_bf16") {
  const Design d = parse_design("cache=bf16", Profile::FP8, Form::Explicit);
  CHECK(d.cache == DType::BF16);
  Design plain = d;
  plain.cache = DType::F64;
  MlaConfig c = test::tiny_config(Profile::FP8, {0, 17, 40}, 2, NormMode::Blockwise,
                                  test::seed(106060), "tiny-nope");
  CAPTURE(c.seed);
  const Case k = generate_case(c);
  CHECK(out_of(impl::cpu_explicit(k, d)) != out_of(impl::cpu_explicit(k, plain)));
  bool chunked_reads_bf16 = false;
  for (const Candidate& x : candidate_designs(c, Form::Explicit, {{"out", {DType::BF16}}}))
    chunked_reads_bf16 =
        chunked_reads_bf16 || (x.d.partials != DType::F64 && x.d.cache == DType::BF16);
  CHECK(chunked_reads_bf16);
}
