// audit.real_code.*: the designs real code uses (conventions §5 "Judging", rule 1;
// proofs/budgets.md names who does each), each a correct implementation that must PASS undeclared,
// most with a structured bug beside it that must still FAIL.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "audit_helpers.hpp"
#include "harness/audit.hpp"
#include "harness/yardstick.hpp"
#include "helpers.hpp"
#include "impl/attention_core.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/kernel_level.hpp"
#include "impl/profile_math.hpp"

using namespace qkmla;
using namespace qkmla::test;

// A kernel-level wrapper around an attention call with no per-row or per-key scale (PyTorch's
// scaled_dot_product_attention) folds alpha_q into the given query and alpha_k into the keys, each
// product stored in bf16, and its flash kernel stores P: the logits move by ulps of bf16 at their
// size, so lse by ~1e-3 where the kernel-level candidates had reached ~5e-8 (zoo style
// torch_cpu_flash, seeds 103416-103515: 7 of 13 QK-normed kernel cases failed; fitted).
TEST_CASE("audit.real_code.sdpa_folds_alpha_at_kernel_level") {
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified}) {
    MlaConfig c = test::tiny_config(Profile::BF16, {0, 97, 140}, 1, norm, test::seed(103419));
    c.scenario = "outliers";
    CAPTURE(c.seed);
    CAPTURE(int(norm));
    Golden g = make_golden(generate_case(c), Level::Kernel, 113, "test");
    REQUIRE(g.truth.ok());
    const CaseFile cf{g.k, g.refs, g.metadata};
    Design sdpa = spec_design(c.profile, Form::Kernel);
    sdpa.key_fold = DType::BF16, sdpa.p = DType::BF16;
    const Outputs o = impl::cpu_kernel(cf.k, sdpa);
    std::map<std::string, Tensor> outs = {{"latent_out", o.tensors.at("latent_out")},
                                          {"lse", o.tensors.at("lse")}};
    const AuditResult r = audit(cf, outs);
    MESSAGE("lse ratio " << tensor(r, "lse").j.baseline_ratio);
    CHECK(r.pass());
    Tensor& lat = outs["latent_out"];  // [B, S_q, H, r]: one head 5 % off still fails
    for (int64_t i = 0; i < lat.numel(); ++i)
      if (lat.unravel(i)[2] == 2) lat[i] = round_to(DType::BF16, lat[i] * 1.05);
    const AuditResult bad = audit(cf, outs);
    MESSAGE("one head x1.05: latent_out ratio " << tensor(bad, "latent_out").j.baseline_ratio);
    worst_structure_ratio(bad, "latent_out");
    CHECK_FALSE(bad.pass());
  }
}

// Zoo seed 72184 (sglang_native): a kernel-level attention core that normalizes P in fp32 and then
// casts it to the stored dtype, as a PyTorch softmax(..., dtype=float32).type_as(x) does, had a
// latent_out bias 6.8x the candidates' largest and failed; no candidate stored P after the
// division at kernel level. The family "P stored after the softmax's division" covers it.
TEST_CASE("audit.real_code.p_normalized_at_kernel_level") {
  MlaConfig c =
      test::tiny_config(Profile::BF16, {1, 156, 0, 7}, 1, NormMode::Unified, test::seed(72184));
  c.scenario = "large_logits";
  c.rope_order = RopeOrder::RopeThenNorm;
  c.rope_style = RopeStyle::Half;
  CAPTURE(c.seed);
  Golden g = make_golden(generate_case(c), Level::Kernel, 113, "test");
  REQUIRE(g.truth.ok());
  const CaseFile cf{g.k, g.refs, g.metadata};
  Design torch = spec_design(c.profile, Form::Kernel);
  torch.p = DType::BF16, torch.p_normalized = true;
  const Outputs o = impl::cpu_kernel(cf.k, torch);
  const AuditResult r =
      audit(cf, {{"latent_out", o.tensors.at("latent_out")}, {"lse", o.tensors.at("lse")}});
  const TensorAudit& lat = tensor(r, "latent_out");
  for (const StructureCheck& s : lat.structure) MESSAGE(s.stat << " " << s.ratio << "x");
  CHECK(r.pass());
}

