// Decode, split combine and value up-projection kernels (included by kernels.cuh).
#pragma once

namespace qkmla::gpu {

// ---------------------------------------------------------------- K.4-K.6: split-KV decode
struct DecodeArgs {
  Dims d;
  bool qk_norm;           // false: plain MLA (bench baseline) and the explicit form
  int n_k, n_v, kgroups;  // key / value widths; groups in the K/V cache (1: latent, G: explicit)
  int pages_per_split, max_splits, max_pages;
  const int *seqlens, *block_table, *rows, *row_group;  // rows: [blocks, 16] (plan.hpp)
  const void *q, *q_rope;                               // [B, R, n_k], [B, R, d_r] stored
  const float* alpha_q;                                 // [B, R]
  const void *k, *v;         // [slots, kgroups, n_k|n_v] in the key format (v == k: absorbed)
  const float* kscale;       // [slots] fp8 latent cache; null otherwise
  const void* rope;          // [slots, d_r] stored
  const float* alpha_k;      // [slots, G]
  float *o_part, *lse_part;  // [B, R, max_splits, n_v], [B, R, max_splits]
};

constexpr int kDecodeThreads = 256;
constexpr int kValueCols = kMaxRank / kDecodeThreads;  // value columns per thread
constexpr int kTokensPerPass = 2;  // tokens a warp scores per pass of the score loop (K.4)

// The decode grid: x = row block, y = split, z = sequence. The row blocks of one (sequence, split)
// are adjacent in launch order, so they run together and the cache pages they all read come from
// HBM once and from L2 after (S_q = 4 at H = 16: four row blocks per split).
inline dim3 decode_grid(int batch, int max_splits, int row_blocks) {
  return dim3(unsigned(row_blocks), unsigned(max_splits), unsigned(batch));
}

// One block per (sequence, split, row block). Per 64-token page (= tile): the 8 warps score the
// page's tokens (lane partials + butterfly), each warp updates the online softmax of two rows, and
// every thread updates its value columns of all 16 rows. Tokens at or past T_b are never loaded.
template <Store KS, Store D>
__global__ void __launch_bounds__(kDecodeThreads, 2) decode_kernel(DecodeArgs a) {
  using KB = Bits<KS>;
  using DB = Bits<D>;
  __shared__ float q_s[kRowsPerBlock][kMaxRank], qr_s[kRowsPerBlock][kMaxRope];
  __shared__ float lg_s[kRowsPerBlock][kPage], p_s[kRowsPerBlock][kPage];
  __shared__ float al_s[kRowsPerBlock], aq_s[kRowsPerBlock];
  __shared__ int row_s[kRowsPerBlock];
  __shared__ RowState st_s[kRowsPerBlock];
  QK_SHARED(q_s), QK_SHARED(qr_s), QK_SHARED(lg_s), QK_SHARED(p_s), QK_SHARED(al_s);
  QK_SHARED(aq_s), QK_SHARED(row_s), QK_SHARED(st_s);
  const Dims& d = a.d;
  const int blk = blockIdx.x, s = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;  // decode_grid
  const int lane = tid & 31, warp = tid >> 5, R = d.S_q * d.H;
  const int T = a.seqlens[b], pages = (T + kPage - 1) / kPage;
  const int p0 = s * a.pages_per_split, p1 = min(p0 + a.pages_per_split, pages);
  if (p0 >= p1) return;
  const int kg = a.row_group[blk];
  const auto* q = static_cast<const typename DB::T*>(a.q);
  const auto* qrope = static_cast<const typename DB::T*>(a.q_rope);
  if (tid < kRowsPerBlock) {
    row_s[tid] = a.rows[blk * kRowsPerBlock + tid];
    st_s[tid] = row_start();
    aq_s[tid] = row_s[tid] >= 0 ? a.alpha_q[size_t(b) * R + row_s[tid]] : 0.0f;
  }
  __syncthreads();
  for (int k = 0; k < kRowsPerBlock; ++k) {
    const size_t br = size_t(b) * R + size_t(row_s[k] < 0 ? 0 : row_s[k]);
    for (int j = tid; j < a.n_k; j += kDecodeThreads)
      q_s[k][j] = row_s[k] >= 0 ? DB::ld(q[br * a.n_k + j]) : 0.0f;
    for (int j = tid; j < d.d_r; j += kDecodeThreads)
      qr_s[k][j] = row_s[k] >= 0 ? DB::ld(qrope[br * d.d_r + j]) : 0.0f;
  }
  __syncthreads();
  const auto* kc = static_cast<const typename KB::T*>(a.k);
  const auto* vc = static_cast<const typename KB::T*>(a.v);
  const auto* kr = static_cast<const typename DB::T*>(a.rope);
  float acc[kRowsPerBlock][kValueCols];
#pragma unroll
  for (int k = 0; k < kRowsPerBlock; ++k)
#pragma unroll
    for (int c = 0; c < kValueCols; ++c) acc[k][c] = 0.0f;
  for (int page = p0; page < p1; ++page) {
    const size_t base = size_t(a.block_table[size_t(b) * a.max_pages + page]) * kPage;
    const int t0 = page * kPage, n = min(kPage, T - t0);
    // K.4 scores, kTokensPerPass tokens per warp pass: each query element loaded from shared memory
    // serves all of them, and each token's lane chain is lane_partial's (lane_partials), so every
    // logit keeps its bits. nt is uniform over the warp, as the shuffles in warp_tree need.
    for (int t1 = warp * kTokensPerPass; t1 < n; t1 += kTokensPerPass * (kDecodeThreads / 32)) {
      const int nt = min(kTokensPerPass, n - t1);
      float kreg[kTokensPerPass][kMaxRank / 32], rreg[kTokensPerPass][kMaxRope / 32];
#pragma unroll
      for (int u = 0; u < kTokensPerPass; ++u) {
        const size_t slot = base + size_t(t1 + (u < nt ? u : 0));  // past the page: never used
        const auto* krow = kc + (slot * a.kgroups + kg) * a.n_k;
#pragma unroll
        for (int m = 0; m < kMaxRank / 32; ++m)
          kreg[u][m] = lane + 32 * m < a.n_k ? KB::ld(krow[lane + 32 * m]) : 0.0f;
#pragma unroll
        for (int m = 0; m < kMaxRope / 32; ++m)
          rreg[u][m] = lane + 32 * m < d.d_r ? DB::ld(kr[slot * d.d_r + lane + 32 * m]) : 0.0f;
      }
      for (int k = 0; k < kRowsPerBlock; ++k) {
        const int row = row_s[k];
        if (row < 0) continue;
        float lp[kTokensPerPass], rp[kTokensPerPass];
        lane_partials<kMaxRank / 32>([&](int j) { return q_s[k][j]; },
                                     [&](int u, int m) { return kreg[u][m]; }, a.n_k, lane, lp);
        lane_partials<kMaxRope / 32>([&](int j) { return qr_s[k][j]; },
                                     [&](int u, int m) { return rreg[u][m]; }, d.d_r, lane, rp);
#pragma unroll
        for (int u = 0; u < kTokensPerPass; ++u) {
          if (u >= nt) continue;
          const int tt = t1 + u;
          const size_t slot = base + size_t(tt);
          float lat = warp_tree(lp[u]);
          if (a.kscale) lat = mul_rn(lat, a.kscale[slot]);
          const float rope = warp_tree(rp[u]);
          if (lane == 0) {  // the logit pass below forms the logit
            p_s[k][tt] = lat;
            lg_s[k][tt] = rope;
          }
        }
      }
    }
    __syncthreads();
    // The tile's logits, one (row, token) per thread: the same logit() of the same values, off the
    // score loop's single lane (and its registers). Each thread reads and writes only its element.
    for (int e = tid; e < kRowsPerBlock * n; e += kDecodeThreads) {
      const int k = e / n, tt = e % n, row = row_s[k];
      if (row < 0) continue;
      const int i = row / d.H, h = row % d.H;
      const size_t slot = base + size_t(tt);
      const bool visible = token_visible(d.causal, T, d.S_q, i, t0 + tt);
      const float ak = a.qk_norm ? a.alpha_k[slot * d.G + d.group_of(h)] : 1.0f;
      lg_s[k][tt] = visible ? logit(d, a.qk_norm, aq_s[k], ak, p_s[k][tt], lg_s[k][tt]) : -qk_inf();
    }
    __syncthreads();
    // K.5 online softmax, a warp per row: the tile max by butterfly (tile_max is order-free), the
    // exponentials by the lanes (two tokens each), and the sum by lane 0 in token order, so every
    // row's state gets softmax_tile's bits. fp8 scales p after the sum (the value path reads
    // codes).
    for (int k = warp; k < kRowsPerBlock; k += kDecodeThreads / 32) {
      if (row_s[k] < 0) continue;  // uniform over the warp
      const float x0 = lane < n ? lg_s[k][lane] : -qk_inf();
      const float x1 = lane + 32 < n ? lg_s[k][lane + 32] : -qk_inf();
      const float m_new = tile_m_new(st_s[k], warp_max(tile_max(tile_max(-qk_inf(), x0), x1)));
      const float p0 = tile_p(x0, m_new), p1 = tile_p(x1, m_new);
      if (lane < n) p_s[k][lane] = p0;
      if (lane + 32 < n) p_s[k][lane + 32] = p1;
      __syncwarp();
      if (lane == 0) {
        float sum = 0.0f;
        for (int tt = 0; tt < n; ++tt) sum += p_s[k][tt];
        al_s[k] = tile_finish(st_s[k], m_new, sum);
      }
      __syncwarp();
      if (a.kscale) {
        if (lane < n) p_s[k][lane] = mul_rn(p0, a.kscale[base + lane]);
        if (lane + 32 < n) p_s[k][lane + 32] = mul_rn(p1, a.kscale[base + lane + 32]);
      }
    }
    __syncthreads();
    // K.6 value accumulation, tokens outer and rows inner: each value element is loaded once per
    // token (not once per row) and every row keeps its own tile sum s[k][c], so each row's sum is
    // accumulate_tile's: sequential fmaf over the tile's tokens, then fmaf(acc, alpha, s).
    float s[kRowsPerBlock][kValueCols];
#pragma unroll
    for (int k = 0; k < kRowsPerBlock; ++k)
#pragma unroll
      for (int c = 0; c < kValueCols; ++c) s[k][c] = 0.0f;
    for (int tt = 0; tt < n; ++tt) {
      float v[kValueCols];
#pragma unroll
      for (int c = 0; c < kValueCols; ++c) {
        const int j = tid + c * kDecodeThreads;
        v[c] = j < a.n_v ? KB::ld(vc[((base + tt) * a.kgroups + kg) * a.n_v + j]) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kRowsPerBlock; ++k) {
        const float p = row_s[k] >= 0 ? p_s[k][tt] : 0.0f;  // one broadcast load per row
#pragma unroll
        for (int c = 0; c < kValueCols; ++c) s[k][c] = fmaf(p, v[c], s[k][c]);
      }
    }
#pragma unroll
    for (int k = 0; k < kRowsPerBlock; ++k)
#pragma unroll
      for (int c = 0; c < kValueCols; ++c)
        if (row_s[k] >= 0 && tid + c * kDecodeThreads < a.n_v)
          acc[k][c] = fmaf(acc[k][c], al_s[k], s[k][c]);
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < kRowsPerBlock; ++k) {
    if (row_s[k] < 0) continue;
    const size_t sr = (size_t(b) * R + row_s[k]) * a.max_splits + s;
    if (tid == 0) a.lse_part[sr] = split_lse(st_s[k]);
#pragma unroll
    for (int c = 0; c < kValueCols; ++c) {
      const int j = tid + c * kDecodeThreads;
      if (j < a.n_v) a.o_part[sr * a.n_v + j] = split_out(st_s[k], acc[k][c]);
    }
  }
}

// ---------------------------------------------------------------- K.7: combine
struct CombineArgs {
  int R, n_v, pages_per_split, max_splits;
  const int* seqlens;
  const float *o_part, *lse_part;
  float *latent, *lse;  // [B, R, n_v] fp32, [B, R]
};

// One block per (sequence, row); every thread recomputes the row's lse (the same value) and
// combines its columns.
template <class = void>  // a template, so that every .cu including this header may instantiate it
__global__ void combine_kernel(CombineArgs a) {
  const int br = blockIdx.x, b = br / a.R;
  const int T = a.seqlens[b], pages = (T + kPage - 1) / kPage;
  const int ns = (pages + a.pages_per_split - 1) / a.pages_per_split;
  const float* ls = a.lse_part + size_t(br) * a.max_splits;
  const float lse = combine_lse(ls, ns);
  if (threadIdx.x == 0) a.lse[br] = lse;
  for (int j = threadIdx.x; j < a.n_v; j += blockDim.x)
    a.latent[size_t(br) * a.n_v + j] = combine_element(
        ls, ns, lse, [&](int s) { return a.o_part[(size_t(br) * a.max_splits + s) * a.n_v + j]; });
}

// ---------------------------------------------------------------- value up-projection
struct UpArgs {
  Dims d;
  bool explicit_form;
  const float* latent;  // [B, R, n_v] fp32 from combine
  const void* w_uv;     // [r, G*d_v] stored
  void* out;            // [B, R, d_v] stored
};

// latent_out is rounded to the stored format (what a bf16 GEMM would read), then projected:
// one project() sum per output element. The explicit form's combined output is `out` itself.
template <Store D>
__global__ void upproj_kernel(UpArgs a) {
  using DB = Bits<D>;
  __shared__ float lat[kMaxRank];
  QK_SHARED(lat);
  const Dims& d = a.d;
  const int br = blockIdx.x, R = d.S_q * d.H, g = d.group_of((br % R) % d.H);
  auto* out = static_cast<typename DB::T*>(a.out);
  if (a.explicit_form) {
    for (int j = threadIdx.x; j < d.d_v; j += blockDim.x)
      out[size_t(br) * d.d_v + j] = DB::enc(a.latent[size_t(br) * d.d_v + j]);
    return;
  }
  for (int l = threadIdx.x; l < d.r; l += blockDim.x)
    lat[l] = round_store(D, a.latent[size_t(br) * d.r + l]);
  __syncthreads();
  const auto* wv = static_cast<const typename DB::T*>(a.w_uv);
  const size_t ld = size_t(d.G) * d.d_v;
  for (int j = threadIdx.x; j < d.d_v; j += blockDim.x)
    out[size_t(br) * d.d_v + j] = DB::enc(project(
        lat, d.r, [&](int l) { return DB::ld(wv[size_t(l) * ld + size_t(g) * d.d_v + j]); }));
}

}  // namespace qkmla::gpu
