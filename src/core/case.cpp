#include "core/case.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/attention_math.hpp"

namespace qkmla {

const Tensor& Case::get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw ConfigError(name, "missing tensor");
  return it->second;
}

namespace {

// Row (b, i)'s listed slots in index order, each + shift (pads skipped).
std::vector<int64_t> listed(const Case& k, int b, int i, int shift) {
  const Tensor& ix = k.get("indices");  // [B, S_q, topk]
  std::vector<int64_t> out;
  for (int j = 0; j < k.cfg.topk; ++j)
    if (const double v = ix.at({b, i, j}); v >= 0) out.push_back(int64_t(v) + shift);
  return out;
}

}  // namespace

bool Case::visible(int b, int i, int64_t t, int extra, int shift) const {
  const int64_t T = cfg.seqlens[size_t(b)];
  if (cfg.topk == 0) return token_visible(cfg.causal, T, cfg.s_q, i, t, extra);
  if (t < 0 || t >= T) return false;
  if (topk_sorted && shift == 0) {
    const std::vector<int64_t>& set = (*topk_sorted)[size_t(b * cfg.s_q + i)];
    return std::binary_search(set.begin(), set.end(), t);
  }
  const std::vector<int64_t> set = listed(*this, b, i, shift);
  return std::find(set.begin(), set.end(), t) != set.end();
}

std::vector<int64_t> Case::tokens(int b, int i, int extra, int shift) const {
  const int64_t T = cfg.seqlens[size_t(b)];
  std::vector<int64_t> out;
  if (cfg.topk == 0) {
    for (int64_t t = 0; t < T; ++t)
      if (token_visible(cfg.causal, T, cfg.s_q, i, t, extra)) out.push_back(t);
    return out;
  }
  for (int64_t t : listed(*this, b, i, shift))
    if (t >= 0 && t < T) out.push_back(t);
  return out;
}

void attach_latent(Case& k) {
  if (k.cfg.topk > 0 && k.has("indices")) {
    auto sets = std::make_shared<std::vector<std::vector<int64_t>>>();
    for (int b = 0; b < k.cfg.batch; ++b)
      for (int i = 0; i < k.cfg.s_q; ++i) {
        std::vector<int64_t> v = listed(k, b, i, 0);
        std::sort(v.begin(), v.end());
        sets->push_back(std::move(v));
      }
    k.topk_sorted = std::move(sets);
  } else {
    k.topk_sorted.reset();
  }
  if (!k.has("kv_c_scale")) {
    k.dequant.reset();
    return;
  }
  const Tensor& codes = k.get("kv_c");
  const Tensor& scale = k.get("kv_c_scale");  // [B, T_max] or [B, T_max, ceil(r / 128)]
  auto d = std::make_shared<Tensor>(DType::F64, codes.shape);
  const int64_t r = codes.shape.back();
  const int64_t block = scale.shape.size() == 3 ? 128 : r,
                per_token = scale.shape.size() == 3 ? scale.shape[2] : 1;
  for (int64_t n = 0; n < codes.numel(); ++n)  // <= 28 bits: exact
    (*d)[n] = codes[n] * scale[n / r * per_token + n % r / block];
  k.dequant = std::move(d);
}

bool compact_long_context(Case& k, int64_t min_values) {
  if (!k.has("kv_c") || k.get("kv_c").numel() < min_values) return false;
  auto narrow = [](const Tensor& t) {
    return t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16;
  };
  for (const char* name : {"k_pe", "rope_cos", "rope_sin"})
    if (k.has(name) && narrow(k.get(name))) k.tensors.at(name).compact();
  Tensor& kv = k.tensors.at("kv_c");
  if (k.has("kv_c_scale") || !narrow(kv)) return false;
  kv.compact();
  return true;
}

namespace {

// FlashMLA's block scale (the quantizer in its own tests): 2^ceil(log2(max(amax / 448, 1e-4))),
// amax / 448 and the logarithm in fp32. A power of two: code * scale is exact in bf16.
double block_scale(double amax) {
  const float a = std::max(float(amax / 448.0), 1e-4f);
  return std::ldexp(1.0, int(std::ceil(std::log2(a))));
}

}  // namespace

