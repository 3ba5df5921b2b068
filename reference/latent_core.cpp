#include "reference/latent_core.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/attention_math.hpp"
#include "core/parallel.hpp"
#include "reference/exact_sum.hpp"
#include "reference/mp_matmul.hpp"

namespace qkmla::ref {

namespace {

// Tokens per exact latent-score product: memory only (S.5: every score has the same bits as in
// the product over the whole context).
constexpr int64_t kScoreTokens = 256;

// One thread's contiguous chunk of the sequence's tokens.
struct Chunk {
  int64_t t0 = 0, t1 = 0;
  PackedMpVec alpha_k;              // [(t1 - t0) * G]
  std::vector<PackedMpVec> rope;    // [rows][t1 - t0]: q.rope[row] . rope key of t
  std::vector<PackedMpVec> logits;  // [rows][visible tokens of the chunk], in token order
};

void each_chunk(std::vector<Chunk>& chunks, const std::function<void(Chunk&)>& f) {
  std::vector<std::function<void()>> tasks;
  for (Chunk& ch : chunks) tasks.push_back([&f, &ch] { f(ch); });
  run_parallel(tasks, int(tasks.size()));
}

}  // namespace

MpLatentResult mp_latent_attend(const Case& k, int b, const MpLatentRows& q, const CacheRows& cache,
                                const Perturbation& p, int threads) {
  const MlaConfig& c = k.cfg;
  const int64_t T = c.seqlens[size_t(b)];
  const int r = c.latent_rank, G = c.groups;
  const bool unified = c.norm == NormMode::Unified;
  const Tensor& kv = k.latent();
  // c[t0, t0 + n) [n, r]: into the case, or into `held` when the cache is held compact
  auto rows_c = [&](int64_t t0, int64_t n, std::vector<double>& held) {
    return kv.rows(kv.index({b, t0, 0}), n * r, held);
  };
  const Mp scale = hook::softmax_scale(p, c);
  const size_t rows = q.q_latent.size();
  const int n = int(std::clamp<int64_t>(threads, 1, std::max<int64_t>(T, 1)));
  std::vector<Chunk> chunks(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s)
    chunks[size_t(s)].t0 = T * s / n, chunks[size_t(s)].t1 = T * (s + 1) / n;
  // A.3 as the cache supplies it: alpha_k of every token, its rope score for every row.
  each_chunk(chunks, [&](Chunk& ch) {
    const CacheRow row_of = cache(ch.t0);
    ch.rope.resize(rows);
    MpVec rope, ak;
    for (int64_t t = ch.t0; t < ch.t1; ++t) {
      row_of(t, rope, ak);
      for (const Mp& a : ak) ch.alpha_k.push_back(a);
      for (size_t row = 0; row < rows; ++row) ch.rope[row].push_back(dot(q.rope[row], rope));
    }
  });
  auto alpha_k = [&](int64_t t, int g, Mp& out) {
    if (t >= T) throw std::logic_error("latent core: alpha_k of a token past the context");
    const auto ch = std::upper_bound(chunks.begin(), chunks.end(), t,
                                     [](int64_t u, const Chunk& x) { return u < x.t0; }) -
                    1;
    ch->alpha_k.get(size_t((t - ch->t0) * G + g), out);
  };
  // A.4: q_latent . c[t], exact sums (X.4) of the P-bit q_latent, a block of tokens at a time with
  // the extraction plan of the whole c^T [r, T] (S.5), then the logits of the visible tokens.
  WholeB whole;
  {
    std::vector<double> held;
    for (int64_t t0 = 0; t0 < T; t0 += 4096) {  // the entries of c^T
      const int64_t n = std::min<int64_t>(4096, T - t0);
      whole.add(rows_c(t0, n, held), n, r, r);
    }
  }
  each_chunk(chunks, [&](Chunk& ch) {
    ch.logits.resize(rows);
    std::vector<double> c_t, held;  // c^T of the block [r, nb]
    Mp a, s, rope;
    for (int64_t t0 = ch.t0; t0 < ch.t1; t0 += kScoreTokens) {
      const int64_t nb = std::min(kScoreTokens, ch.t1 - t0);
      const double* cb = rows_c(t0, nb, held);  // [nb, r]
      c_t.resize(size_t(r * nb));
      for (int64_t t = 0; t < nb; ++t)
        for (int l = 0; l < r; ++l) c_t[size_t(l * nb + t)] = cb[t * r + l];
      const std::vector<MpVec> latent = mp_times_doubles(q.q_latent, r, c_t.data(), nb, nb, &whole);
      for (size_t row = 0; row < rows; ++row) {
        const int i = int(row) / c.heads, g = hook::group_of(p, c, int(row) % c.heads);
        for (int64_t t = t0; t < t0 + nb; ++t) {
          if (!hook::visible(p, k, b, i, t)) continue;
          alpha_k(hook::alpha_k_token(p, t), g, a);
          s = q.row_scale[row] * a;
          ch.rope[row].get(size_t(t - ch.t0), rope);
          ch.logits[row].push_back(
              latent_logit(unified, scale, s, latent[row][size_t(t - t0)], rope));
        }
      }
    }
    ch.rope.clear();
  });
  MpLatentResult res;
  res.lse.resize(rows);
  res.latent_out.assign(rows, MpVec(size_t(r), Mp(0)));
  // E.6 and A.5: p_t rounded once; each sum over tokens exact, 256 tokens at a time by X.4's exact
  // products and across blocks by X.6 (p spans many binades, which X.4's scaling and X.6's
  // window follow), rounded once. Rows are independent: `threads` tasks take a range of rows each.
  auto attend_rows = [&](size_t row0, size_t row1) {
    for (size_t row = row0; row < row1; ++row) {
      std::vector<std::pair<const PackedMpVec*, size_t>> at;  // visible index -> (chunk, index)
      for (const Chunk& ch : chunks)
        for (size_t j = 0; j < ch.logits[row].size(); ++j) at.emplace_back(&ch.logits[row], j);
      res.lse[row] =
          softmax_lse(at.size(), [&](size_t j, Mp& out) { at[j].first->get(at[j].second, out); });
    }
    std::vector<size_t> next(row1 - row0, 0);  // the next logit of each row in its chunk
    std::vector<ExactSum> sums(size_t(r) * (row1 - row0));            // [rows of the task, r]
    std::vector<MpVec> pb(row1 - row0, MpVec(size_t(kScoreTokens)));  // [rows][block tokens]: p_t
    std::vector<double> held;
    Mp logit;
    for (const Chunk& ch : chunks) {
      std::fill(next.begin(), next.end(), 0);
      for (int64_t t0 = ch.t0; t0 < ch.t1; t0 += kScoreTokens) {
        const int64_t nb = std::min(kScoreTokens, ch.t1 - t0);
        for (size_t row = row0; row < row1; ++row) {
          MpVec& pr = pb[row - row0];
          pr.resize(size_t(nb));
          for (int64_t t = t0; t < t0 + nb; ++t) {
            Mp& out = pr[size_t(t - t0)];
            if (!hook::visible(p, k, b, int(row) / c.heads, t)) {
              out = 0;
              continue;
            }
            ch.logits[row].get(next[row - row0]++, logit);
            out = exp(logit - res.lse[row]);  // E.6's p_t
          }
        }
        add_mp_times_doubles(pb, nb, rows_c(t0, nb, held), r, r, sums);  // X.4, X.6: exact
      }
    }
    for (size_t row = row0; row < row1; ++row)
      for (int l = 0; l < r; ++l)
        sums[(row - row0) * size_t(r) + size_t(l)].round(
            res.latent_out[row][size_t(l)].backend().data());
  };
  const size_t m = std::max<size_t>(1, std::min<size_t>(size_t(std::max(threads, 1)), rows));
  std::vector<std::function<void()>> tasks;
  for (size_t s = 0; s < m; ++s)
    tasks.push_back([&, s] { attend_rows(rows * s / m, rows * (s + 1) / m); });
  run_parallel(tasks, int(m));
  // K.1 (proofs/absorption.md): an attention sink scales latent_out by 1 / (1 + exp(s_h - lse));
  // the lse is reported without it (conventions §1.5).
  if (c.attn_sink)
    for (size_t row = 0; row < rows; ++row) {
      const Mp s = k.sink(int(row) % c.heads);
      const Mp f = hook::sink_scale(p, true, s, res.lse[row]);
      for (Mp& x : res.latent_out[row]) x *= f;
      res.lse[row] = hook::sink_lse(p, true, s, res.lse[row]);
    }
  return res;
}

}  // namespace qkmla::ref
