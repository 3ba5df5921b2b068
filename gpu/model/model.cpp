// gpu.model.<profile>: the CPU model of the GPU pipeline. It runs the stages of stages.hpp in the
// order the kernels run them (kernels.cuh, kernels_decode.cuh): the same paging, split plan, row
// blocks, per-lane partial sums and 32-lane tree, tiles, exp/log and rounding. Where a loop is
// reorganized for speed (the key and value projections) each output's sum still takes its terms in
// the same order.
#include <stdexcept>
#include <string>

#include "gpu/kernels/plan.hpp"
#include "gpu/model/model_cache.hpp"
#include "gpu/qkmla_gpu.hpp"

namespace qkmla::gpu {

namespace {

// K.1 + K.2 for every query row: alpha_q, the stored query rope part, the stored query content
// (q_latent, or qc^ in the explicit form).
struct Queries {
  std::vector<float> q, q_rope, alpha_q;  // [B, R, n_k], [B, R, d_r], [B, R]
};

Queries model_queries(const GpuCase& c, bool explicit_form) {
  const Dims& d = c.d;
  const int R = d.S_q * d.H, n_k = explicit_form ? d.d_c : d.r, half = d.d_r / 2;
  Queries q;
  q.q.resize(size_t(d.B) * R * n_k);
  q.q_rope.resize(size_t(d.B) * R * d.d_r);
  q.alpha_q.resize(size_t(d.B) * R);
  std::vector<float> w(size_t(d.d_c));
  for (int b = 0; b < d.B; ++b)
    for (int row = 0; row < R; ++row) {
      const size_t br = size_t(b) * R + size_t(row);
      const int i = row / d.H, h = row % d.H, g = d.group_of(h);
      const int pos = c.seqlens[size_t(b)] - d.S_q + i;
      const float* cs = pos >= 0 ? c.rope_cos.data() + size_t(pos) * half : nullptr;
      const float* sn = pos >= 0 ? c.rope_sin.data() + size_t(pos) * half : nullptr;
      const float aq = query_row(d, c.q_nope.data() + br * d.d_c, c.q_pe.data() + br * d.d_r,
                                 c.g_q.data(), c.g_k.data(), c.g_rq.data(), cs, sn, pos >= 0,
                                 w.data(), q.q_rope.data() + br * d.d_r);
      q.alpha_q[br] = aq;
      float* out = q.q.data() + br * n_k;
      if (explicit_form) {
        explicit_query_content(d, c.q_nope.data() + br * d.d_c, c.g_q.data(), aq, out);
        continue;
      }
      const long long ld = (long long)d.G * d.d_c;
      for (int l = 0; l < d.r; ++l) {
        const float* col = c.w_uk.data() + size_t(l) * size_t(ld) + size_t(g) * d.d_c;
        out[l] = round_store(d.stored, project(w.data(), d.d_c, [&](int j) { return col[j]; }));
      }
    }
  return q;
}

struct Partials {
  std::vector<float> o, lse;  // [B, R, max_splits, n_v], [B, R, max_splits] (the kernels' layout)
};

// K.4-K.6 for one (sequence, split, row block): the work of one decode thread block.
void model_block(const GpuCase& c, const ModelCache& mc, const Queries& q, const SplitPlan& plan,
                 const RowBlocks& rb, bool qk_norm, int b, int s, int blk, Partials& part) {
  const Dims& d = c.d;
  const int T = c.seqlens[size_t(b)], R = d.S_q * d.H, pages = pages_for(T);
  const int p0 = s * plan.pages_per_split, p1 = std::min(p0 + plan.pages_per_split, pages);
  const int* rows = rb.rows.data() + size_t(blk) * kRowsPerBlock;
  RowState st[kRowsPerBlock];
  std::vector<float> acc(size_t(kRowsPerBlock) * mc.n_v, 0.0f);
  float logits[kRowsPerBlock][kPage], p[kRowsPerBlock][kPage], alpha[kRowsPerBlock];
  std::vector<float> read;  // a page's latent rows when the cache is read by rows
  for (int k = 0; k < kRowsPerBlock; ++k) st[k] = row_start();
  for (int page = p0; page < p1; ++page) {
    const int phys = mc.paging.block_table[size_t(b) * mc.paging.max_pages + size_t(page)];
    const int t0 = page * kPage, n = std::min(kPage, T - t0);
    const float* keys = mc.page_keys(c, b, page, phys, n, read);
    const float* vals = mc.page_values(phys, keys);
    for (int tt = 0; tt < n; ++tt) {
      const size_t slot = size_t(phys) * kPage + size_t(tt);
      const float* key = keys + size_t(tt) * size_t(mc.n_k);
      const float* kr = mc.rope.data() + slot * size_t(d.d_r);
      for (int k = 0; k < kRowsPerBlock; ++k) {
        if (rows[k] < 0) continue;
        const int row = rows[k], i = row / d.H, h = row % d.H;
        const size_t br = size_t(b) * R + size_t(row);
        const float* qq = q.q.data() + br * mc.n_k;
        const float* qr = q.q_rope.data() + br * d.d_r;
        float lanes[32], rl[32];
        for (int lane = 0; lane < 32; ++lane) {
          lanes[lane] =
              lane_partial<kMaxRank / 32>([&](int j) { return qq[j]; },
                                          [&](int m) { return key[lane + 32 * m]; }, mc.n_k, lane);
          rl[lane] = lane_partial<kMaxRope / 32>(
              [&](int j) { return qr[j]; }, [&](int m) { return kr[lane + 32 * m]; }, d.d_r, lane);
        }
        float lat = tree32(lanes);
        if (mc.scaled) lat = lat * mc.scale[slot];
        const float rope = tree32(rl);
        const bool visible = token_visible(d.causal, T, d.S_q, i, t0 + tt);
        logits[k][tt] = visible ? logit(d, qk_norm, q.alpha_q[br],
                                        mc.alpha_k[slot * d.G + size_t(d.group_of(h))], lat, rope)
                                : -qk_inf();
      }
    }
    for (int k = 0; k < kRowsPerBlock; ++k) {
      if (rows[k] < 0) continue;
      alpha[k] = softmax_tile(st[k], logits[k], n, p[k]);
      if (mc.scaled)
        for (int tt = 0; tt < n; ++tt)
          p[k][tt] = p[k][tt] * mc.scale[size_t(phys) * kPage + size_t(tt)];
    }
    for (int k = 0; k < kRowsPerBlock; ++k) {
      if (rows[k] < 0) continue;
      for (int j = 0; j < mc.n_v; ++j) {
        float& a = acc[size_t(k) * mc.n_v + size_t(j)];
        a = accumulate_tile(
            a, alpha[k], p[k],
            [&](int tt) { return vals[size_t(tt) * size_t(mc.n_v) + size_t(j)]; }, n);
      }
    }
  }
  for (int k = 0; k < kRowsPerBlock; ++k) {
    if (rows[k] < 0) continue;
    const size_t sr = (size_t(b) * R + size_t(rows[k])) * plan.max_splits + size_t(s);
    part.lse[sr] = split_lse(st[k]);
    for (int j = 0; j < mc.n_v; ++j)
      part.o[sr * mc.n_v + size_t(j)] = split_out(st[k], acc[size_t(k) * mc.n_v + size_t(j)]);
  }
}

}  // namespace

SplitInfo split_info(const Dims& d, const std::vector<int>& seqlens, const RunOptions& o) {
  const SplitPlan plan =
      make_plan(seqlens, make_row_blocks(d, o.explicit_form).count, o.sm_count, o.pages_per_split);
  return {plan.pages_per_split, plan.max_splits, kPage};
}

GpuOutputs run_model(const GpuCase& c, const RunOptions& o) {
  const Dims& d = c.d;
  check_dims(d, o.explicit_form);
  const Queries q = model_queries(c, o.explicit_form);
  const RowBlocks rb = make_row_blocks(d, o.explicit_form);
  const SplitPlan plan = make_plan(c.seqlens, rb.count, o.sm_count, o.pages_per_split);
  const int R = d.S_q * d.H, n_v = o.explicit_form ? d.d_v : d.r;
  Partials part;
  part.o.assign(size_t(d.B) * plan.max_splits * R * n_v, 0.0f);
  part.lse.assign(size_t(d.B) * plan.max_splits * R, -qk_inf());
  // Absorbed: one cache for every row block. Explicit: each group's cache in turn, read by that
  // group's row blocks (blocks write disjoint partials, so their order does not matter).
  std::vector<float> alpha_k;  // [slots, G]
  Paging paging;
  for (int g = 0; g < (o.explicit_form ? d.G : 1); ++g) {
    const ModelCache mc = model_append(c, o.explicit_form, g);
    for (int b = 0; b < d.B; ++b)
      for (int s = 0; s < plan.splits(c.seqlens[size_t(b)]); ++s)
        for (int blk = 0; blk < rb.count; ++blk)
          if (!o.explicit_form || rb.group[size_t(blk)] == mc.group)
            model_block(c, mc, q, plan, rb, o.qk_norm && !o.explicit_form, b, s, blk, part);
    if (g == 0) alpha_k = mc.alpha_k, paging = mc.paging;
    for (size_t slot = 0; o.explicit_form && slot < alpha_k.size() / size_t(d.G); ++slot)
      alpha_k[slot * d.G + size_t(g)] = mc.alpha_k[slot * d.G + size_t(g)];
  }
  GpuOutputs out;
  out.device = "cpu model";
  out.pages_per_split = plan.pages_per_split;
  out.max_splits = plan.max_splits;
  out.alpha_q = q.alpha_q;
  out.alpha_k = dense_from_paged(paging, c.seqlens, alpha_k, d.t_max, d.G);
  out.lse.resize(size_t(d.B) * R);
  out.out.resize(size_t(d.B) * R * d.d_v);
  if (!o.explicit_form) out.latent_out.resize(size_t(d.B) * R * d.r);
  std::vector<float> lat(static_cast<size_t>(n_v));
  for (int b = 0; b < d.B; ++b)
    for (int row = 0; row < R; ++row) {  // K.7 combine, then the value up-projection
      const size_t br = size_t(b) * R + size_t(row);
      const int ns = plan.splits(c.seqlens[size_t(b)]);
      const float* ls = part.lse.data() + br * plan.max_splits;
      const float lse = combine_lse(ls, ns);
      out.lse[br] = lse;
      for (int j = 0; j < n_v; ++j)
        lat[size_t(j)] =
            round_store(d.stored, combine_element(ls, ns, lse, [&](int s) {
                          return part.o[(br * plan.max_splits + size_t(s)) * n_v + size_t(j)];
                        }));
      if (o.explicit_form) {
        for (int j = 0; j < d.d_v; ++j) out.out[br * d.d_v + size_t(j)] = lat[size_t(j)];
        continue;
      }
      for (int l = 0; l < d.r; ++l) out.latent_out[br * d.r + size_t(l)] = lat[size_t(l)];
      const int g = d.group_of(row % d.H);
      const size_t ld = size_t(d.G) * d.d_v;
      for (int j = 0; j < d.d_v; ++j)
        out.out[br * d.d_v + size_t(j)] =
            round_store(d.stored, project(lat.data(), d.r, [&](int l) {
                          return c.w_uv[size_t(l) * ld + size_t(g) * d.d_v + size_t(j)];
                        }));
    }
  return out;
}

}  // namespace qkmla::gpu