void quantize_fp8_cache(Case& k) {
  Tensor& kv = k.tensors.at("kv_c");
  const int64_t T = kv.shape[1], r = kv.shape[2];
  const int64_t block = fp8_scale_block(k.cfg.profile) ? fp8_scale_block(k.cfg.profile) : r;
  const int64_t nb = (r + block - 1) / block;
  std::vector<int64_t> shape{k.cfg.batch, T};
  if (fp8_scale_block(k.cfg.profile)) shape.push_back(nb);
  Tensor scale(DType::F32, shape, std::numeric_limits<double>::quiet_NaN());
  Tensor codes(DType::F8_E4M3, kv.shape, std::numeric_limits<double>::quiet_NaN());
  for (int b = 0; b < k.cfg.batch; ++b)
    for (int64_t t = 0; t < k.cfg.seqlens[size_t(b)]; ++t)
      for (int64_t j = 0; j < nb; ++j) {
        const int64_t l0 = j * block, l1 = std::min(r, l0 + block);
        double amax = 0;
        for (int64_t l = l0; l < l1; ++l) amax = std::max(amax, std::fabs(kv.at({b, t, l})));
        const double s = fp8_scale_block(k.cfg.profile) ? block_scale(amax)
                         : amax > 0                     ? round_to(DType::F32, amax / 448.0)
                                                        : 1.0;
        scale[(int64_t(b) * T + t) * nb + j] = s;
        // c / s in double, then one RNE to e4m3: the double quotient cannot land on an e4m3 tie
        // unless the exact one does (c has 8 bits, s 24: a non-tie quotient is >= 2^-30 relative
        // away from any tie, the double rounding moves it by <= 2^-53).
        for (int64_t l = l0; l < l1; ++l)
          codes.at({b, t, l}) = round_to(DType::F8_E4M3, kv.at({b, t, l}) / s);
      }
  kv = std::move(codes);
  k.tensors["kv_c_scale"] = std::move(scale);
  attach_latent(k);
}

std::vector<bool> valid_mask(const Case& k, const std::string& tensor) {
  if (tensor != "alpha_k") return {};
  const int64_t T = k.t_max(), G = k.cfg.groups;
  std::vector<bool> m(size_t(k.cfg.batch * T * G), false);
  for (int b = 0; b < k.cfg.batch; ++b)
    for (int64_t t = 0; t < k.cfg.seqlens[size_t(b)]; ++t)
      for (int64_t g = 0; g < G; ++g) m[size_t((b * T + t) * G + g)] = true;
  return m;
}

std::vector<double> lse_abs_floor(const Case& k) {
  const MlaConfig& c = k.cfg;
  std::vector<double> f(size_t(c.batch * c.s_q * c.heads), 1.0);
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.s_q; ++i)
      if (k.tokens(b, i).size() == 1)
        for (int64_t h = 0; h < c.heads; ++h) f[size_t((b * c.s_q + i) * c.heads + h)] = 0.0;
  return f;
}

