// A design: where an implementation rounds (conventions §3 "Rounding points", §5 "Judging"). Every
// value is computed in the profile's accumulate type A; each rounding point names the format it is
// stored in before the next stage reads it (A itself: not rounded). The CPU implementations run any
// design (src/impl), the error-bound type bounds it, and an audit judges a kernel against correct
// implementations of the design it declares or delivers.
#pragma once
#include <string>

#include "core/config.hpp"
#include "core/dtype.hpp"

namespace qkmla {

enum class Form { Explicit, Absorbed, Kernel };

struct Design {
  Form form = Form::Absorbed;
  DType q = DType::F32;     // absorbed: q_latent; explicit: the normalized content query qc^
  DType rope = DType::F32;  // the query and key rope parts (qr^, kr^ or their unified forms)
  DType kv = DType::F32;    // explicit only: the materialized keys kc^ and values v
  // explicit, unified norm only: the gain-applied rope key before alpha_k scales it, stored where
  // a kernel caches its rotated keys and normalizes at attention time. Not a conventions §3 point:
  // A.
  DType rope_key = DType::F32;
  DType alpha_k = DType::F32;     // the cached key statistic
  DType p = DType::F32;           // the probabilities as p.c (p.v) reads them
  DType latent_out = DType::F32;  // absorbed: before the up-projection
  DType out = DType::F32;         // the delivered out
  // absorbed: gamma_cq (.) gamma_ck merged into WK offline and rounded once to the weight dtype
  // (conventions §1.2), one more rounding point than applying the gains at run time.
  bool gains_merged = false;
  // What real code does beyond conventions §3's points (proofs/budgets.md names who does each). F64
  // at a point: not rounded (every accumulate type is within F64).
  DType score = DType::F64;    // the logit and its two dot products stored (a PyTorch module: bf16)
  DType alpha_q = DType::F64;  // the query statistic stored before use (a PyTorch module: bf16)
  // absorbed: the normalized, gained query (alpha_q gamma_q gamma_k q_nope) stored before the
  // product with WK, alpha_q then carried by the query: a module's RMSNorm output in its dtype
  // (SGLang, vLLM, FlashInfer's RMSNorm -> bf16), ggml's mul_mat converting its F32 input to the
  // weight type. Not a conventions §3 point: F64.
  DType q_normed = DType::F64;
  DType cache = DType::F64;  // absorbed: the dequantized fp8 latent cache stored (bf16) before use
  // absorbed: every elementwise op's output stored (a PyTorch module in eager mode: the gain
  // product, the gained query, the transient key, each step of the rope parts' norm and rotation,
  // and each factor of the logit: latent score, x alpha_q, x alpha_k, + rope score, x sigma).
  DType eager = DType::F64;
  // the delivered lse stored in a narrower format (vLLM's Triton MLA decode allocates its lse
  // tensor in q's dtype: bf16); no stage reads it, so it is the last rounding
  DType lse = DType::F64;
  // module level: the delivered latent_out written in a format other than the stored dtype, after
  // the latent_out point (an fp32 case's module returning its latent as bf16); out is computed
  // before it, so, as lse, it is the last rounding of that tensor alone
  DType latent_file = DType::F64;
  // sigma itself stored before it multiplies anything: a Python float meeting a bf16 array is cast
  // to bf16 first (MLX's `mx.scalar(scale) * q`, JAX's weak typing); the error is a temperature
  // change of up to half an ulp of the format on every logit
  DType sigma = DType::F64;
  // absorbed or kernel: alpha_k multiplied into the latent key (unified: the rope key too) and the
  // product stored in this format before the dot, where an attention kernel takes no per-key scale
  // (ggml-org/llama.cpp's ggml graph: K_g = ggml_mul(kv latent view, alpha_k) in the cache type;
  // mlx-lm's SDPA: (c * alpha_k).astype(dtype)); the values stay the latent rows. At kernel level
  // alpha_q is folded into the given query the same way (no per-row scale either).
  DType key_fold = DType::F64;
  // sigma multiplied into q_latent and the query rope part before rounding
  bool scale_in_q = false;
  bool exp2 = false;          // exp2 with log2(e) folded into the scale (FlashAttention/FlashMLA)
  bool approx_rsqrt = false;  // 1/S through an approximate rsqrt (a few ulp of the statistic)
  // absorbed: alpha_k's statistic as c (WK_g WK_g^T) c / d_c, the key never formed (a Triton-style
  // kernel's Gram form; its rounding differs from summing the formed key's squares)
  bool gram_alpha_k = false;
  // P stored after the softmax's division (a module: softmax(...).type_as(x)) rather than as a
  // kernel stores its tile, exp(l - m) with the largest weight exactly 1, dividing after p.c.
  bool p_normalized = false;
  // With p_normalized, an attention sink's exp(s_h) joins the softmax's denominator before P is
  // stored (a PyTorch module: the sink logit concatenated to the scores, one fp32 softmax, its
  // column dropped, then .type_as(x): gpt-oss, HF eager with sinks), rather than scaling the
  // accumulated output (FlashMLA, conventions §1.5). Only sink cases differ.
  bool sink_in_p = false;
  // With P stored before the division (a kernel's tile), the row's denominator summed over the
  // stored P rather than the accumulate-type weights (FlashInfer's fa2 prefill and MLA kernels:
  // m16k16_rowsum_f16f16f32 over the cast P fragment). Its lse carries P's rounding; out does not
  // (the weights still sum to one).
  bool p_sum_stored = false;
  // Split-KV: each chunk's normalized output stored in this format before the merge, and the
  // running output stored again after each merge, the chunks merged one after another by their lse
  // (SGLang's chunked-prefix MHA: merge_state_v2 writes the activation dtype; FlashInfer's
  // merge_state_in_place on bf16 states). Only a split order (impl/profile_math.hpp) differs.
  DType partials = DType::F64;
  // explicit, QK-norm: the key up-projected by a module (k0c stored before its statistic and
  // norm: kv_b_proj's output in the activation dtype) and the rope parts' norm and rotation as
  // separate modules (each step stored), before the kv and rope points (transformers' and
  // SGLang's explicit MLA modules).
  DType prelude = DType::F64;
  bool operator==(const Design& o) const {
    return form == o.form && q == o.q && rope == o.rope && kv == o.kv && rope_key == o.rope_key &&
           alpha_k == o.alpha_k && p == o.p && latent_out == o.latent_out && out == o.out &&
           gains_merged == o.gains_merged && score == o.score && alpha_q == o.alpha_q &&
           q_normed == o.q_normed && cache == o.cache && eager == o.eager && lse == o.lse &&
           latent_file == o.latent_file && sigma == o.sigma && key_fold == o.key_fold &&
           scale_in_q == o.scale_in_q && exp2 == o.exp2 && approx_rsqrt == o.approx_rsqrt &&
           p_normalized == o.p_normalized && sink_in_p == o.sink_in_p &&
           p_sum_stored == o.p_sum_stored && gram_alpha_k == o.gram_alpha_k &&
           partials == o.partials && prelude == o.prelude;
  }
};

// Is a rounding point a rounding when the accumulate type is A (narrower than A)?
bool rounds_at(DType point, DType A);

// conventions §3's rounding points for a profile: q, rope, kv, latent_out, out in the stored dtype;
// alpha_k and p in the accumulate type.
Design spec_design(Profile p, Form f);
// Everything in the accumulate type: the design of an fp32 (fp64) compute that delivers fp32.
Design accumulate_design(Profile p, Form f);

// "q_latent=bf16,p=bf16,latent_out=fp32,out=bf16,alpha_k=fp32" (keys: form, q_latent or q, rope,
// kv, rope_key, alpha_k, p, latent_out, out, score, q_normed, cache, eager, lse, latent_file,
// sigma, key_fold, partials, prelude; values: fp64, fp32, bf16, fp16, or "stored"/"acc" for the
// profile's; gains=merged|runtime; scale_in_q, exp2, rsqrt, p_normalized, sink_in_p, p_sum_stored,
// gram_alpha_k = yes|no): starts from spec_design(profile, form) and sets the keys given.
// ConfigError names the key.
Design parse_design(const std::string& text, Profile p, Form default_form);
std::string to_string(const Design& d);
std::string format_word(DType d);  // fp64, fp32, bf16, fp16, fp8
std::string form_name(Form f);
Form parse_form(const std::string& s);  // ConfigError("form", ...)

}  // namespace qkmla
