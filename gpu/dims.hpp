// The shapes and formats of one case as every GPU stage reads them (plain data, copied to the
// device by value); shared by the host API (qkmla_gpu.hpp), the kernels and the CPU model.
#pragma once
#include "gpu/kernels/math.hpp"  // QK_HD: __host__ __device__ under nvcc, inline elsewhere

namespace qkmla::gpu {

enum class Store : int { F32 = 0, BF16 = 1, F16 = 2, E4M3 = 3 };

// Everything the stages need to know about a case; plain data (copied to the device by value).
struct Dims {
  int B = 0, S_q = 0, H = 0, G = 0, r = 0, d_c = 0, d_r = 0, d_v = 0;
  int t_max = 0;  // cache rows per sequence in the dense inputs
  float eps = 0, scale = 0;
  bool unified = false, norm_then_rope = true, interleaved = true, causal = true;
  Store stored = Store::BF16,
        cache = Store::BF16;  // cache: the latent cache's format (E4M3 in fp8)
  QK_HD int group_of(int h) const { return h / (H / G); }
};

}  // namespace qkmla::gpu
