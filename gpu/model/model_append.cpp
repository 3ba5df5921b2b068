// K.3 in the CPU model: the append stage (alpha_k, the cached rope key, the paged caches).
#include <algorithm>
#include <limits>

#include "gemm/ordered_gemm.hpp"
#include "gpu/model/model_cache.hpp"

namespace qkmla::gpu {

namespace {

constexpr int kProjectTokens = 256;  // tokens projected at a time: memory independent of T

// Y[rows, cols] = X[rows, n] . W[n, ld] (columns [0, cols)): each output is project()'s sum, fmaf
// over l in order (ordered_gemm: SIMD across outputs only; the order per output is the kernel's).
void project_rows(const float* X, int rows, int n, const float* W, int ld, int cols, float* Y) {
  gemm::ordered_gemm(X, rows, n, W, ld, cols, Y, gemm::Fused::Yes);
}

}  // namespace

ModelCache model_append(const GpuCase& c, bool explicit_form, int group) {
  const Dims& d = c.d;
  ModelCache mc;
  mc.paging = make_paging(c.seqlens);
  mc.group = explicit_form ? group : 0;
  mc.n_k = explicit_form ? d.d_c : d.r;
  mc.n_v = explicit_form ? d.d_v : d.r;
  mc.scaled = !explicit_form && d.cache == Store::E4M3;
  const size_t slots = size_t(mc.paging.num_pages) * kPage;
  mc.by_rows = !explicit_form && c.kv_c.empty();
  if (!mc.by_rows) mc.k.assign(slots * size_t(mc.n_k), qk_nan());
  if (explicit_form) mc.v.assign(slots * size_t(mc.n_v), qk_nan());
  mc.scale.assign(mc.scaled ? slots : 0, qk_nan());
  mc.rope.assign(slots * size_t(d.d_r), qk_nan());
  mc.alpha_k.assign(slots * size_t(d.G), qk_nan());
  // Projected key columns: every group's (absorbed: all alpha_k) or the group's (explicit).
  const int kc = explicit_form ? d.d_c : d.G * d.d_c, half = d.d_r / 2;
  const int g0 = explicit_form ? group : 0, g1 = explicit_form ? group + 1 : d.G;
  const float* wk = c.w_uk.data() + size_t(g0) * d.d_c;
  const float* wv = c.w_uv.data() + size_t(g0) * d.d_v;
  const bool fp8 = d.cache == Store::E4M3;
  for (int b = 0; b < d.B; ++b) {
    const int T = c.seqlens[size_t(b)];
    // The block's latent rows [block, r]: in kv_c, or read through kv_c_rows when kv_c is empty.
    const float* crows = nullptr;
    std::vector<float> read;
    std::vector<float> keys, vals;  // [block, kc], [block, d_v]: projected a block of tokens at a
                                    // time (each output's sum is its own: the same values)
    for (int t = 0; t < T; ++t) {
      const int t0 = t - t % kProjectTokens;
      if (t == t0) {
        const int n = std::min(kProjectTokens, T - t0);
        if (c.kv_c.empty()) {
          read.resize(size_t(n) * d.r);
          c.kv_c_rows(b, t0, n, read.data());
          crows = read.data();
        } else {
          crows = c.kv_c.data() + (size_t(b) * d.t_max + size_t(t0)) * d.r;
        }
        keys.resize(size_t(n) * kc);
        project_rows(crows, n, d.r, wk, d.G * d.d_c, kc, keys.data());
        vals.resize(explicit_form ? size_t(n) * d.d_v : 0);
        if (explicit_form) project_rows(crows, n, d.r, wv, d.G * d.d_v, d.d_v, vals.data());
      }
      const size_t bt = size_t(b) * d.t_max + size_t(t);
      const size_t slot = slot_of(mc.paging, b, t);
      const float sc = fp8 ? c.kv_c_scale[bt] : 1.0f;
      float* key = keys.data() + size_t(t - t0) * kc;
      if (fp8)
        for (int j = 0; j < kc; ++j) key[j] = key[j] * sc;  // the key of the dequantized row
      float* z = mc.rope.data() + slot * size_t(d.d_r);
      std::copy_n(c.k_pe.data() + bt * d.d_r, d.d_r, z);
      const float share = append_rope(d, z, c.g_rk.data(), c.rope_cos.data() + size_t(t) * half,
                                      c.rope_sin.data() + size_t(t) * half);
      for (int g = g0; g < g1; ++g) {
        const float a = append_alpha_k(d, key + size_t(g - g0) * d.d_c, share);
        mc.alpha_k[slot * d.G + size_t(g)] = a;
        if (!explicit_form) continue;
        explicit_key_content(d, key, c.g_k.data(), a, mc.k.data() + slot * d.d_c);
        const float* v = vals.data() + size_t(t - t0) * d.d_v;
        float* vout = mc.v.data() + slot * d.d_v;
        for (int j = 0; j < d.d_v; ++j) vout[j] = round_store(d.stored, fp8 ? v[j] * sc : v[j]);
      }
      if (!explicit_form) {
        if (!mc.by_rows)
          std::copy_n(crows + size_t(t - t0) * d.r, d.r, mc.k.data() + slot * size_t(d.r));
        if (mc.scaled) mc.scale[slot] = sc;
      }
    }
  }
  return mc;
}

}  // namespace qkmla::gpu
