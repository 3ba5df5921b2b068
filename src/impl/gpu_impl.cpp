#include "impl/gpu_impl.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

namespace qkmla::impl {

std::string gpu_not_applicable(const MlaConfig& c) {
  if (c.profile == Profile::FP64) return "the kernels have no fp64 profile";
  if (c.profile == Profile::FP8_B128) return "the kernels read one fp8 scale per token";
  if (c.norm == NormMode::None)
    return "the kernels implement QK-normed MLA only (norm none is not built)";
  if (c.topk > 0 || c.attn_sink)
    return "the kernels implement dense attention without sinks (conventions §10)";
  return "";
}

namespace {

std::vector<float> floats(const Tensor& t) {
  if (t.is_compact()) return t.floats;
  return std::vector<float>(t.data.begin(), t.data.end());
}

std::vector<float> tail(const Tensor& t, int from) {
  return std::vector<float>(t.data.begin() + from, t.data.end());
}

gpu::Store store_of(DType d) {
  switch (d) {
    case DType::F32:
      return gpu::Store::F32;
    case DType::F16:
      return gpu::Store::F16;
    case DType::F8_E4M3:
      return gpu::Store::E4M3;
    default:
      return gpu::Store::BF16;
  }
}

Tensor tensor_of(const std::vector<float>& v, DType d, std::vector<int64_t> shape) {
  Tensor t(d, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = double(v[size_t(i)]);
  return t;
}

}  // namespace

gpu::GpuCase to_gpu_case(const Case& k, bool cache_by_rows) {
  const MlaConfig& c = k.cfg;
  if (const std::string why = gpu_not_applicable(c); !why.empty())
    throw ConfigError("profile", "GPU kernels: " + why);
  gpu::GpuCase g;
  gpu::Dims& d = g.d;
  d.B = c.batch, d.S_q = c.s_q, d.H = c.heads, d.G = c.groups, d.r = c.latent_rank;
  d.d_c = c.d_c, d.d_r = c.d_r, d.d_v = c.d_v, d.t_max = int(k.t_max());
  d.eps = float(c.eps), d.scale = float(c.softmax_scale);
  d.unified = c.norm == NormMode::Unified;
  d.norm_then_rope = c.rope_order == RopeOrder::NormThenRope;
  d.interleaved = c.rope_style == RopeStyle::Interleaved;
  d.causal = c.causal;
  d.stored = store_of(stored_dtype(c.profile));
  d.cache = store_of(k.get("kv_c").dtype);
  g.seqlens = c.seqlens;
  g.q_nope = floats(k.get("q_nope"));
  g.q_pe = floats(k.get("q_pe"));
  const Tensor& kv = k.get("kv_c");  // [B, t_max, r]
  if (cache_by_rows)
    g.kv_c_rows = [&kv](int b, int t0, int n, float* rows) {  // exact, as floats() is
      kv.read(kv.index({b, t0, 0}), int64_t(n) * kv.shape[2], rows);
    };
  else
    g.kv_c = floats(kv);
  if (k.has("kv_c_scale")) g.kv_c_scale = floats(k.get("kv_c_scale"));
  g.k_pe = floats(k.get("k_pe"));
  g.w_uk = floats(k.get("w_uk"));
  g.w_uv = floats(k.get("w_uv"));
  if (d.unified) {
    g.g_q = floats(k.get("gamma_q"));
    g.g_k = floats(k.get("gamma_k"));
    g.g_rq = tail(k.get("gamma_q"), c.d_c);
    g.g_rk = tail(k.get("gamma_k"), c.d_c);
  } else {
    g.g_q = floats(k.get("gamma_cq"));
    g.g_k = floats(k.get("gamma_ck"));
    g.g_rq = floats(k.get("gamma_rq"));
    g.g_rk = floats(k.get("gamma_rk"));
  }
  g.rope_cos = floats(k.get("rope_cos"));
  g.rope_sin = floats(k.get("rope_sin"));
  return g;
}

Outputs from_gpu(const Case& k, const gpu::GpuOutputs& g) {
  const MlaConfig& c = k.cfg;
  const DType D = stored_dtype(c.profile);
  const int64_t B = c.batch, S = c.s_q, H = c.heads;
  Outputs o;
  o.tensors["out"] = tensor_of(g.out, D, {B, S, H, c.d_v});
  o.tensors["lse"] = tensor_of(g.lse, DType::F32, {B, S, H});
  o.tensors["alpha_q"] = tensor_of(g.alpha_q, DType::F32, {B, S, H});
  o.tensors["alpha_k"] = tensor_of(g.alpha_k, DType::F32, {B, k.t_max(), c.groups});
  if (!g.latent_out.empty())
    o.tensors["latent_out"] = tensor_of(g.latent_out, D, {B, S, H, c.latent_rank});
  return o;
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Outputs gpu_model(const Case& k, const gpu::RunOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  Outputs out = from_gpu(k, gpu::run_model(to_gpu_case(k, true), o));
  out.seconds = seconds_since(t0);
  return out;
}

Outputs gpu_device(const Case& k, const gpu::RunOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  Outputs out = from_gpu(k, gpu::run_on_device(to_gpu_case(k), o));
  out.seconds = seconds_since(t0);
  return out;
}

}  // namespace qkmla::impl
