#include "harness/yardstick.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/attention_math.hpp"
#include "harness/logit_noise.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/kernel_level.hpp"
#include "impl/profile_math.hpp"
#include "metrics/compare.hpp"

namespace qkmla {

namespace {

bool wider(DType a, DType b) { return format_of(a).precision > format_of(b).precision; }

// Designs over the listed rounding points, each stored (D) or kept in the accumulate type (A).
// `lattice`: every combination (2^n), for small cases; otherwise the two extremes, every point
// stored (the most rounding a legitimate design does) and none. Over many rows a mix's RMS error
// lies between the extremes', so they cover it; over a few rows one ill-conditioned row (a near
// tie of large logits) can dominate, and a mix may round that tie differently from both.
std::vector<Design> designs_over(const Design& base, const std::vector<DType Design::*>& points,
                                 DType D, DType A, bool lattice) {
  std::vector<Design> out;
  const size_t n = points.size();
  for (size_t mask = 0; mask < (size_t(1) << n); ++mask) {
    if (!lattice && mask != 0 && mask + 1 != (size_t(1) << n)) continue;
    Design d = base;
    for (size_t i = 0; i < n; ++i) d.*points[i] = (mask >> i & 1) ? A : D;
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  return out;
}

// Few enough row x token logits that one row can dominate a tensor's rel_l2 (and that running
// the whole lattice costs well under a second): every non-empty row's share is >= 1/64.
bool small_case(const MlaConfig& c) {
  int64_t rows = 0;
  for (int t : c.seqlens) rows += t > 0 ? int64_t(c.s_q) * c.heads : 0;
  return rows <= 64;
}

// The multiply-adds of one Gram-form cache (r^2 per token and group; the Gram matrices' own
// r^2 d_c per group) and the most a yardstick spends on them per sample: 2e10, ~3.4 s here at
// ~0.17 ns each (vectorized across tokens: impl/absorbed_stages.hpp gram_quads). It covers a
// 4096-token paper-g8 or paper-decode case (8.9e9, 1.8e10): a paper-g8 fp32 audit at 4096 tokens
// took 4.8 s without the family's samples and 14.5 s with them (d8b8a6f).
double gram_cost(const MlaConfig& c) {
  double tokens = 0;
  for (int t : c.seqlens) tokens += t;
  const double r2 = double(c.latent_rank) * c.latent_rank;
  return c.groups * r2 * (tokens + c.d_c);
}
constexpr double kGramBudget = 2e10;

// The multiply-adds of one explicit-form sample's keys and values (r (d_c + d_v) per token and
// group) and the most an undeclared audit spends on each: 2.5e8 (~250 tokens of paper-g8), so
// that the explicit candidates' ~24 runs (orders, dithered draws) stay within a few seconds at the
// explicit CPU implementation's ~0.6 ns a multiply-add (a paper-g8 bf16 audit at 4096 tokens, 4.3e9
// a sample: 77 s declared explicit, 13 s absorbed).
double explicit_cost(const MlaConfig& c) {
  double tokens = 0;
  for (int t : c.seqlens) tokens += t;
  return tokens * c.groups * double(c.latent_rank) * (c.d_c + c.d_v);
}
constexpr double kExplicitBudget = 2.5e8;

// The wide draws of an fp8 query, in units of its rounding's size (measure_yardstick).
constexpr double kWideFp8Dither = 3;

}  // namespace

Design design_of(const ImplId& id, Profile p) {
  const Form f = id.family == Family::Cpu && id.form == Form::Kernel ? Form::Kernel
                 : id.form == Form::Explicit                         ? Form::Explicit
                                                                     : Form::Absorbed;
  Design d = spec_design(p, f);
  if (id.variant == Variant::AlphaKBf16) d.alpha_k = DType::BF16;
  d.gains_merged = id.variant == Variant::GammaMerged && d.form == Form::Absorbed;
  return d;
}

std::vector<DType> consistent_formats(const Tensor& x, const std::vector<bool>& mask, Profile p) {
  std::vector<DType> out = {x.dtype};
  for (DType f : {stored_dtype(p), DType::F32}) {
    if (!wider(x.dtype, f) || std::find(out.begin(), out.end(), f) != out.end()) continue;
    bool holds = true;
    for (int64_t i = 0; i < x.numel() && holds; ++i)
      holds =
          (!mask.empty() && !mask[size_t(i)]) || !std::isfinite(x[i]) || round_to(f, x[i]) == x[i];
    if (holds) out.push_back(f);
  }
  return out;
}

namespace {

// The families every form shares, each a variation of `base` (conventions §3's points with out,
// alpha_k as delivered); proofs/budgets.md names the public code behind each.
void real_code_families(const MlaConfig& c, const Design& base, DType D,
                        const std::function<void(const std::string&, Design)>& add) {
  Design flash = base;  // FlashMLA / FlashAttention: P stored for the tensor-core p.v, exp2
  flash.p = D, flash.exp2 = true;
  add("FlashMLA-style (P stored, exp2)", flash);
  // FlashInfer's fa2 kernels (prefill, MLA decode) take the row sum by an MMA over the cast P, so
  // lse carries P's rounding (zoo style flashinfer_mla, seeds 103622-103821: 14 of 57 lse
  // failures, worst_row up to 5.7e3x the candidates'; fitted).
  Design flash_sum = flash;
  flash_sum.p_sum_stored = true;
  add("FlashInfer-style (P stored, exp2, row sum of the stored P)", flash_sum);
  // A PyTorch attention core: fp32 softmax, P cast to the stored dtype after the division
  // (softmax(s, dtype=float32).type_as(x), then P.c in the stored dtype), every other point as
  // the base; at kernel level too, where q_latent arrives stored (zoo seed 72184).
  Design normalized = base;
  normalized.p = D, normalized.p_normalized = true;
  add("P stored after the softmax's division", normalized);
  // With a sink, a PyTorch core may fold it into P before P is stored (gpt-oss, HF eager: the
  // sink logit concatenated to the scores, its column dropped after the softmax): in fp16, a P
  // that the sink pushes below the normal range is a subnormal, a row scale of up to ~20 %
  // (zoo seed 95108: a module's latent_out row_bias 7.4x the designs that scale the output).
  auto with_sink_in_p = [&](const std::string& family, Design d) {
    if (!c.attn_sink) return;
    d.sink_in_p = true;
    add(family + ", sink folded into P", d);
  };
  with_sink_in_p("P stored after the softmax's division", normalized);
  // The explicit form as serving engines run it over a long context (SGLang's chunked-prefix MHA,
  // vLLM's MLA chunked-context prefill): keys and values up-projected by a module (kv_b_proj
  // writes k0c in the activation dtype, the norm and rotary modules their outputs), attention in
  // chunks whose outputs are stored in that dtype and merged by lse one after another
  // (merge_state_v2, merge_attn_states). In fp16 a tiny k0c is a subnormal (zoo seed 105681,
  // chunked_merge tiny_keys: lse worst_row 8.3x), and so is a tiny output, whose repeated
  // roundings make a row scale (seed 105743: out bias 11.1x). In fp8 the latent is read into bf16
  // before the up-projection (SGLang's _get_mla_kv_buffer with q's dtype; seed 106060: out bias
  // 5.6x). Only split orders store partials.
  // Not a candidate of the absorbed form: its split-KV kernels keep their partials in fp32
  // (FlashMLA's oaccum, FlashDecoding). Nor is the module's key a point of the explicit PyTorch
  // module family: there it cost kills in undeclared audits, which sample both forms (a one-head
  // 5 % bug's bias 6.3x -> 3.7x in audit.structure.catches_what_rel_l2_averages_away).
  if (base.form == Form::Explicit) {
    Design chunked = flash;
    chunked.partials = D;
    if (c.norm != NormMode::None) chunked.prelude = D;
    if (is_fp8(c.profile)) chunked.cache = DType::BF16;  // the fp8 latent read into bf16 first
    add("explicit modules, chunks stored and merged (SGLang chunked prefix)", chunked);
  }
  // A module storing every op's output stores out too; kernel-level references compute in fp32.
  if (base.form != Form::Kernel && base.out == D) {
    Design torch = base;  // a PyTorch module in the stored dtype: every op's output stored
    torch.score = D, torch.p = D, torch.p_normalized = true;
    if (c.norm != NormMode::None) torch.alpha_q = D, torch.alpha_k = D;  // .type_as(x)
    if (torch.form != Form::Explicit) torch.latent_out = D;
    if (torch.form == Form::Absorbed) torch.eager = D;
    if (is_fp8(c.profile)) torch.cache = DType::BF16;
    add("PyTorch module (every op stored)", torch);
    with_sink_in_p("PyTorch module (every op stored)", torch);
    // A JAX module stores every einsum's output the same way, but `codes.astype(f32) * scale`
    // stays fp32 under jnp promotion, so its fp8 cache enters the einsums undequantized to bf16
    // (zoo seed 102011, jax_xla fp8 outliers: an ill row 5.7x its allowance, 0.38x with this).
    if (is_fp8(c.profile)) {
      Design jax = torch;
      jax.cache = DType::F64;
      add("JAX module (einsum outputs stored, fp8 dequantized in fp32)", jax);
    }
    // Not a candidate: an MLX or JAX module whose Python float scale is cast to the stored dtype
    // first (design sigma=bf16). Its temperature change against the truth at sigma is a scale
    // bug's signature: as a family it let a one-head bug's bias (6.3x) and a one-sequence lse
    // shift (zoo seed 50000, 16x every correct style's) pass. Such a module is judged against the
    // truth at the stored scale instead (harness/stored_scale.hpp, run_audit).
  }
  if (base.form != Form::Kernel) {  // a kernel's q_latent is given stored: folding sigma in
    Design folded = base;           // there would round it twice, which no listed design does
    folded.scale_in_q = true;
    add("softmax scale folded into q", folded);
  }
  // An attention kernel without a per-key scale gets alpha_k inside its keys, each product stored
  // in the cache type (ggml-org/llama.cpp's ggml graph, mlx-lm's SDPA): a rounding of every key
  // element that scales with the logit (zoo seed 102007, ggml_cpu fp16 large_logits: out 7.2x the
  // candidates' rel_l2; 1.05x with this family, 0.8x with its keys left unrounded).
  if (c.norm != NormMode::None && base.form == Form::Absorbed) {
    Design folded_keys = base;
    folded_keys.key_fold = D;
    add("alpha_k folded into stored keys (no per-key scale)", folded_keys);
    // A module's RMSNorm returns the normalized query in its dtype before the absorption product
    // (SGLang's and vLLM's MLA modules, FlashInfer's RMSNorm; ggml's mul_mat converts its F32
    // input to the weight type): zoo seed 103956, ggml_cpu fp16 outliers, one-token rows' lse
    // (a logit) 4.5x the candidates' seq_shift; fitted.
    Design normed = base;
    normed.q_normed = D;
    add("normalized query stored before the absorption", normed);
    folded_keys.q_normed = D;  // both, as ggml's graph and mlx-lm's module in the stored dtype
    add("alpha_k folded into stored keys, normalized query stored", folded_keys);
  }
  // At kernel level the same, with alpha_q folded into the stored query, alone and with P stored:
  // PyTorch's scaled_dot_product_attention takes neither scale, so a wrapper folds both into its
  // bf16 q and k before its flash kernel, which stores P (zoo style torch_cpu_flash, seeds
  // 103416-103515: lse 3e-4 to 2e-3 where the kernel-level candidates reach ~5e-8; fitted).
  if (c.norm != NormMode::None && base.form == Form::Kernel) {
    Design folded = base;
    folded.key_fold = D;
    add("alpha_q, alpha_k folded into the stored query and keys", folded);
    folded.p = D;
    add("alpha_q, alpha_k folded into the stored query and keys, P stored", folded);
  }
  if (c.norm != NormMode::None && base.form != Form::Kernel) {
    Design rs = base;
    rs.approx_rsqrt = true;
    add("approximate rsqrt statistic", rs);
  }
  if (is_fp8(c.profile) && base.form != Form::Explicit) {
    Design deq = base;
    deq.cache = DType::BF16;
    add("fp8 cache dequantized to bf16", deq);
    // FlashMLA's fp8 decode does both: the tile dequantized to bf16 for the MMAs, bf16 P into the
    // second one (zoo seed 74015: a tiled kernel on tiny_keys, where every weight near 1 rounds
    // the same way, had a bias 4.1x either family's alone).
    Design flash_deq = flash;
    flash_deq.cache = DType::BF16;
    add("FlashMLA-style, fp8 cache dequantized to bf16", flash_deq);
    flash_deq.p_sum_stored = true;  // FlashInfer's MLA wrapper over a repacked bf16 cache
    add("FlashInfer-style, fp8 cache dequantized to bf16", flash_deq);
    Design normalized_deq = normalized;  // a PyTorch core over kv.to(bf16) * scale
    normalized_deq.cache = DType::BF16;
    add("P stored after the division, fp8 cache dequantized to bf16", normalized_deq);
    with_sink_in_p("P stored after the division, fp8 cache dequantized to bf16", normalized_deq);
  }
}

}  // namespace

DType delivered_lse_point(const Delivered& delivered, DType A) {
  DType lse = DType::F64;
  if (delivered.count("lse"))
    for (DType f : delivered.at("lse"))
      if (rounds_at(f, A) && (lse == DType::F64 || wider(lse, f))) lse = f;
  return lse;
}

DType delivered_latent_file(const Delivered& delivered, DType D, DType A) {
  if (!delivered.count("latent_out")) return DType::F64;
  const DType file = delivered.at("latent_out").front();  // the container's own format
  return file != D && rounds_at(file, A) ? file : DType::F64;
}

std::vector<Form> audit_forms(const MlaConfig& c, const std::string& declared,
                              const Delivered& delivered, std::string* note) {
  if (!declared.empty()) return {parse_form(declared)};
  if (c.level == Level::Kernel || delivered.count("latent_out")) return {Form::Absorbed};
  if (explicit_cost(c) > kExplicitBudget) {
    if (note)
      *note = fmt::format(
          "explicit-form designs not sampled ({:.3g} multiply-adds a sample, over {:.3g}): an "
          "explicit implementation declares --form explicit",
          explicit_cost(c), kExplicitBudget);
    return {Form::Absorbed};
  }
  return {Form::Absorbed, Form::Explicit};
}

std::vector<Candidate> candidate_designs(const MlaConfig& c, const std::vector<Form>& forms,
                                         const Delivered& delivered) {
  std::vector<Candidate> out;
  for (Form f : forms)
    for (Candidate& x : candidate_designs(c, f, delivered)) {
      if (forms.size() > 1 && f == Form::Explicit) x.family = "explicit form: " + x.family;
      if (std::none_of(out.begin(), out.end(), [&](const Candidate& y) { return y.d == x.d; }))
        out.push_back(std::move(x));
    }
  return out;
}

std::vector<Candidate> candidate_designs(const MlaConfig& c, Form form,
                                         const Delivered& delivered) {
  const DType D = stored_dtype(c.profile), A = accumulate_dtype(c.profile);
  // The point a delivered format stands for: not rounded (A) when at least as wide as A.
  auto points_of = [&](const char* t) {
    std::vector<DType> out;
    for (DType f : delivered.count(t) ? delivered.at(t) : std::vector<DType>{D}) {
      const DType p = rounds_at(f, A) ? f : A;
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
    return out;
  };
  const DType lse = delivered_lse_point(delivered, A);  // one point, not a family of its own
  const DType latent_file =
      c.level == Level::Module ? delivered_latent_file(delivered, D, A) : DType::F64;
  std::vector<Candidate> out;
  auto add = [&](const std::string& family, Design d) {
    d.lse = lse;
    if (d.form != Form::Explicit) d.latent_file = latent_file;
    if (!rounds_at(d.score, A)) d.score = DType::F64;
    if (!rounds_at(d.alpha_q, A)) d.alpha_q = DType::F64;
    if (!rounds_at(d.cache, A)) d.cache = DType::F64;
    if (!rounds_at(d.eager, A)) d.eager = DType::F64;
    if (!rounds_at(d.sigma, A)) d.sigma = DType::F64;
    if (!rounds_at(d.key_fold, A) || d.form == Form::Explicit) d.key_fold = DType::F64;
    if (!rounds_at(d.partials, A)) d.partials = DType::F64;
    if (!rounds_at(d.prelude, A) || d.form != Form::Explicit) d.prelude = DType::F64;
    if (d.form != Form::Explicit) d.kv = d.rope_key = A;  // no such points: equal designs dedupe
    for (const Candidate& x : out)
      if (x.d == d) return;
    out.push_back({family, d});
  };
  const bool kernel = c.level == Level::Kernel;
  const DType alpha_k = delivered.count("alpha_k") && delivered.at("alpha_k").front() == DType::BF16
                            ? DType::BF16
                            : A;
  for (DType o : points_of(kernel ? "latent_out" : "out")) {
    if (kernel) {
      Design base = spec_design(c.profile, Form::Kernel);
      base.latent_out = o;
      add("conventions §3 rounding points", base);
      for (const Design& d : designs_over(base, {&Design::p}, D, A, true))
        add("conventions §3 points mixed", d);
      real_code_families(c, base, D, add);
      continue;
    }
    const Form f = form == Form::Explicit ? Form::Explicit : Form::Absorbed;
    Design acc = accumulate_design(c.profile, f);
    acc.alpha_k = alpha_k, acc.out = o;
    add("all-" + format_word(A) + " compute", acc);
    // alpha_k from the Gram form c (WK_g WK_g^T) c, the key never formed (a Triton-style kernel):
    // a sum with cancellation in the accumulate type, which shows only where nothing coarser is
    // rounded, so it varies the all-accumulate compute (zoo seed 76141: fp32 large_logits, out
    // ratio 4.43 without it, 1.35 with it). r^2 multiply-adds per token and group: sampled only
    // up to kGramBudget, and where it can be the least accurate: `out` unrounded (o == A) or a
    // profile storing in A (its lse). Otherwise the stored type's roundings in other families
    // give every tensor a larger yardstick (a paper-g8 bf16 audit at 4096 tokens: 17.5 s, 26.6 s
    // with the family sampled).
    if (c.norm != NormMode::None && f == Form::Absorbed && (o == A || D == A) &&
        gram_cost(c) <= kGramBudget) {
      Design gram = acc;
      gram.gram_alpha_k = true;
      add("alpha_k from the Gram form (key never formed)", gram);
    }
    Design base = spec_design(c.profile, f);
    base.alpha_k = alpha_k, base.out = o;
    add("conventions §3 rounding points", base);
    std::vector<DType Design::*> points = {&Design::q, &Design::rope, &Design::p};
    points.push_back(f == Form::Explicit ? &Design::kv : &Design::latent_out);
    if (f == Form::Explicit && c.norm == NormMode::Unified && c.d_r > 0)
      points.push_back(&Design::rope_key);
    for (const Design& d : designs_over(base, points, D, A, small_case(c)))
      add("conventions §3 points mixed", d);
    real_code_families(c, base, D, add);
  }
  return out;
}

namespace {

// The exact-arithmetic variants a design's correct implementations may take (conventions §1.2):
// they round at the same points but different values (alpha_q folded in or not, the query
// normalized first or not), so they sample the design's rounding noise, not only its summation
// order's.
std::vector<Variant> sample_variants(const MlaConfig& c, const Design& d) {
  if (c.norm == NormMode::None) return {Variant::Default};
  // At kernel level a wrapper may fold alpha_q into the given query in the accumulate type (a
  // Triton-style kernel): one more rounding of each element, which a logit that cancels from
  // terms of hundreds makes tens of ulp of a small lse (zoo seed 88059: 9.2x without it).
  if (c.level == Level::Kernel) return {Variant::Default, Variant::AlphaQFolded};
  if (d.form != Form::Absorbed) return {Variant::Default};
  // Merged gains are one more rounding point (the merged weights), which only gamma_merged has.
  if (d.gains_merged) return {Variant::GammaMerged};
  return {Variant::Default, Variant::AlphaQFolded, Variant::QNormedFirst};
}

// Every design's samples in the current summation order: outs[n] holds design n's.
std::vector<std::vector<Outputs>> run_designs(const Case& k, const std::vector<Design>& designs) {
  // stored partials alone differ from their base only in a split order: no duplicate samples
  const auto skipped = [&](const Design& d) {
    return rounds_at(d.partials, accumulate_dtype(k.cfg.profile)) && d.prelude == DType::F64 &&
           !impl::sum_order().splitting();
  };
  std::vector<impl::AbsorbedSpec> absorbed;
  for (const Design& d : designs)
    for (Variant v : sample_variants(k.cfg, d))
      if (k.cfg.level == Level::Module && d.form == Form::Absorbed && !skipped(d))
        absorbed.push_back({v, {}, d});
  std::vector<Outputs> batch = impl::cpu_absorbed(k, absorbed);  // one shared cache per rope format
  std::vector<std::vector<Outputs>> outs;
  size_t next = 0;
  for (const Design& d : designs) {
    outs.emplace_back();
    if (skipped(d)) continue;
    if (k.cfg.level == Level::Kernel)
      for (Variant v : sample_variants(k.cfg, d))
        outs.back().push_back(impl::cpu_kernel(k, d, {}, v));
    else if (d.form == Form::Explicit)
      outs.back().push_back(impl::cpu_explicit(k, d));
    else
      for (size_t n = 0; n < sample_variants(k.cfg, d).size(); ++n)
        outs.back().push_back(std::move(batch[next++]));
  }
  return outs;
}

// A design that stores the logit (its scores, or every op: eager) in F gives a one-token row,
// whose lse is that logit, one rounding to F at least: an error up to u_F |y|, whatever the
// design's samples, which share their roundings, happened to draw. So each sequence's one-token
// entry (metrics/structure.hpp) gets at least the noise level of such independent roundings,
// u_F sqrt(sum y^4) / sum y^2 (u_F / sqrt(n) for n equal rows): zoo seed 96217, jax_xla's fp16
// scores put 7.0e-4 on a 4-token sequence's first rows, every sample 1.7e-4.
void floor_one_token_noise(const Design& d, DType A, const Tensor& ref,
                           const std::vector<bool>& mask, const std::vector<double>& lse_floor,
                           Structure& st) {
  double u = 0;
  for (DType f : {d.score, d.eager})
    if (rounds_at(f, A)) u = std::max(u, unit_roundoff(f));
  if (u == 0 || ref.shape.empty() || lse_floor.empty()) return;
  const int64_t B = ref.shape[0], per_seq = B > 0 ? ref.numel() / B : 0;
  for (int64_t b = 0; b < B && size_t(2 * b + 1) < st.seq_noise.size(); ++b) {
    long double yy = 0, y4 = 0;
    for (int64_t i = b * per_seq; i < (b + 1) * per_seq; ++i)
      if ((mask.empty() || mask[size_t(i)]) && std::isfinite(ref[i]) && lse_floor[size_t(i)] == 0)
        yy += (long double)ref[i] * ref[i], y4 += (long double)ref[i] * ref[i] * ref[i] * ref[i];
    if (yy > 0)
      st.seq_noise[size_t(2 * b + 1)] =
          std::max(st.seq_noise[size_t(2 * b + 1)], double(u * std::sqrt(y4) / yy));
  }
}

// Restores the forward order when it goes out of scope.
struct OrderScope {
  explicit OrderScope(impl::SumOrder o) { impl::sum_order() = o; }
  ~OrderScope() { impl::sum_order() = {}; }
};

}  // namespace

// Split-KV into 2, 3 and 4 chunks: a kernel picks the count from the row's length, and each count
// rounds each chunk's fp32 lse at other points (zoo seed 93036: 3 chunks, lse 252, 5.8x the
// 2- and 4-chunk draws).
// A declared chunk length (--kv-chunk N) replaces them: the implementation merges as many chunks
// as a row has, and the error of stored partials grows with their number (zoo style
// vllm_mla_prefill, seed 107333: 7-19 chunks of 16 tokens, out bias 5.24x the 2-4-chunk samples'),
// so each split order takes chunks of N tokens, in the forward and reversed order and in 8 lanes.
std::vector<impl::SumOrder> yardstick_orders(int kv_chunk) {
  std::vector<impl::SumOrder> o = {{false, 1, 1}, {true, 1, 1}, {false, 2, 1}, {false, 8, 1}};
  if (kv_chunk > 0) {
    for (impl::SumOrder s : {impl::SumOrder{false, 1}, {true, 1}, {false, 8}})
      s.chunk = kv_chunk, o.push_back(s);
  } else {
    for (int splits : {2, 3, 4}) o.push_back({false, 1, splits});
  }
  return o;
}

Yardstick measure_yardstick(const Case& k, const std::vector<Candidate>& designs,
                            const TruthOf& truth, const std::vector<std::string>& tensors,
                            int kv_chunk) {
  const std::vector<impl::SumOrder> orders = yardstick_orders(kv_chunk);
  Yardstick y;
  y.designs = designs;
  std::vector<Design> plain;
  for (const Candidate& c : designs) plain.push_back(c.d);
  std::map<std::string, std::vector<bool>> masks;
  for (const std::string& t : tensors) masks[t] = valid_mask(k, t);
  const std::vector<double> lse_floor = lse_abs_floor(k);
  const DType A = accumulate_dtype(k.cfg.profile);
  for (size_t order = 0; order < orders.size(); ++order) {
    OrderScope scope(orders[order]);
    const std::vector<std::vector<Outputs>> outs = run_designs(k, plain);
    if (order == 0) {  // the noise levels first: their ill-conditioned rows leave the masks
      std::set<size_t> fp8_query;
      for (size_t n = 0; n < plain.size(); ++n)
        if (plain[n].q == DType::F8_E4M3) fp8_query.insert(n);
      std::map<size_t, std::vector<Outputs>> dithered;
      for (size_t n = 0; n < plain.size(); ++n)
        // stored logits, an fp8 query, the folded query at kernel level (attention_core.hpp)
        if (rounds_at(plain[n].score, A) || fp8_query.count(n) ||
            (rounds_at(plain[n].key_fold, A) && k.cfg.level == Level::Kernel &&
             k.cfg.norm != NormMode::None))
          dithered[n] = outs[n];
      const auto rerun = [&](size_t n) { return run_designs(k, {plain[n]}).front(); };
      const Changes ch = dithered_changes(dithered, rerun, tensors, false, fp8_query);
      // an eager design's chain draws: its ill rows' allowances, not every statistic's floor
      // (impl/attention_core.hpp LogitDither); only where the final logit's draws find a near
      // tie (they cost eight more runs of the design: a tiny fp8 module audit 0.57 -> 0.88 user-s)
      std::map<size_t, std::vector<Outputs>> eager;
      if (has_ill_rows(ch, truth, masks))
        for (size_t n = 0; n < plain.size(); ++n)
          if (rounds_at(plain[n].eager, A)) eager[n] = outs[n];
      Changes widen = dithered_changes(eager, rerun, tensors, true);
      // an fp8 query's wide draws (three times its rounding's size): tokens within the reach of
      // its larger roundings, as an independent kernel's (per-tensor scales, an fp8 rope key)
      // move its near ties; their levels and directions widen its ill rows' allowances (zoo style
      // fp8_attention, seeds 108583, 108699: large_logits rows moved outside the 32 draws' span)
      std::map<size_t, std::vector<Outputs>> fp8_base;
      for (size_t n : fp8_query) fp8_base[n] = outs[n];
      const Changes wide =
          dithered_changes(fp8_base, rerun, tensors, false, fp8_query, kWideFp8Dither);
      for (const auto& [n, per_t] : wide)
        for (const auto& [t, ds] : per_t)
          widen[n][t].insert(widen[n][t].end(), ds.begin(), ds.end());
      mark_ill_rows(ch, widen, truth, masks, y, wide);
      noise_levels(ch, truth, masks, lse_floor, y);
      if (truth("lse") && std::count(tensors.begin(), tensors.end(), "lse")) {
        std::vector<size_t> all(plain.size());
        for (size_t n = 0; n < all.size(); ++n) all[n] = n;
        approximate_exp_noise(*truth("lse"), masks["lse"], lse_floor, A, all, y);
      }
    }
    for (size_t n = 0; n < outs.size(); ++n)
      for (size_t v = 0; v < outs[n].size(); ++v) {
        const Outputs& o = outs[n][v];
        Yardstick::Sample s;
        s.design = n;
        s.id = {order, sample_variants(k.cfg, plain[n])[v]};
        for (const std::string& t : tensors) {
          const Tensor* ref = truth(t);
          if (!ref || !o.tensors.count(t)) continue;
          const Tensor& x = o.tensors.at(t);
          s.rel_l2[t] = compare(x, *ref, x.dtype, masks[t]).rel_l2;
          widen_ill_allowance(x, *ref, t, y);
          s.structure[t] =
              structure_of(x, *ref, masks[t], t == "lse" ? lse_floor : std::vector<double>{});
          if (t == "lse")
            floor_one_token_noise(plain[n], A, *ref, masks[t], lse_floor, s.structure[t]);
        }
        y.samples.push_back(std::move(s));
      }
  }
  for (const std::string& t : tensors) {
    size_t n = 0;
    const double e = y.least_accurate(t, &n);
    if (!std::isnan(e)) y.rel_l2[t] = e, y.design_of[t] = to_string(designs[n].d);
  }
  return y;
}

Yardstick measure_yardstick(const Case& k, const std::vector<Design>& designs, const TruthOf& truth,
                            const std::vector<std::string>& tensors) {
  std::vector<Candidate> c;
  for (const Design& d : designs) c.push_back({to_string(d), d});
  return measure_yardstick(k, c, truth, tensors);
}

std::vector<bool> Yardstick::mask(const std::string& t, std::vector<bool> valid) const {
  if (!ill.count(t)) return valid;
  const std::vector<bool>& bad = ill.at(t);
  if (valid.empty()) valid.assign(bad.size(), true);
  for (size_t i = 0; i < bad.size() && i < valid.size(); ++i) valid[i] = valid[i] && !bad[i];
  return valid;
}

double Yardstick::rms(size_t n, const std::string& t, const SampleId* self) const {
  double sq = 0;
  int count = 0;
  for (const Sample& s : samples) {
    if (s.design != n || !s.rel_l2.count(t) || (self && s.id == *self)) continue;
    sq += s.rel_l2.at(t) * s.rel_l2.at(t);
    ++count;
  }
  if (!count) return std::nan("");
  double e = std::sqrt(sq / count);
  for (const Noise& z : noise)
    if (z.design == n && z.tensor == t) e = std::max(e, z.rel_l2);
  return e;
}

double Yardstick::least_accurate(const std::string& t, size_t* which) const {
  double worst = std::nan("");
  if (which) *which = std::string::npos;
  for (size_t n = 0; n < designs.size(); ++n) {
    const double e = rms(n, t);
    if (!std::isnan(e) && !(e <= worst)) {
      worst = e;
      if (which) *which = n;
    }
  }
  return worst;
}

std::vector<double> Yardstick::seq_allowance(const std::string& t) const {
  std::vector<double> a;
  for (const Sample& s : samples) {
    if (!s.structure.count(t)) continue;
    const Structure& st = s.structure.at(t);
    a.resize(std::max(a.size(), st.seq_mean.size()), 0.0);
    for (size_t b = 0; b < st.seq_mean.size(); ++b)
      a[b] = std::max({a[b], st.seq_mean[b], st.seq_noise[b]});
  }
  for (const Noise& z : noise) {
    if (z.tensor != t) continue;
    a.resize(std::max(a.size(), z.seq_mean.size()), 0.0);
    for (size_t b = 0; b < z.seq_mean.size(); ++b) a[b] = std::max(a[b], z.seq_mean[b]);
  }
  return a;
}

double Yardstick::noise_max(const std::string& t, double Structure::*noise) const {
  double worst = 0;
  for (const Sample& s : samples)
    if (s.structure.count(t)) worst = std::max(worst, s.structure.at(t).*noise);
  return worst;
}

double Yardstick::structure_max(const std::string& t, size_t stat) const {
  double worst = std::nan("");
  for (const Sample& s : samples) {
    if (!s.structure.count(t)) continue;
    const double v = structure_values(s.structure.at(t))[stat];
    if (!std::isnan(v) && !(v <= worst)) worst = v;
  }
  for (const Noise& z : noise)
    if (z.tensor == t && stat < z.structure.size() && !std::isnan(z.structure[stat]) &&
        !(z.structure[stat] <= worst))
      worst = z.structure[stat];
  return worst;
}

}  // namespace qkmla
