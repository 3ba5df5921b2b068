// The reference's latent attention core (A.4-A.5), shared by ref.absorbed (after its query and
// append stages) and ref.kernel (on a kernel-level case's inputs): exact latent scores (X.4), the
// logit of core/attention_math.hpp, softmax (E.6) and latent_out = sum_t p c[t], all at the
// precision of the enclosing PrecisionScope. It streams the context (proofs/reference.md, S.5):
// the cache's per-token side is asked for once per token and reduced at once to one rope score per
// row, the latent scores are formed a block of tokens at a time, and only the logits (packed) and
// alpha_k stay per token.
#pragma once
#include <functional>
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

// The per-token side of one sequence's cache (the latent rows c[t] are read from the case):
// `rows(t0)` returns the reader of a chunk of tokens from t0, which one thread calls for t0, t0 +
// 1,
// ... in order, each call giving token t's cached rope key [d_r] and alpha_k [G].
using CacheRow = std::function<void(int64_t t, MpVec& rope, MpVec& alpha_k)>;
using CacheRows = std::function<CacheRow(int64_t t0)>;

struct MpLatentResult {
  MpVec lse;                      // [rows]
  std::vector<MpVec> latent_out;  // [rows][r]
};

// Sequence b: the perturbation supplies group map, visibility, alpha_k token and softmax scale.
// `threads` share the tokens (cache rows, scores) and then the query rows (A.5): the same bits for
// any count.
MpLatentResult mp_latent_attend(const Case& k, int b, const MpLatentRows& q, const CacheRows& cache,
                                const Perturbation& p = {}, int threads = 1);

}  // namespace qkmla::ref
