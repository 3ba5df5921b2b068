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
  // Absorbed form of a case read by rows (GpuCase::kv_c_rows): k stays empty and a page's latent
  // rows are read from the case when a block visits the page, the values the paged copy would
  // hold (only slots below T_b are ever read), so a long context holds no [slots, r] copy.
  bool by_rows = false;

  // The key rows [n, n_k] of logical page `page` of sequence b, physical page `phys`, its first
  // n slots: in k, or (by_rows) read into `buf`.
  const float* page_keys(const GpuCase& c, int b, int page, int phys, int n,
                         std::vector<float>& buf) const {
    if (!by_rows) return &k[size_t(phys) * kPage * size_t(n_k)];
    buf.resize(size_t(n) * size_t(n_k));
    c.kv_c_rows(b, page * kPage, n, buf.data());
    return buf.data();
  }
  // Its value rows [n, n_v] (absorbed: the key rows themselves, v = k).
  const float* page_values(int phys, const float* keys) const {
    return v.empty() ? keys : &v[size_t(phys) * kPage * size_t(n_v)];
  }
};

// K.3: the append stage for every cached token of every sequence. The explicit form's cache is
// made one key group at a time (`group`; each row block reads one group), so that the model holds
// 1/G of the full-key cache at once: every value is the one the all-groups cache holds.
ModelCache model_append(const GpuCase& c, bool explicit_form, int group = 0);

}  // namespace qkmla::gpu
