// MlaConfig: every field of conventions §1.3/§2/§9, its validator and its JSON form.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace qkmla {

enum class NormMode { Blockwise, Unified, None };  // None: plain MLA (conventions §1.3)
enum class RopeOrder { NormThenRope, RopeThenNorm };
enum class RopeStyle { Interleaved, Half };
// FP8: e4m3 cache, one fp32 scale per token. FP8_B128: FlashMLA's fp8 cache format, one
// power-of-two scale per 128 latent values (conventions §3).
enum class Profile { FP64, FP32, BF16, FP16, FP8, FP8_B128 };
enum class Level { Module, Kernel };

// A rule broken by a config or case; `field` names what is wrong (a config key or a tensor).
struct ConfigError : std::runtime_error {
  std::string field;
  std::string problem;  // the message without the field (what() is "field: problem")
  ConfigError(std::string f, const std::string& msg)
      : std::runtime_error(f + ": " + msg), field(std::move(f)), problem(msg) {}
};

// The most sequences a case may have: 2^24, far beyond any decode batch; a larger --batch is
// refused before its per-sequence lengths are even allocated.
constexpr int kMaxBatch = 1 << 24;

struct MlaConfig {
  int heads = 16, groups = 16, latent_rank = 512, d_c = 128, d_r = 64, d_v = 128;
  int batch = 1, s_q = 1;
  std::vector<int> seqlens{4096};
  double eps = 1e-6;
  double softmax_scale =
      0.0;  // 0 means "not set": fill with 1/sqrt(d_c + d_r) via set_default_scale
  bool allow_zero_eps = false;  // eps == 0 accepted only when the case says so (conventions §1.4)
  NormMode norm = NormMode::Blockwise;
  RopeOrder rope_order = RopeOrder::NormThenRope;
  RopeStyle rope_style = RopeStyle::Interleaved;
  bool causal = true;
  // conventions §1.5. topk > 0: each query row attends only the cache slots listed in `indices`
  // [B, S_q, topk] (-1 pads), which replace the causal window. attn_sink: a per-head sink logit
  // `attn_sink` [H] scales out by exp(lse) / (exp(lse) + exp(s_h)); lse is unchanged.
  int topk = 0;
  bool attn_sink = false;
  Profile profile = Profile::BF16;
  Level level = Level::Module;
  // Provenance only: they do not define the math.
  std::string preset = "paper-decode", scenario = "normal";
  uint64_t seed = 1;

  int heads_per_group() const { return heads / groups; }
  int group_of(int h) const { return h / heads_per_group(); }  // g(h) = h / (H/G)
  int max_seqlen() const;
  void set_default_scale();
  // Throws ConfigError naming the first broken rule.
  void validate() const;
};

std::string to_string(NormMode m);
std::string to_string(RopeOrder o);
std::string to_string(RopeStyle s);
std::string to_string(Profile p);
std::string to_string(Level l);
NormMode parse_norm(const std::string& s);
RopeOrder parse_rope_order(const std::string& s);
RopeStyle parse_rope_style(const std::string& s);
Profile parse_profile(const std::string& s);
Level parse_level(const std::string& s);

DType stored_dtype(Profile p);  // inputs, weights, caches (fp8: the non-cache tensors)
inline bool is_fp8(Profile p) { return p == Profile::FP8 || p == Profile::FP8_B128; }
// Latent values per cache scale: 128 in FP8_B128, 0 = the whole token (FP8).
inline int fp8_scale_block(Profile p) { return p == Profile::FP8_B128 ? 128 : 0; }
DType accumulate_dtype(Profile p);  // sums and scalars

// JSON text of conventions §9. Parsing rejects unknown keys and wrong types (ConfigError naming the
// key) and validates the result.
std::string config_to_json(const MlaConfig& c);
MlaConfig config_from_json(const std::string& text);
// Sets the keys present in a JSON object (a partial config: e.g. a --config file), strictly typed;
// ConfigError names an unknown key or a wrong type. Does not validate the result.
void apply_config_json(MlaConfig& c, const std::string& json_object);

}  // namespace qkmla
