// The CPU model's paged cache: what the append kernel writes (K.3). Host only.
#pragma once
#include <vector>

#include "plan.hpp"
#include "qkmla_gpu.hpp"

namespace qkmla::gpu {

struct ModelCache {
  Paging paging;
  int n_k = 0, n_v = 0, groups = 1;  // key/value widths; groups: 1 (absorbed: one latent row) or G
  bool scaled = false;               // fp8 latent cache: codes with one scale per slot
  std::vector<float> k;              // [slots, groups, n_k]: the latent cache c (absorbed) or kc^
  std::vector<float> v;        // [slots, groups, n_v]: explicit values (absorbed: empty, v = k)
  std::vector<float> scale;    // [slots] (fp8)
  std::vector<float> rope;     // [slots, d_r]
  std::vector<float> alpha_k;  // [slots, G]
  // Every slot starts as NaN: padding past T_b and unused pages stay NaN, so a kernel or model
  // that reads them poisons its output (tests check that none does).

  const float* key(size_t slot, int g) const {
    return &k[(slot * size_t(groups) + size_t(g)) * size_t(n_k)];
  }
  const float* value(size_t slot, int g) const {
    return v.empty() ? key(slot, g) : &v[(slot * size_t(groups) + size_t(g)) * size_t(n_v)];
  }
  // alpha_k as the dense [B, t_max, G] tensor of SPEC §2 (NaN past T_b).
  std::vector<float> dense_alpha_k(const GpuCase& c) const;
};

// K.3: the append stage for every cached token of every sequence.
ModelCache model_append(const GpuCase& c, bool explicit_form);

}  // namespace qkmla::gpu
