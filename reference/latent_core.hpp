// The reference's latent attention core (A.4-A.5), shared by ref.absorbed (after its query and
// append stages) and ref.kernel (on a kernel-level case's inputs): exact latent scores (X.4), the
// logit of core/attention_math.hpp, softmax (E.6) and latent_out = sum_t p c[t], all at the
// precision of the enclosing PrecisionScope.
#pragma once
#include <vector>

#include "core/case.hpp"
#include "core/perturbation.hpp"
#include "reference/ref_common.hpp"

namespace qkmla::ref {

// The query rows of one sequence, row = i * H + h.
struct MpLatentRows {
  std::vector<MpVec> q_latent;  // [rows][r]
  std::vector<MpVec> rope;      // [rows][d_r]
  MpVec row_scale;              // [rows]: alpha_q, or 1 when the row carries it (or norm none)
};

// The per-token side of one sequence's cache (the latent rows c[t] are read from the case).
struct MpLatentCache {
  std::vector<MpVec> rope;     // [T][d_r]
  std::vector<MpVec> alpha_k;  // [T][G]
};

struct MpLatentResult {
  MpVec lse;                      // [rows]
  std::vector<MpVec> latent_out;  // [rows][r]
};

// Sequence b: the perturbation supplies group map, visibility, alpha_k token and softmax scale.
// `threads` share the query rows (the same bits for any count).
MpLatentResult mp_latent_attend(const Case& k, int b, const MpLatentRows& q,
                                const MpLatentCache& cache, const Perturbation& p = {},
                                int threads = 1);

}  // namespace qkmla::ref
