// The CUDA kernels of the decode pipeline (C++17; no Eigen/Boost/fmt). Each kernel runs the stages
// of stages.hpp from its thread mapping; model.cpp / model_append.cpp run the same stages in the
// same order on the CPU (gpu.model.<profile>). Built with --fmad=false, no fast math. Compiled as
// host C++ as well, where the fiber emulator runs them unchanged (emulator.hpp, gpu.emulated).
#pragma once
#ifdef __CUDACC__
#include <cuda_runtime.h>
#define QK_SHARED(x) ((void)0)  // the emulator's __shared__ registration (host_cuda.hpp)
#else
#include "gpu/kernels/host_cuda.hpp"  // the CPU emulator (emulated_pipeline.cpp)
#endif

#include <cstdint>

#include "gpu/kernels/stages.hpp"

namespace qkmla::gpu {

// Storage bits of each format and their exact conversion to fp32.
template <Store S>
struct Bits;
template <>
struct Bits<Store::F32> {
  using T = float;
  static QK_HD float ld(T v) { return v; }
  static QK_HD T enc(float x) { return x; }
};
template <>
struct Bits<Store::BF16> {
  using T = uint16_t;
  static QK_HD float ld(T v) { return bf16_to_float(v); }
  static QK_HD T enc(float x) { return float_to_bf16(x); }
};
template <>
struct Bits<Store::F16> {
  using T = uint16_t;
  static QK_HD float ld(T v) { return half_to_float(v); }
  static QK_HD T enc(float x) { return float_to_half(x); }
};
template <>
struct Bits<Store::E4M3> {
  using T = uint8_t;
  static QK_HD float ld(T v) { return e4m3_to_float(v); }
  static QK_HD T enc(float x) { return float_to_e4m3(x); }
};

// The xor butterfly whose sums equal tree32's (math.hpp) in every lane.
__device__ __forceinline__ float warp_tree(float v) {
  for (int off = 16; off >= 1; off >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The butterfly of tile_max (stages.hpp): a maximum under a total order, the same in every lane and
// equal to the sequential one.
__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off >= 1; off >>= 1) v = tile_max(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ size_t slot_of(const int* block_table, int max_pages, int b, int t) {
  return size_t(block_table[size_t(b) * max_pages + size_t(t / kPage)]) * kPage + size_t(t % kPage);
}

// ---------------------------------------------------------------- K.1 + K.2: query stage
struct QueryArgs {
  Dims d;
  bool explicit_form;
  const int* seqlens;
  const float *q_nope, *q_pe, *g_q, *g_k, *g_rq, *rope_cos, *rope_sin;  // fp32 values
  const void* w_uk;                                                     // [r, G*d_c] stored
  void *q, *q_rope;  // [B, R, n_k], [B, R, d_r] stored
  float* alpha_q;    // [B, R]
};

// One block per query row. Thread 0 runs query_row (a short sequential stage); then the threads
// share the projection's outputs, each one project() sum.
template <Store D>
__global__ void query_kernel(QueryArgs a) {
  using DB = Bits<D>;
  __shared__ float w[kMaxRank], qr[kMaxRope];
  __shared__ float aq;
  QK_SHARED(w), QK_SHARED(qr), QK_SHARED(aq);
  const Dims& d = a.d;
  const int R = d.S_q * d.H, br = blockIdx.x, b = br / R, row = br % R;
  const int i = row / d.H, h = row % d.H, g = d.group_of(h);
  const int pos = a.seqlens[b] - d.S_q + i, half = d.d_r / 2;
  if (threadIdx.x == 0) {
    const float* cs = pos >= 0 ? a.rope_cos + size_t(pos) * half : nullptr;
    const float* sn = pos >= 0 ? a.rope_sin + size_t(pos) * half : nullptr;
    aq = query_row(d, a.q_nope + size_t(br) * d.d_c, a.q_pe + size_t(br) * d.d_r, a.g_q, a.g_k,
                   a.g_rq, cs, sn, pos >= 0, w, qr);
    a.alpha_q[br] = aq;
    if (a.explicit_form) explicit_query_content(d, a.q_nope + size_t(br) * d.d_c, a.g_q, aq, w);
  }
  __syncthreads();
  auto* q = static_cast<typename DB::T*>(a.q);
  auto* qrope = static_cast<typename DB::T*>(a.q_rope);
  for (int j = threadIdx.x; j < d.d_r; j += blockDim.x)
    qrope[size_t(br) * d.d_r + j] = DB::enc(qr[j]);
  if (a.explicit_form) {
    for (int j = threadIdx.x; j < d.d_c; j += blockDim.x) q[size_t(br) * d.d_c + j] = DB::enc(w[j]);
    return;
  }
  const auto* wk = static_cast<const typename DB::T*>(a.w_uk);
  const size_t ld = size_t(d.G) * d.d_c;
  for (int l = threadIdx.x; l < d.r; l += blockDim.x) {
    const auto* col = wk + size_t(l) * ld + size_t(g) * d.d_c;
    q[size_t(br) * d.r + l] = DB::enc(project(w, d.d_c, [&](int j) { return DB::ld(col[j]); }));
  }
}

// ---------------------------------------------------------------- K.3: append
struct AppendArgs {
  Dims d;
  bool explicit_form;
  const int *seqlens, *block_table;
  int max_pages;
  const void* kv_c;  // [B, t_max, r] cache format (dense input)
  const float *kv_c_scale, *k_pe, *g_k, *g_rk, *rope_cos, *rope_sin;
  const void *w_uk, *w_uv;  // stored
  void *k, *v, *rope;       // paged outputs (v: explicit only)
  float *kscale, *alpha_k;
};

// One block per (token, sequence). Content keys are formed one group at a time in shared memory
// (fp32, never stored); thread 0 reduces each group's statistic in order.
template <Store D, Store C>
__global__ void append_kernel(AppendArgs a) {
  using DB = Bits<D>;
  using CB = Bits<C>;
  __shared__ float crow[kMaxRank], key[kMaxRank], z[kMaxRope];
  __shared__ float share, alpha, sc;
  QK_SHARED(crow), QK_SHARED(key), QK_SHARED(z), QK_SHARED(share), QK_SHARED(alpha), QK_SHARED(sc);
  const Dims& d = a.d;
  const int t = blockIdx.x, b = blockIdx.y;
  if (t >= a.seqlens[b]) return;
  const size_t bt = size_t(b) * d.t_max + size_t(t),
               slot = slot_of(a.block_table, a.max_pages, b, t);
  const auto* cin = static_cast<const typename CB::T*>(a.kv_c) + bt * d.r;
  for (int l = threadIdx.x; l < d.r; l += blockDim.x) crow[l] = CB::ld(cin[l]);
  if (threadIdx.x == 0) {
    sc = C == Store::E4M3 ? a.kv_c_scale[bt] : 1.0f;
    for (int j = 0; j < d.d_r; ++j) z[j] = a.k_pe[bt * d.d_r + j];
    const int half = d.d_r / 2;
    share = append_rope(d, z, a.g_rk, a.rope_cos + size_t(t) * half, a.rope_sin + size_t(t) * half);
  }
  __syncthreads();
  auto* rope = static_cast<typename DB::T*>(a.rope);
  for (int j = threadIdx.x; j < d.d_r; j += blockDim.x) rope[slot * d.d_r + j] = DB::enc(z[j]);
  const auto* wk = static_cast<const typename DB::T*>(a.w_uk);
  const auto* wv = static_cast<const typename DB::T*>(a.w_uv);
  for (int g = 0; g < d.G; ++g) {
    for (int j = threadIdx.x; j < d.d_c; j += blockDim.x) {
      const auto* col = wk + size_t(g) * d.d_c + j;
      float k = project(crow, d.r, [&](int l) { return DB::ld(col[size_t(l) * d.G * d.d_c]); });
      if (C == Store::E4M3) k = mul_rn(k, sc);
      key[j] = k;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      alpha = append_alpha_k(d, key, share);
      a.alpha_k[slot * d.G + g] = alpha;
    }
    __syncthreads();
    if (a.explicit_form) {
      auto* kout = static_cast<typename DB::T*>(a.k) + (slot * d.G + g) * d.d_c;
      auto* vout = static_cast<typename DB::T*>(a.v) + (slot * d.G + g) * d.d_v;
      for (int j = threadIdx.x; j < d.d_c; j += blockDim.x)
        kout[j] = DB::enc(mul_rn(mul_rn(key[j], a.g_k[j]), alpha));
      for (int j = threadIdx.x; j < d.d_v; j += blockDim.x) {
        const auto* col = wv + size_t(g) * d.d_v + j;
        float v = project(crow, d.r, [&](int l) { return DB::ld(col[size_t(l) * d.G * d.d_v]); });
        if (C == Store::E4M3) v = mul_rn(v, sc);
        vout[j] = DB::enc(v);
      }
    }
    __syncthreads();
  }
  if (!a.explicit_form) {
    auto* kout = static_cast<typename CB::T*>(a.k) + slot * d.r;
    for (int l = threadIdx.x; l < d.r; l += blockDim.x) kout[l] = cin[l];
    if (C == Store::E4M3 && threadIdx.x == 0) a.kscale[slot] = sc;
  }
}

}  // namespace qkmla::gpu

#include "gpu/kernels/kernels_decode.cuh"
