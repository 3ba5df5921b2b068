// The CPU model's paged cache: what the append kernel writes (K.3). Host only.
#pragma once
#include <vector>

#include "gpu/kernels/plan.hpp"
#include "gpu/qkmla_gpu.hpp"

namespace qkmla::gpu {

struct ModelCache {
  Paging paging;
  int n_k = 0, n_v = 0;  // key/value widths
  int group = 0;         // explicit form: the one key group whose keys and values this cache holds
  bool scaled = false;   // fp8 latent cache: codes with one scale per slot
  std::vector<float> k;  // [slots, n_k]: the latent cache c (absorbed) or group's kc^
  std::vector<float> v;  // [slots, n_v]: group's explicit values (absorbed: empty, v = k)
  std::vector<float> scale;    // [slots] (fp8)
  std::vector<float> rope;     // [slots, d_r]
  std::vector<float> alpha_k;  // [slots, G] (explicit form: group's column only, NaN elsewhere)
  // Every slot starts as NaN: padding past T_b and unused pages stay NaN, so a kernel or model
  // that reads them poisons its output (tests check that none does).

  // What the row blocks of `group` read (absorbed: every row block reads the one latent row).
  const float* key(size_t slot) const { return &k[slot * size_t(n_k)]; }
  const float* value(size_t slot) const { return v.empty() ? key(slot) : &v[slot * size_t(n_v)]; }
};

// K.3: the append stage for every cached token of every sequence. The explicit form's cache is
// made one key group at a time (`group`; each row block reads one group), so that the model holds
// 1/G of the full-key cache at once: every value is the one the all-groups cache holds.
ModelCache model_append(const GpuCase& c, bool explicit_form, int group = 0);

}  // namespace qkmla::gpu
