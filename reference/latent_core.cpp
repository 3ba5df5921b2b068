#include "reference/latent_core.hpp"

#include <algorithm>
#include <functional>

#include "core/attention_math.hpp"
#include "core/parallel.hpp"
#include "reference/mp_matmul.hpp"

namespace qkmla::ref {

MpLatentResult mp_latent_attend(const Case& k, int b, const MpLatentRows& q,
                                const MpLatentCache& cache, const Perturbation& p, int threads) {
  const MlaConfig& c = k.cfg;
  const int64_t T = c.seqlens[size_t(b)];
  const int r = c.latent_rank;
  const bool unified = c.norm == NormMode::Unified;
  const Tensor& kv = k.latent();
  const Mp scale = hook::softmax_scale(p, c);
  const size_t rows = q.q_latent.size();
  // A.4: q_latent . c[t] for every row and token, exact sums (X.4) of the P-bit q_latent.
  std::vector<double> c_t(size_t(r * T));  // c^T [r, T]
  for (int64_t t = 0; t < T; ++t)
    for (int l = 0; l < r; ++l) c_t[size_t(l * T + t)] = kv.at({b, t, l});
  const std::vector<MpVec> latent = mp_times_doubles(q.q_latent, r, c_t.data(), T, T);  // [rows][T]
  MpLatentResult res;
  res.lse.resize(rows);
  res.latent_out.assign(rows, MpVec(size_t(r), Mp(0)));
  // Rows are independent: `threads` tasks take a range of rows each (the same bits for any count).
  auto attend_rows = [&](size_t row0, size_t row1) {
    std::vector<MpVec> probs(row1 - row0, MpVec(size_t(T), Mp(0)));  // [rows][T], 0 where masked
    for (size_t row = row0; row < row1; ++row) {
      const int i = int(row) / c.heads, g = hook::group_of(p, c, int(row) % c.heads);
      MpVec logits;
      std::vector<int64_t> tokens;
      for (int64_t t = 0; t < T; ++t) {
        if (!hook::visible(p, c, T, i, t)) continue;
        const Mp s = q.row_scale[row] * cache.alpha_k[size_t(hook::alpha_k_token(p, t))][size_t(g)];
        logits.push_back(latent_logit(unified, scale, s, latent[row][size_t(t)],
                                      dot(q.rope[row], cache.rope[size_t(t)])));
        tokens.push_back(t);
      }
      MpVec pr;
      softmax(logits, res.lse[row], pr);  // E.6
      for (size_t n = 0; n < tokens.size(); ++n) probs[row - row0][size_t(tokens[n])] = pr[n];
    }
    // A.5: latent_out = sum_t p c[t] (p spans many binades: plain multiprecision sums).
    MpVec ct(static_cast<size_t>(r));
    Mp tmp;
    for (int64_t t = 0; t < T; ++t) {
      for (int l = 0; l < r; ++l) ct[size_t(l)] = kv.at({b, t, l});
      for (size_t row = row0; row < row1; ++row) {
        if (!hook::visible(p, c, T, int(row) / c.heads, t)) continue;
        for (int l = 0; l < r; ++l)
          mac(res.latent_out[row][size_t(l)], probs[row - row0][size_t(t)], ct[size_t(l)], tmp);
      }
    }
  };
  const size_t n = std::max<size_t>(1, std::min<size_t>(size_t(std::max(threads, 1)), rows));
  std::vector<std::function<void()>> tasks;
  for (size_t s = 0; s < n; ++s)
    tasks.push_back([&, s] { attend_rows(rows * s / n, rows * (s + 1) / n); });
  run_parallel(tasks, int(n));
  return res;
}

}  // namespace qkmla::ref