// Zoo seed 74015 (cutlass_blocked): FlashMLA's fp8 path dequantizes the cache tile to bf16 and
// stores P in bf16. On tiny_keys every weight exp(l - m) lies just below 1 and rounds the same
// way, so with both roundings out's bias was 4.1x the largest of the families that had one or the
// other, and a correct kernel failed. The family with both covers it.
TEST_CASE("audit.real_code.flashmla_fp8_dequantized_tile_and_bf16_p") {
  MlaConfig c =
      test::tiny_config(Profile::FP8, {8, 2}, 1, NormMode::None, test::seed(74015), "paper-g8");
  c.scenario = "tiny_keys";
  CAPTURE(c.seed);
  const CaseFile cf = golden_of(c);
  Design flash = spec_design(c.profile, Form::Absorbed);
  flash.p = DType::BF16, flash.exp2 = true, flash.cache = DType::BF16;
  const AuditResult r = audit(cf, run_design(cf, flash));
  const double worst = worst_structure_ratio(r, "out");
  CHECK(r.pass());
  // A candidate's own run sits within its samples' spread (1.0x here); without the family the
  // bias was 3.8x (this forward-order run) to 4.1x (the zoo kernel's order).
  CHECK(worst < 2);
}

// Zoo seed 76141 (triton_fold, fp32, large_logits): a kernel that takes alpha_k's statistic from
// the Gram form c (WK_g WK_g^T) c, the key never formed, had out ratio 4.4 (fp32 cancellation in
// the quadratic form, amplified by logits near 100) and failed. The family "alpha_k from the Gram
// form" samples that design where it is affordable; the judge's own Gram run passes, named.
TEST_CASE("audit.real_code.gram_form_alpha_k") {
  MlaConfig c = test::tiny_config(Profile::FP32, {20, 7, 0, 143}, 1, NormMode::Unified,
                                  test::seed(76141), "tiny-g1");
  c.scenario = "large_logits";
  c.rope_order = RopeOrder::RopeThenNorm;
  c.rope_style = RopeStyle::Half;
  CAPTURE(c.seed);
  const CaseFile cf = golden_of(c);
  Design gram = spec_design(c.profile, Form::Absorbed);
  gram.gram_alpha_k = true;
  const AuditResult r = audit(cf, run_design(cf, gram));
  CHECK(r.pass());
  const TensorAudit& out = tensor(r, "out");
  MESSAGE("out ratio " << out.j.baseline_ratio);
  bool named = false;  // the Gram family is among the consistent ones
  for (const FamilyFit& f : out.families)
    named = named || (f.family.find("Gram form") != std::string::npos && f.consistent);
  CHECK(named);
}