namespace {

// conventions §3: the fp8 cache scales, one per token or one per 128 latent values.
void add_scale_shape(const MlaConfig& c, int64_t t_max,
                     std::map<std::string, std::vector<int64_t>>& m) {
  if (c.profile == Profile::FP8) m["kv_c_scale"] = {c.batch, t_max};
  if (c.profile == Profile::FP8_B128)
    m["kv_c_scale"] = {c.batch, t_max, (c.latent_rank + 127) / 128};
}

// conventions §1.5: top-k index sets and per-head sink logits, at either level.
void add_sparse_shapes(const MlaConfig& c, std::map<std::string, std::vector<int64_t>>& m) {
  if (c.topk > 0) m["indices"] = {c.batch, c.s_q, c.topk};
  if (c.attn_sink) m["attn_sink"] = {c.heads};
}

// Each listed slot in [0, T_b), no slot twice in a row (a kernel would attend it twice).
void validate_indices(const Case& k) {
  const MlaConfig& c = k.cfg;
  const Tensor& ix = k.get("indices");
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.s_q; ++i) {
      std::vector<int64_t> seen;
      for (int j = 0; j < c.topk; ++j) {
        const double v = ix.at({b, i, j});
        const std::string at =
            "[" + std::to_string(b) + ", " + std::to_string(i) + ", " + std::to_string(j) + "]";
        if (v == -1) continue;
        if (!(v >= 0 && v < c.seqlens[size_t(b)]))
          throw ConfigError("indices",
                            "slot " + std::to_string(int64_t(v)) + " at " + at +
                                " is outside [0, T_b = " + std::to_string(c.seqlens[size_t(b)]) +
                                ") (pad with -1)");
        seen.push_back(int64_t(v));
      }
      std::sort(seen.begin(), seen.end());
      if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
        throw ConfigError("indices", "row [" + std::to_string(b) + ", " + std::to_string(i) +
                                         "] lists a slot twice");
    }
}

}  // namespace

std::map<std::string, std::vector<int64_t>> expected_input_shapes(const MlaConfig& c, int64_t t_max,
                                                                  int64_t p_max) {
  const int64_t B = c.batch, S = c.s_q, H = c.heads, G = c.groups, r = c.latent_rank;
  if (c.level == Level::Kernel) {  // conventions §2 kernel level: already absorbed, already rounded
    std::map<std::string, std::vector<int64_t>> m = {{"q_latent", {B, S, H, r}},
                                                     {"alpha_q", {B, S, H}},
                                                     {"q_rope", {B, S, H, c.d_r}},
                                                     {"kv_c", {B, t_max, r}},
                                                     {"k_rope", {B, t_max, c.d_r}},
                                                     {"alpha_k", {B, t_max, G}},
                                                     {"seqlens", {B}}};
    if (c.norm == NormMode::None)
      m.erase("alpha_q"), m.erase("alpha_k");  // plain MLA: no statistics
    add_scale_shape(c, t_max, m);
    add_sparse_shapes(c, m);
    return m;
  }
  std::map<std::string, std::vector<int64_t>> m = {
      {"q_nope", {B, S, H, c.d_c}},
      {"q_pe", {B, S, H, c.d_r}},
      {"kv_c", {B, t_max, r}},
      {"k_pe", {B, t_max, c.d_r}},
      {"seqlens", {B}},
      {"w_uk", {r, G * c.d_c}},
      {"w_uv", {r, G * c.d_v}},
      {"rope_cos", {p_max, c.d_r / 2}},
      {"rope_sin", {p_max, c.d_r / 2}},
  };
  add_scale_shape(c, t_max, m);
  if (c.norm == NormMode::Blockwise) {
    m["gamma_cq"] = m["gamma_ck"] = {c.d_c};
    m["gamma_rq"] = m["gamma_rk"] = {c.d_r};
  } else if (c.norm == NormMode::Unified) {
    m["gamma_q"] = m["gamma_k"] = {c.d_c + c.d_r};
  }
  add_sparse_shapes(c, m);
  return m;
}

void complete_nope(Case& k) {
  const MlaConfig& c = k.cfg;
  if (c.d_r != 0 || c.level != Level::Module || !k.has("kv_c") || k.get("kv_c").shape.size() != 3)
    return;
  const int64_t t_max = k.get("kv_c").shape[1];
  const int64_t p_max =
      k.has("rope_cos") && !k.get("rope_cos").shape.empty() ? k.get("rope_cos").shape[0] : t_max;
  const DType d = k.has("q_nope") ? k.get("q_nope").dtype : stored_dtype(c.profile);
  for (const auto& [name, shape] : expected_input_shapes(c, t_max, p_max)) {
    const bool rope = name == "q_pe" || name == "k_pe" || name == "gamma_rq" ||
                      name == "gamma_rk" || name == "rope_cos" || name == "rope_sin";
    if (rope && !k.has(name))
      k.tensors[name] = Tensor(name.rfind("rope_", 0) == 0 ? DType::F32 : d, shape);
  }
}

