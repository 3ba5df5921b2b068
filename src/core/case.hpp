// A case: one config and the named input tensors every implementation reads (conventions §2).
#pragma once
#include <map>
#include <memory>
#include <string>

#include "core/config.hpp"
#include "core/tensor.hpp"

namespace qkmla {

struct Case {
  MlaConfig cfg;
  std::map<std::string, Tensor> tensors;

  const Tensor& get(const std::string& name) const;  // ConfigError naming the tensor if absent
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  int64_t t_max() const { return get("kv_c").shape[1]; }
  int64_t p_max() const { return get("rope_cos").shape[0]; }
  // Is cached token t visible to query (b, i)? The causal window of conventions §1.1 (widened by
  // `extra`: the causal_off_by_one mutant), or under top-k (§1.5) the row's index set, each slot
  // read as slot + `shift` (a mutant). Slots t >= T_b are never visible.
  bool visible(int b, int i, int64_t t, int extra = 0, int shift = 0) const;
  // The visible tokens in the order a kernel visits them: ascending, or under top-k the index
  // set's order (-1 pads skipped).
  std::vector<int64_t> tokens(int b, int i, int extra = 0, int shift = 0) const;
  // Top-k only: each row's index set, sorted [B * S_q][<= topk] (set by attach_latent; read from
  // `indices` when absent).
  std::shared_ptr<const std::vector<std::vector<int64_t>>> topk_sorted;
  // The sink logit of head h (conventions §1.5); only when cfg.attn_sink.
  double sink(int h) const { return get("attn_sink")[h]; }
  int64_t pos(int b, int i) const { return cfg.seqlens[size_t(b)] - cfg.s_q + i; }
  // The latent cache values c every implementation reads [B, T_max, r]: kv_c itself, or in the
  // fp8 profile the dequantized cache code x kv_c_scale (exact in double; conventions §3). Set by
  // attach_latent; stale if kv_c or kv_c_scale change afterwards.
  const Tensor& latent() const { return dequant ? *dequant : get("kv_c"); }
  std::shared_ptr<const Tensor> dequant;
};

// Sets k.dequant when the case carries kv_c_scale (fp8 profile) and k.topk_sorted under top-k.
void attach_latent(Case& k);

// A long context's per-token tensors held as floats (Tensor::compact: the same values, half the
// memory) when kv_c has at least `min_values` values: kv_c where it is the latent itself (not fp8
// codes), k_pe and the rope tables; F64 tensors stay. Returns whether kv_c was compacted.
bool compact_long_context(Case& k, int64_t min_values);

// fp8 profile: per token, scale_t = amax_t / 448 rounded to fp32 (1 for an all-zero row) and
// code = RNE(c / scale_t) saturating at +-448; kv_c becomes the codes (F8_E4M3) and kv_c_scale
// [B, T_max] is added (NaN past T_b, like the cache rows). Then attach_latent.
void quantize_fp8_cache(Case& k);

// The input tensor names and shapes a module-level case must carry for its config.
std::map<std::string, std::vector<int64_t>> expected_input_shapes(const MlaConfig& c, int64_t t_max,
                                                                  int64_t p_max);

// Positions that carry meaning: alpha_k rows at t >= T_b are unspecified (conventions §1.4); every
// other tensor is valid everywhere. Empty result = all valid.
std::vector<bool> valid_mask(const Case& k, const std::string& tensor);

// Per lse element [B, S_q, H]: the magnitude below which its error counts as absolute
// (conventions §5 "Judging", rule 5). 1 for a row that sums two or more exponentials (log of a sum
// carries an absolute rounding of a few u), 0 for a row with exactly one visible token: its lse
// is that token's logit, computed by every correct implementation to a relative accuracy.
std::vector<double> lse_abs_floor(const Case& k);

// NoPE (d_r = 0): the rope tensors may be absent from a file (conventions §1.3); adds the empty
// ones
// ([..., 0]) so every implementation reads the same names. No-op otherwise.
void complete_nope(Case& k);

// Checks names, shapes, dtypes, seqlens agreement, table size and NaN-free valid inputs.
// Throws ConfigError whose field names the tensor.
void validate_case(const Case& k);

}  // namespace qkmla