// Zoo seed 95108 (torch_eager, fp16, plain MLA, large_logits, sinks): a PyTorch module with a sink
// folds it into P (the sink logit concatenated to the scores, one fp32 softmax, its column
// dropped, then .type_as(x), as gpt-oss does); a one-token row whose sink factor is 1e-7 then
// stores a subnormal fp16 P, a +19 % row scale, and the module failed on latent_out row_bias at
// 7.43x the designs that scale the output. The designs that fold the sink into P are sampled for
// sink cases: such a module, in an order the yardstick does not run (4 lanes), passes (row_bias
// 1.0x; 7.43x without the new family).
TEST_CASE("audit.real_code.sink_folded_into_p") {
  MlaConfig c = test::tiny_config(Profile::FP16, {0, 21, 95, 2}, 2, NormMode::None,
                                  test::seed(95108), "tiny-nope");
  c.scenario = "large_logits", c.attn_sink = true;
  c.rope_order = RopeOrder::RopeThenNorm, c.rope_style = RopeStyle::Half;
  CAPTURE(c.seed);
  const CaseFile cf = golden_of(c);
  Design torch = spec_design(c.profile, Form::Absorbed);
  torch.score = torch.p = torch.latent_out = DType::F16, torch.p_normalized = true;
  torch.eager = DType::F16;
  Design folded = torch;
  folded.sink_in_p = true;
  impl::SumOrder lanes4;
  lanes4.lanes = 4;
  const impl::SumOrder saved = std::exchange(impl::sum_order(), lanes4);
  const Outputs run = impl::cpu_absorbed(cf.k, {{Variant::Default, {}, folded}})[0];
  std::map<std::string, Tensor> outs;
  for (const char* t : {"out", "lse", "latent_out"}) outs[t] = run.tensors.at(t);
  const Outputs plain = impl::cpu_absorbed(cf.k, {{Variant::Default, {}, torch}})[0];
  impl::sum_order() = saved;
  CHECK(outs.at("latent_out").data != plain.tensors.at("latent_out").data);  // P scaled first
  const AuditResult r = audit(cf, outs);
  CHECK(r.pass());
  CHECK(worst_structure_ratio(r, "latent_out") < 2);
}

// vLLM's Triton MLA decode allocates its lse in q's dtype: a correct kernel hands over a BF16 lse,
// which every fp32-lse design failed (here: lse ratio 3.1 in bf16, 3.6 in fp16; the zoo's
// vllm_triton on a paper-g8 bf16 case). The
// delivered format is the lse's rounding point: the same design with lse rounded to bf16 passes,
// named as such, and a 2 % lse offset in one sequence, hidden in no rounding, still fails.
TEST_CASE("audit.real_code.lse_delivered_in_stored_dtype") {
  for (Profile prof : {Profile::BF16, Profile::FP16}) {
    MlaConfig c = test::tiny_config(prof, {0, 37, 90}, 2, NormMode::Blockwise, test::seed(100131));
    CAPTURE(c.seed);
    CAPTURE(to_string(prof));
    const CaseFile cf = golden_of(c);
    const DType D = stored_dtype(prof);
    std::map<std::string, Tensor> outs = run_design(cf, spec_design(prof, Form::Absorbed));
    Tensor& lse = outs["lse"];
    written_as(lse, D);
    const AuditResult r = audit(cf, outs);
    CHECK(r.pass());
    const TensorAudit& a = tensor(r, "lse");
    MESSAGE("lse ratio " << a.j.baseline_ratio);
    CHECK(a.j.baseline_ratio < 2);
    bool named = false;
    for (const FamilyFit& f : a.families)
      named = named || (f.family.find("(lse " + format_word(D) + ")") != std::string::npos);
    CHECK(named);
    // Strict: a declared design that leaves lse out takes the delivered point; one that declares
    // lse unrounded is held to it.
    CHECK(audit(cf, outs, "q_latent=stored").pass());
    CHECK_FALSE(audit(cf, outs, "q_latent=stored,lse=acc").pass());
    for (int64_t i = 0; i < lse.numel(); ++i)  // sequence 2 (90 tokens): lse + 2 % of |lse|
      if (i / (c.s_q * c.heads) == 2 && std::isfinite(lse[i])) lse[i] = round_to(D, lse[i] * 1.02);
    CHECK_FALSE(audit(cf, outs).pass());
  }
}