void validate_case(const Case& k) {
  const MlaConfig& c = k.cfg;
  c.validate();
  const int64_t t_max = k.get("kv_c").shape.size() == 3 ? k.get("kv_c").shape[1] : -1;
  const bool kernel = c.level == Level::Kernel;
  const int64_t p_max =
      kernel ? t_max : (k.get("rope_cos").shape.empty() ? -1 : k.get("rope_cos").shape[0]);
  for (const auto& [name, shape] : expected_input_shapes(c, t_max, p_max)) {
    const Tensor& t = k.get(name);
    if (t.shape != shape)
      throw ConfigError(
          name, "shape " + shape_str(t.shape) + " does not match the config's " + shape_str(shape));
  }
  if (t_max < c.max_seqlen())
    throw ConfigError("kv_c", "T_max = " + std::to_string(t_max) +
                                  " < max(seqlens) = " + std::to_string(c.max_seqlen()));
  if (p_max < t_max)
    throw ConfigError("rope_cos",
                      "P_max = " + std::to_string(p_max) + " < T_max = " + std::to_string(t_max));
  const Tensor& sl = k.get("seqlens");
  for (int b = 0; b < c.batch; ++b)
    if (int(sl[b]) != c.seqlens[size_t(b)])
      throw ConfigError("seqlens", "tensor says seqlens[" + std::to_string(b) +
                                       "] = " + std::to_string(int(sl[b])) + ", config says " +
                                       std::to_string(c.seqlens[size_t(b)]));
  // Non-finite values in the read part of an input are refused: they would make every
  // comparison meaningless. Cache rows past T_b are unspecified and not read.
  for (const auto& [name, t] : k.tensors) {
    // Paged copies (docs/layouts.md) poison their unfilled slots with NaN on purpose.
    if (name.rfind("flashmla.", 0) == 0 || name.rfind("flashinfer.", 0) == 0) continue;
    if (name.rfind("ref.", 0) == 0 || name == "kv_c" || name == "k_pe" || name == "k_rope" ||
        name == "alpha_k" || name == "kv_c_scale")
      continue;
    // A sink of -inf is no sink (conventions §1.5); NaN and +inf are refused.
    const bool sink = name == "attn_sink";
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t[i]) && !(sink && t[i] == -std::numeric_limits<double>::infinity()))
        throw ConfigError(name, "non-finite value at flat index " + std::to_string(i));
  }
  if (c.topk > 0) validate_indices(k);
  if (is_fp8(c.profile)) {
    const Tensor& s = k.get("kv_c_scale");
    const int64_t per = s.shape.size() == 3 ? s.shape[2] : 1;
    for (int b = 0; b < c.batch; ++b)
      for (int64_t tok = 0; tok < c.seqlens[size_t(b)]; ++tok)
        for (int64_t j = 0; j < per; ++j)
          if (const double v = s[(b * s.shape[1] + tok) * per + j]; !(std::isfinite(v) && v > 0))
            throw ConfigError("kv_c_scale", "scale at [" + std::to_string(b) + ", " +
                                                std::to_string(tok) +
                                                (per > 1 ? ", " + std::to_string(j) : "") +
                                                "] must be finite and positive");
  }
  for (const char* name : {"kv_c", kernel ? "k_rope" : "k_pe",
                           kernel && c.norm != NormMode::None ? "alpha_k" : "kv_c"}) {
    const Tensor& t = k.get(name);
    const int64_t width = t.shape[2];
    for (int b = 0; b < c.batch; ++b)
      for (int64_t tok = 0; tok < c.seqlens[size_t(b)]; ++tok)
        for (int64_t j = 0; j < width; ++j)
          if (!std::isfinite(t.at({b, tok, j})))
            throw ConfigError(name, "non-finite value at [" + std::to_string(b) + ", " +
                                        std::to_string(tok) + ", " + std::to_string(j) + "]");
  }
}

}  // namespace qkmla
