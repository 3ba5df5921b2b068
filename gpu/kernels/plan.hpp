// Host-side layout decisions shared by the kernels' launcher and the CPU model, so that both page
// the cache, split the sequences and group the query rows identically. C++17, host only.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/kernels/stages.hpp"

namespace qkmla::gpu {

// The shapes the kernels support (their shared-memory tiles are sized for these bounds).
inline void check_dims(const Dims& d, bool explicit_form) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("gpu kernels: " + what);
  };
  need(d.G > 0 && d.H % d.G == 0, "H must be a multiple of G");
  need(d.r >= 1 && d.r <= kMaxRank, "latent rank r must be in [1, 512]");
  need(d.d_r <= kMaxRope && d.d_r % 2 == 0, "d_r must be even and at most 64");
  need(d.d_c <= kMaxRank && d.d_v <= kMaxRank, "d_c and d_v must be at most 512");
  need(!explicit_form || !d.unified, "the explicit baseline kernel supports norm = blockwise only");
}

inline int pages_for(int tokens) { return (tokens + kPage - 1) / kPage; }

// Paged cache: page j of sequence b lives in physical page block_table[b * max_pages + j]. Pages
// are handed out round-robin across sequences (page 0 of every sequence, then page 1, ...), as an
// allocator serving a growing batch does, so the block table is a real indirection. Unused table
// entries are -1. Slots past T_b in a sequence's last page are padding (NaN-filled).
struct Paging {
  int num_pages = 0, max_pages = 0;
  std::vector<int> block_table;  // [B, max_pages]
};

inline Paging make_paging(const std::vector<int>& seqlens) {
  Paging p;
  for (int T : seqlens) p.max_pages = std::max(p.max_pages, pages_for(T));
  p.block_table.assign(seqlens.size() * size_t(std::max(p.max_pages, 1)), -1);
  for (int j = 0; j < p.max_pages; ++j)
    for (size_t b = 0; b < seqlens.size(); ++b)
      if (j < pages_for(seqlens[b]))
        p.block_table[b * size_t(p.max_pages) + size_t(j)] = p.num_pages++;
  return p;
}

// The cache slot of token t of sequence b (the device computes the same, kernels.cuh slot_of).
inline size_t slot_of(const Paging& p, int b, int t) {
  return size_t(p.block_table[size_t(b) * size_t(p.max_pages) + size_t(t / kPage)]) * kPage +
         size_t(t % kPage);
}

// A paged per-token array [slots, width] as the dense [B, t_max, width] tensor of conventions §2,
// NaN past each T_b (how alpha_k is reported).
inline std::vector<float> dense_from_paged(const Paging& p, const std::vector<int>& seqlens,
                                           const std::vector<float>& paged, int t_max, int width) {
  std::vector<float> dense(seqlens.size() * size_t(t_max) * size_t(width), qk_nan());
  for (size_t b = 0; b < seqlens.size(); ++b)
    for (int t = 0; t < seqlens[b]; ++t)
      for (int w = 0; w < width; ++w)
        dense[(b * size_t(t_max) + size_t(t)) * size_t(width) + size_t(w)] =
            paged[slot_of(p, int(b), t) * size_t(width) + size_t(w)];
  return dense;
}

// Query rows of one decode block: row index i * H + h within the sequence, -1 past the end. The
// absorbed form groups any 16 rows (all share the latent cache); the explicit form groups rows of
// one key group (they share its keys and values).
struct RowBlocks {
  int count = 0;
  std::vector<int> rows;   // [count, kRowsPerBlock]
  std::vector<int> group;  // [count]: the key group of the block (explicit), 0 (absorbed)
};

inline RowBlocks make_row_blocks(const Dims& d, bool explicit_form) {
  RowBlocks rb;
  auto add = [&](const std::vector<int>& rows, int g) {
    for (size_t k = 0; k < rows.size(); k += kRowsPerBlock) {
      for (int m = 0; m < kRowsPerBlock; ++m)
        rb.rows.push_back(k + size_t(m) < rows.size() ? rows[k + size_t(m)] : -1);
      rb.group.push_back(g);
      ++rb.count;
    }
  };
  if (!explicit_form) {
    std::vector<int> all;
    for (int row = 0; row < d.S_q * d.H; ++row) all.push_back(row);
    add(all, 0);
  } else {
    for (int g = 0; g < d.G; ++g) {
      std::vector<int> rows;
      for (int i = 0; i < d.S_q; ++i)
        for (int h = 0; h < d.H; ++h)
          if (d.group_of(h) == g) rows.push_back(i * d.H + h);
      add(rows, g);
    }
  }
  return rb;
}

// Split-KV plan: every sequence is cut into splits of pages_per_split pages (the last one shorter);
// the number of (sequence, split, row block) work items aims at two per multiprocessor.
struct SplitPlan {
  int pages_per_split = 1, max_splits = 0;
  int splits(int T) const { return (pages_for(T) + pages_per_split - 1) / pages_per_split; }
};

inline SplitPlan make_plan(const std::vector<int>& seqlens, int row_blocks, int sm_count,
                           int forced) {
  SplitPlan s;
  long long pages = 0;
  for (int T : seqlens) pages += pages_for(T);
  const long long target = 2LL * std::max(sm_count, 1);
  s.pages_per_split =
      forced > 0 ? forced : int(std::max(1LL, (pages * row_blocks + target - 1) / target));
  for (int T : seqlens) s.max_splits = std::max(s.max_splits, s.splits(T));
  return s;
}

}  // namespace qkmla::gpu