// FlashInfer's fa2 kernels (prefill, and the MLA decode) take the row sum by an MMA over the P
// fragment cast to bf16, so lse carries P's rounding while out does not. On tiny_keys every weight
// exp(l - m) lies just below 1 and rounds one way, a shift common to the row: zoo style
// flashinfer_mla, seeds 103622-103821 (fitted), failed 14 of 57 audits on lse (worst_row up to
// 5.7e3x the candidates') with only FlashMLA's design (row sum of the fp32 P). The family with the
// row sum of the stored P covers it, and one sequence's lse moved by 5e-3 still fails.
TEST_CASE("audit.real_code.row_sum_of_stored_p") {
  for (Level level : {Level::Module, Level::Kernel}) {
    MlaConfig c =
        test::tiny_config(Profile::BF16, {0, 37, 64}, 2, NormMode::Blockwise, test::seed(103670));
    c.scenario = "tiny_keys";
    CAPTURE(c.seed);
    CAPTURE(int(level));
    Golden g = make_golden(generate_case(c), level, 113, "test");
    REQUIRE(g.truth.ok());
    const CaseFile cf{g.k, g.refs, g.metadata};
    const Form form = level == Level::Kernel ? Form::Kernel : Form::Absorbed;
    Design fi = spec_design(c.profile, form);
    fi.p = DType::BF16, fi.exp2 = true, fi.p_sum_stored = true;
    std::map<std::string, Tensor> outs;
    if (level == Level::Kernel) {
      const Outputs o = impl::cpu_kernel(cf.k, fi);
      outs = {{"latent_out", o.tensors.at("latent_out")}, {"lse", o.tensors.at("lse")}};
    } else {
      outs = run_design(cf, fi);
    }
    const AuditResult r = audit(cf, outs);
    const TensorAudit& lse = tensor(r, "lse");
    for (const FamilyFit& f : lse.families)
      MESSAGE(f.family << ": lse ratio " << f.ratio
                       << std::string(f.consistent ? "" : " (not consistent)"));
    worst_structure_ratio(r, "lse");
    CHECK(r.pass());
    // Against FlashMLA's row sum of the fp32 P alone, the same lse is far off.
    bool flashmla_seen = false;
    for (const FamilyFit& f : lse.families)
      if (f.family == "FlashMLA-style (P stored, exp2)") {
        flashmla_seen = true;
        CHECK(f.ratio > 10);
      }
    CHECK(flashmla_seen);
    Tensor& l = outs["lse"];  // [B, S_q, H]: the last sequence's lse + 5e-3
    for (int64_t i = 0; i < l.numel(); ++i)
      if (l.unravel(i)[0] == 2) l[i] += 5e-3;
    const AuditResult bad = audit(cf, outs);
    worst_structure_ratio(bad, "lse");
    CHECK_FALSE(bad.pass());
  }
}

// A module's RMSNorm returns the normalized query in the model dtype before the absorption product
// (ggml's mul_mat converts its F32 input to the weight type; SGLang's and vLLM's modules,
// FlashInfer's RMSNorm), while out may be delivered F32 (ggml). On outliers the extra rounding of
// the query moves a one-token row's lse (a logit) by ulps of the query times the dot's condition:
// zoo seed 103956 (ggml_cpu, fp16, fitted) failed on lse seq_shift, 4.49x the candidates'. The
// families with the normalized query stored cover it; one sequence's lse moved by 1e-2 still fails.
TEST_CASE("audit.real_code.normalized_query_stored") {
  MlaConfig c = test::tiny_config(Profile::FP16, {1, 0, 97, 57}, 1, NormMode::Blockwise,
                                  test::seed(103956), "tiny-nope");
  c.scenario = "outliers";
  CAPTURE(c.seed);
  const CaseFile cf = golden_of(c);
  Design module = spec_design(c.profile, Form::Absorbed);
  module.q_normed = DType::F16, module.key_fold = DType::F16, module.out = DType::F32;
  std::map<std::string, Tensor> outs = run_design(cf, module);
  const AuditResult r = audit(cf, outs);
  MESSAGE("lse ratio " << tensor(r, "lse").j.baseline_ratio);
  CHECK(worst_structure_ratio(r, "lse") < 2);
  CHECK(r.pass());
  Tensor& l = outs["lse"];  // [B, S_q, H]: sequence 2's lse + 1e-2
  for (int64_t i = 0; i < l.numel(); ++i)
    if (l.unravel(i)[0] == 2) l[i] += 1e-2;
  const AuditResult bad = audit(cf, outs);
  worst_structure_ratio(bad, "lse");
  CHECK_FALSE(bad.pass());
}
