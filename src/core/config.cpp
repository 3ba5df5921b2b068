#include "core/config.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

namespace qkmla {

namespace {
template <class E, size_t N>
E parse_enum(const std::string& key, const std::string& s,
             const std::pair<const char*, E> (&table)[N]) {
  std::string allowed;
  for (const auto& [name, value] : table) {
    if (s == name) return value;
    allowed += (allowed.empty() ? "" : "|") + std::string(name);
  }
  throw ConfigError(key, "unknown value '" + s + "' (expected " + allowed + ")");
}
template <class E, size_t N>
std::string enum_name(E v, const std::pair<const char*, E> (&table)[N]) {
  for (const auto& [name, value] : table)
    if (value == v) return name;
  return "?";
}
const std::pair<const char*, NormMode> kNorm[] = {
    {"blockwise", NormMode::Blockwise}, {"unified", NormMode::Unified}, {"none", NormMode::None}};
const std::pair<const char*, RopeOrder> kOrder[] = {{"norm_then_rope", RopeOrder::NormThenRope},
                                                    {"rope_then_norm", RopeOrder::RopeThenNorm}};
const std::pair<const char*, RopeStyle> kStyle[] = {{"interleaved", RopeStyle::Interleaved},
                                                    {"half", RopeStyle::Half}};
const std::pair<const char*, Profile> kProfile[] = {
    {"fp64", Profile::FP64}, {"fp32", Profile::FP32}, {"bf16", Profile::BF16},
    {"fp16", Profile::FP16}, {"fp8", Profile::FP8},   {"fp8-block128", Profile::FP8_B128}};
const std::pair<const char*, Level> kLevel[] = {{"module", Level::Module},
                                                {"kernel", Level::Kernel}};
}  // namespace

std::string to_string(NormMode m) { return enum_name(m, kNorm); }
std::string to_string(RopeOrder o) { return enum_name(o, kOrder); }
std::string to_string(RopeStyle s) { return enum_name(s, kStyle); }
std::string to_string(Profile p) { return enum_name(p, kProfile); }
std::string to_string(Level l) { return enum_name(l, kLevel); }
NormMode parse_norm(const std::string& s) { return parse_enum("norm", s, kNorm); }
RopeOrder parse_rope_order(const std::string& s) { return parse_enum("rope_order", s, kOrder); }
RopeStyle parse_rope_style(const std::string& s) { return parse_enum("rope_style", s, kStyle); }
Profile parse_profile(const std::string& s) { return parse_enum("profile", s, kProfile); }
Level parse_level(const std::string& s) { return parse_enum("level", s, kLevel); }

DType stored_dtype(Profile p) {
  switch (p) {
    case Profile::FP64:
      return DType::F64;
    case Profile::FP32:
      return DType::F32;
    case Profile::FP16:
      return DType::F16;
    case Profile::BF16:
    case Profile::FP8:
    case Profile::FP8_B128:
      return DType::BF16;
  }
  return DType::F64;
}

DType accumulate_dtype(Profile p) { return p == Profile::FP64 ? DType::F64 : DType::F32; }

int MlaConfig::max_seqlen() const {
  return seqlens.empty() ? 0 : *std::max_element(seqlens.begin(), seqlens.end());
}

void MlaConfig::set_default_scale() {
  if (softmax_scale == 0.0) softmax_scale = 1.0 / std::sqrt(double(d_c + d_r));
}

void MlaConfig::validate() const {
  auto positive = [](const char* key, long v) {
    if (v < 1) throw ConfigError(key, "must be >= 1, got " + std::to_string(v));
  };
  positive("heads", heads);
  positive("groups", groups);
  if (heads % groups != 0)
    throw ConfigError("groups", "heads % groups must be 0 (heads=" + std::to_string(heads) +
                                    ", groups=" + std::to_string(groups) + ")");
  positive("latent_rank", latent_rank);
  positive("d_c", d_c);
  positive("d_v", d_v);
  if (d_r < 0 || d_r % 2 != 0)
    throw ConfigError("d_r", "must be even and >= 0 (rotation pairs), got " + std::to_string(d_r));
  positive("batch", batch);
  if (batch > kMaxBatch)
    throw ConfigError("batch", "at most " + std::to_string(kMaxBatch) + " sequences, got " +
                                   std::to_string(batch));
  positive("s_q", s_q);
  if (int(seqlens.size()) != batch)
    throw ConfigError("seqlens", "has " + std::to_string(seqlens.size()) + " entries, batch is " +
                                     std::to_string(batch));
  for (size_t b = 0; b < seqlens.size(); ++b) {
    const int t = seqlens[b];
    if (t < 0 || (t > 0 && t < s_q))
      throw ConfigError("seqlens", "seqlens[" + std::to_string(b) + "] = " + std::to_string(t) +
                                       ": must be 0 or >= s_q = " + std::to_string(s_q) +
                                       " (the cache holds the query tokens)");
  }
  // Absurd sizes are refused here, before any element count can overflow (the memory estimate of
  // harness/resources.hpp judges what is merely too big for this machine).
  const double tokens = double(batch) * (double(max_seqlen()) + 2),
               rows = double(batch) * s_q * heads;
  const double widest = std::max({double(latent_rank) + d_r, double(d_c) + d_r, double(d_v)});
  if (tokens * widest * groups > 0x1p46 || rows * widest > 0x1p46 ||
      double(latent_rank) * groups * std::max(d_c, d_v) > 0x1p46)
    throw ConfigError(
        "batch", "the case would hold more than 2^46 (7e13) values in one tensor (batch " +
                     std::to_string(batch) + ", longest sequence " + std::to_string(max_seqlen()) +
                     "): far beyond any machine");
  if (!std::isfinite(eps) || eps < 0 || (eps == 0 && !allow_zero_eps))
    throw ConfigError("eps", "must be finite and > 0 (eps = 0 needs \"allow_zero_eps\": true)");
  if (!std::isfinite(softmax_scale) || softmax_scale <= 0)
    throw ConfigError("softmax_scale", "must be finite and > 0");
  if (topk < 0) throw ConfigError("topk", "must be >= 0 (0: dense), got " + std::to_string(topk));
  if (double(topk) * batch * s_q > 0x1p40)
    throw ConfigError("topk", "the index tensor would hold more than 2^40 entries");
}

std::string config_to_json(const MlaConfig& c) {
  nlohmann::ordered_json j;
  j["heads"] = c.heads;
  j["groups"] = c.groups;
  j["latent_rank"] = c.latent_rank;
  j["d_c"] = c.d_c;
  j["d_r"] = c.d_r;
  j["d_v"] = c.d_v;
  j["batch"] = c.batch;
  j["s_q"] = c.s_q;
  j["seqlens"] = c.seqlens;
  j["eps"] = c.eps;
  j["softmax_scale"] = c.softmax_scale;
  if (c.allow_zero_eps) j["allow_zero_eps"] = true;
  j["norm"] = to_string(c.norm);
  j["rope_order"] = to_string(c.rope_order);
  j["rope_style"] = to_string(c.rope_style);
  j["causal"] = c.causal;
  if (c.topk > 0) j["topk"] = c.topk;
  if (c.attn_sink) j["attn_sink"] = true;
  j["profile"] = to_string(c.profile);
  j["level"] = to_string(c.level);
  j["preset"] = c.preset;
  j["scenario"] = c.scenario;
  j["seed"] = c.seed;
  return j.dump();
}

namespace {

nlohmann::json parse_object(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("qkmla.config", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ConfigError("qkmla.config", "must be a JSON object");
  return j;
}

// Typed reads: an integer key takes only an integer in range, a number key only a number, ...,
// so a value is never silently truncated or converted.
void read_int(const nlohmann::json& v, const std::string& key, int& out) {
  if (!v.is_number_integer()) throw ConfigError(key, "must be an integer, got " + v.dump());
  const auto x = v.get<int64_t>();
  if (x < INT32_MIN || x > INT32_MAX) throw ConfigError(key, "out of range: " + v.dump());
  out = int(x);
}

void read_key(MlaConfig& c, const std::string& key, const nlohmann::json& v) {
  auto number = [&](double& out) {
    if (!v.is_number()) throw ConfigError(key, "must be a number, got " + v.dump());
    out = v.get<double>();
  };
  auto boolean = [&](bool& out) {
    if (!v.is_boolean()) throw ConfigError(key, "must be true or false, got " + v.dump());
    out = v.get<bool>();
  };
  auto text = [&]() {
    if (!v.is_string()) throw ConfigError(key, "must be a string, got " + v.dump());
    return v.get<std::string>();
  };
  if (key == "heads")
    read_int(v, key, c.heads);
  else if (key == "groups")
    read_int(v, key, c.groups);
  else if (key == "latent_rank")
    read_int(v, key, c.latent_rank);
  else if (key == "d_c")
    read_int(v, key, c.d_c);
  else if (key == "d_r")
    read_int(v, key, c.d_r);
  else if (key == "d_v")
    read_int(v, key, c.d_v);
  else if (key == "batch")
    read_int(v, key, c.batch);
  else if (key == "s_q")
    read_int(v, key, c.s_q);
  else if (key == "seqlens") {
    if (!v.is_array()) throw ConfigError(key, "must be an array of integers, got " + v.dump());
    c.seqlens.clear();
    for (const auto& x : v) read_int(x, key, c.seqlens.emplace_back());
  } else if (key == "eps")
    number(c.eps);
  else if (key == "softmax_scale")
    number(c.softmax_scale);
  else if (key == "allow_zero_eps")
    boolean(c.allow_zero_eps);
  else if (key == "causal")
    boolean(c.causal);
  else if (key == "topk")
    read_int(v, key, c.topk);
  else if (key == "attn_sink")
    boolean(c.attn_sink);
  else if (key == "preset")
    c.preset = text();
  else if (key == "scenario")
    c.scenario = text();
  else if (key == "seed") {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      throw ConfigError(key, "must be a non-negative integer, got " + v.dump());
    c.seed = v.get<uint64_t>();
  } else if (key == "norm")
    c.norm = parse_norm(text());
  else if (key == "rope_order")
    c.rope_order = parse_rope_order(text());
  else if (key == "rope_style")
    c.rope_style = parse_rope_style(text());
  else if (key == "profile")
    c.profile = parse_profile(text());
  else if (key == "level")
    c.level = parse_level(text());
  else
    throw ConfigError(key, "unknown config key (a typo would change the math)");
}

}  // namespace

void apply_config_json(MlaConfig& c, const std::string& text) {
  const nlohmann::json j = parse_object(text);
  for (const auto& [key, value] : j.items()) read_key(c, key, value);
}

MlaConfig config_from_json(const std::string& text) {
  const nlohmann::json j = parse_object(text);
  MlaConfig c;
  for (const auto& [key, value] : j.items()) read_key(c, key, value);  // unknown keys, wrong types
  static const char* required[] = {
      "heads",   "groups", "latent_rank",   "d_c",  "d_r",        "d_v",        "batch", "s_q",
      "seqlens", "eps",    "softmax_scale", "norm", "rope_order", "rope_style", "causal"};
  for (const char* key : required)
    if (!j.contains(key)) throw ConfigError(key, "missing required config key");
  c.validate();
  return c;
}

}  // namespace qkmla
