#include "io/inputs.hpp"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "io/safetensors.hpp"

namespace qkmla {

namespace {

const Tensor& need(const std::map<std::string, Tensor>& t, const std::string& name,
                   const std::string& path, size_t rank) {
  auto it = t.find(name);
  if (it == t.end()) throw InputError(path, name, "missing tensor (conventions §2 names)");
  if (it->second.shape.size() != rank)
    throw InputError(
        path, name,
        fmt::format("must have {} dimensions, has shape {}", rank, shape_str(it->second.shape)));
  return it->second;
}

int as_int(int64_t v, const std::string& path, const std::string& what) {
  if (v < 0 || v > INT32_MAX) throw InputError(path, what, "dimension out of range");
  return int(v);
}

Profile profile_of(const std::map<std::string, Tensor>& t, const std::string& path) {
  if (t.at("kv_c").dtype == DType::F8_E4M3)  // the scales' rank says which fp8 format
    return t.count("kv_c_scale") && t.at("kv_c_scale").shape.size() == 3 ? Profile::FP8_B128
                                                                         : Profile::FP8;
  switch (t.at("q_nope").dtype) {
    case DType::F64:
      return Profile::FP64;
    case DType::F32:
      return Profile::FP32;
    case DType::BF16:
      return Profile::BF16;
    case DType::F16:
      return Profile::FP16;
    default:
      throw InputError(
          path, "q_nope",
          "dtype " + dtype_name(t.at("q_nope").dtype) + " names no profile (F64, F32, BF16, F16)");
  }
}

// The dtype each input is stored in by `p` (conventions §3), or I32 for seqlens.
DType stored_as(const std::string& name, Profile p) {
  if (name == "seqlens" || name == "indices") return DType::I32;
  if (name == "rope_cos" || name == "rope_sin" || name == "kv_c_scale" || name == "attn_sink")
    return DType::F32;
  if (name == "kv_c" && is_fp8(p)) return DType::F8_E4M3;
  return stored_dtype(p);
}

// Refuses (or, asked, rounds once) every value the profile cannot store; returns the number
// rounded.
int64_t store_exactly(Case& k, const std::string& path, bool round_inputs) {
  int64_t rounded = 0;
  for (auto& [name, t] : k.tensors) {
    const DType d = stored_as(name, k.cfg.profile);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = t[i], r = round_to(d, v);
      if (r == v || (std::isnan(v) && std::isnan(r))) continue;
      if (!round_inputs)
        throw InputError(
            path, name,
            fmt::format("value {:.17g} at {} is not representable in {} (profile {}); pass "
                        "--round-inputs to round every "
                        "input once (RNE) to the profile's dtypes",
                        v, shape_str(t.unravel(i)), dtype_name(d), to_string(k.cfg.profile)));
      t[i] = r;
      ++rounded;
    }
    t.dtype = d;
  }
  return rounded;
}

}  // namespace

MlaConfig infer_config(const std::map<std::string, Tensor>& t, const std::string& path) {
  const Tensor& qn = need(t, "q_nope", path, 4);
  const Tensor& kv = need(t, "kv_c", path, 3);
  const Tensor& wk = need(t, "w_uk", path, 2);
  const Tensor& wv = need(t, "w_uv", path, 2);
  const Tensor& sl = need(t, "seqlens", path, 1);
  MlaConfig c;
  c.batch = as_int(qn.shape[0], path, "q_nope"), c.s_q = as_int(qn.shape[1], path, "q_nope");
  c.heads = as_int(qn.shape[2], path, "q_nope"), c.d_c = as_int(qn.shape[3], path, "q_nope");
  c.latent_rank = as_int(kv.shape[2], path, "kv_c");
  c.d_r = t.count("q_pe") ? as_int(need(t, "q_pe", path, 4).shape[3], path, "q_pe") : 0;
  if (c.d_c == 0 || wk.shape[1] % c.d_c != 0)
    throw InputError(
        path, "w_uk",
        fmt::format("has {} columns, not a multiple of d_c = {} (q_nope's last dimension)",
                    wk.shape[1], c.d_c));
  c.groups = as_int(wk.shape[1] / c.d_c, path, "w_uk");
  if (c.groups == 0 || wv.shape[1] % c.groups != 0)
    throw InputError(
        path, "w_uv",
        fmt::format("has {} columns, not a multiple of G = {} (from w_uk)", wv.shape[1], c.groups));
  c.d_v = as_int(wv.shape[1] / c.groups, path, "w_uv");
  c.seqlens.clear();
  for (int64_t b = 0; b < sl.numel(); ++b) {
    if (!(sl[b] >= 0 && sl[b] <= INT32_MAX && sl[b] == std::floor(sl[b])))
      throw InputError(
          path, "seqlens",
          fmt::format("value {} at [{}] is not a length (an integer in [0, 2^31))", sl[b], b));
    c.seqlens.push_back(int(sl[b]));
  }
  c.norm = t.count("gamma_cq")  ? NormMode::Blockwise
           : t.count("gamma_q") ? NormMode::Unified
                                : NormMode::None;
  c.profile = profile_of(t, path);
  if (t.count("indices")) c.topk = as_int(need(t, "indices", path, 3).shape[2], path, "indices");
  c.attn_sink = t.count("attn_sink") > 0;
  c.preset = "inputs";
  c.scenario = "inputs";
  c.seed = 0;
  c.softmax_scale = 0.0;
  return c;
}

InputsCase case_from_inputs(const InputsRequest& r) {
  return case_from_file(read_safetensors(r.path), r);
}

InputsCase case_from_file(SafetensorsFile f, const InputsRequest& r) {
  InputsCase out;
  MlaConfig& c = out.k.cfg;
  const bool has_config = f.metadata.count("qkmla.config") > 0;
  try {
    if (has_config)
      c = config_from_json(f.metadata.at("qkmla.config"));
    else
      c = infer_config(f.tensors, r.path);
    apply_config_json(c, r.overrides_json);
    c.level = Level::Module;
    c.set_default_scale();
    c.validate();
  } catch (const ConfigError& e) {
    throw InputError(r.path, e.field, e.problem);
  }
  for (auto& [name, t] : f.tensors)
    if (name.rfind("ref.", 0) != 0) out.k.tensors[name] = std::move(t);
  if (is_fp8(c.profile) && out.k.has("kv_c") && out.k.get("kv_c").dtype != DType::F8_E4M3) {
    if (!r.round_inputs)
      throw InputError(r.path, "kv_c",
                       "profile fp8 needs F8_E4M3 codes and kv_c_scale; pass --round-inputs to "
                       "quantize (bf16, then e4m3)");
    Tensor& kv = out.k.tensors.at("kv_c");
    for (double& x : kv.data) x = round_to(DType::BF16, x);
    quantize_fp8_cache(out.k);
  }
  complete_nope(out.k);
  const int64_t rounded = store_exactly(out.k, r.path, r.round_inputs);
  try {
    validate_case(out.k);
  } catch (const ConfigError& e) {
    throw InputError(r.path, e.field, e.problem);
  }
  attach_latent(out.k);
  out.metadata["qkmla.inputs"] = nlohmann::json{
      {"file", r.path},
      {"config", has_config ? "file metadata" : "inferred from shapes and dtypes"},
      {"overrides", nlohmann::json::parse(r.overrides_json)},
      {"rounded_values", rounded}}.dump();
  return out;
}

}  // namespace qkmla
