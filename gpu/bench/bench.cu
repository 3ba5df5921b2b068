// run_bench: the paper's decode table (conventions §12) on the device: the absorbed decode +
// combine with the alpha_q * alpha_k scaling (QK-norm) and with it disabled (plain MLA), same
// kernel, same data.
#include <algorithm>

#include "gpu/bench/bench_sweep.hpp"
#include "gpu/kernels/device_util.cuh"
#include "gpu/kernels/plan.hpp"
#include "gpu/qkmla_gpu.hpp"

namespace qkmla::gpu {

namespace {

// Deterministic pseudo-random fill: value = lo + (hi - lo) * hash(i) / 2^32, stored in format S.
template <Store S>
__global__ void fill_kernel(typename Bits<S>::T* p, size_t n, float lo, float hi, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    p[i] = Bits<S>::enc(add_rn(lo, mul_rn(hi - lo, mul_rn(float(h), 2.3283064365386963e-10f))));
  }
}

template <Store S>
DevBuf random_buffer(size_t n, float lo, float hi, uint32_t seed) {
  DevBuf d(n * sizeof(typename Bits<S>::T));
  fill_kernel<S><<<1024, 256>>>(d.get<typename Bits<S>::T>(), n, lo, hi, seed);
  QK_CUDA(cudaGetLastError());
  return d;
}

// Reads the flush buffer after it was written (memset): L2 is then full of clean lines of it, so
// no dirty line is written back inside the timed region. The sum is stored only if impossible.
__global__ void l2_read_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    acc ^= p[i].x ^ p[i].y ^ p[i].z ^ p[i].w;
  if (acc == 0x9e3779b9u) *sink = acc;
}

void flush_l2(const DevBuf& buf, int rep) {
  QK_CUDA(cudaMemset(buf.get(), rep & 0xff, buf.bytes()));
  l2_read_kernel<<<1024, 256>>>(buf.get<uint4>(), buf.bytes() / 16 - 1,
                                buf.get<unsigned>() + buf.bytes() / 4 - 1);
  QK_CUDA(cudaGetLastError());
}

struct Timing {
  double median = 0, spread = 0;
};

Timing summarize(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  const auto at = [&](double q) { return double(ms[size_t(q * double(ms.size() - 1))]); };
  return {at(0.5), (at(0.9) - at(0.1)) / at(0.5)};
}

}  // namespace

BenchRow run_bench_row(const BenchOptions& bo, int ctx) {
  std::string why;
  if (!device_available(&why)) throw std::runtime_error(why);
  QK_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop{};
  QK_CUDA(cudaGetDeviceProperties(&prop, 0));
  {
    Dims d;
    d.B = bo.batch, d.S_q = 1, d.H = bo.heads, d.G = bo.groups, d.r = bo.r, d.d_c = bo.d_c,
    d.d_r = bo.d_r;
    d.d_v = bo.d_c, d.t_max = ctx, d.eps = 1e-6f, d.scale = 1.0f / sqrtf(float(bo.d_c + bo.d_r));
    d.stored = d.cache = Store::BF16;
    const std::vector<int> seqlens(size_t(d.B), ctx);
    const Paging pg = make_paging(seqlens);
    const RowBlocks rb = make_row_blocks(d, false);
    const SplitPlan plan =
        make_plan(seqlens, rb.count, prop.multiProcessorCount, bo.pages_per_split);
    const int R = d.H;
    const size_t slots = size_t(pg.num_pages) * kPage, BR = size_t(d.B) * R;
    const DevBuf seq = upload(seqlens), bt = upload(pg.block_table), rws = upload(rb.rows),
                 rgroup = upload(rb.group);
    const DevBuf kc = random_buffer<Store::BF16>(slots * d.r, -1.0f, 1.0f, 1),
                 kr = random_buffer<Store::BF16>(slots * d.d_r, -1.0f, 1.0f, 2);
    const DevBuf ak = random_buffer<Store::F32>(slots * d.G, 0.5f, 1.5f, 3),
                 aq = random_buffer<Store::F32>(BR, 0.5f, 1.5f, 4);
    const DevBuf q = random_buffer<Store::BF16>(BR * d.r, -0.1f, 0.1f, 5),
                 qr = random_buffer<Store::BF16>(BR * d.d_r, -1.0f, 1.0f, 6);
    DevBuf o_part(BR * plan.max_splits * d.r * 4), lse_part(BR * plan.max_splits * 4),
        latent(BR * d.r * 4), lse(BR * 4);
    auto step = [&](bool norm) {
      const DecodeArgs da{d,
                          norm,
                          d.r,
                          d.r,
                          1,
                          plan.pages_per_split,
                          plan.max_splits,
                          pg.max_pages,
                          seq.get<int>(),
                          bt.get<int>(),
                          rws.get<int>(),
                          rgroup.get<int>(),
                          q.get(),
                          qr.get(),
                          aq.get<float>(),
                          kc.get(),
                          kc.get(),
                          nullptr,
                          kr.get(),
                          ak.get<float>(),
                          o_part.get<float>(),
                          lse_part.get<float>()};
      decode_kernel<Store::BF16, Store::BF16>
          <<<decode_grid(d.B, plan.max_splits, rb.count), kDecodeThreads>>>(da);
      combine_kernel<><<<unsigned(BR), 128>>>(CombineArgs{
          R, d.r, plan.pages_per_split, plan.max_splits, seq.get<int>(), o_part.get<float>(),
          lse_part.get<float>(), latent.get<float>(), lse.get<float>()});
    };
    EventTimer timer;
    std::vector<float> t_norm, t_plain;
    // Written, then read, between repetitions (untimed): a buffer twice the L2 evicts the cache
    // and leaves only clean lines, so a context that fits in L2 (4k and 8k: 20-40 MB; an H200 has
    // 50 MB of L2) is still read from HBM, and no write-back falls into the timed region.
    DevBuf l2_flush(size_t(2) * size_t(std::max(prop.l2CacheSize, 1 << 20)));
    for (int rep = 0; rep < bo.warmup + bo.reps; ++rep)
      for (bool norm : {true, false}) {  // interleaved, so drift hits both alike
        flush_l2(l2_flush, rep);
        timer.start();
        step(norm);
        timer.stop();
        QK_CUDA(cudaGetLastError());
        if (rep >= bo.warmup) (norm ? t_norm : t_plain).push_back(timer.ms());
      }
    const Timing tn = summarize(t_norm), tp = summarize(t_plain);
    BenchRow row;
    row.batch = d.B, row.heads = d.H, row.groups = d.G, row.context = ctx;
    row.ms_norm = tn.median, row.spread_norm = tn.spread;
    row.ms_plain = tp.median, row.spread_plain = tp.spread;
    row.overhead_pct = 100.0 * (tn.median - tp.median) / tp.median;
    row.cache_bytes = double(d.B) * ctx * (d.r + d.d_r) * 2.0;
    row.cache_bytes_alpha = row.cache_bytes + double(d.B) * ctx * d.G * 4.0;
    row.gbs_norm = row.cache_bytes_alpha / (tn.median * 1e-3) / 1e9;
    row.hbm_fraction = row.gbs_norm / 4800.0;
    row.pages_per_split = plan.pages_per_split;
    row.splits = plan.max_splits;
    row.partial_bytes = double(BR) * plan.max_splits * (d.r + 1) * 4.0 * 2.0;
    return row;
  }
}

std::vector<BenchRow> run_bench(const BenchOptions& bo, std::string* device) {
  std::string why;
  if (!device_available(&why)) throw std::runtime_error(why);
  cudaDeviceProp prop{};
  QK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (device) *device = prop.name;
  std::vector<BenchRow> rows;
  for (int ctx : bo.contexts) rows.push_back(run_bench_row(bo, ctx));
  return rows;
}

double measure_copy_gbs(size_t bytes, int reps) {
  std::string why;
  if (!device_available(&why)) throw std::runtime_error(why);
  QK_CUDA(cudaSetDevice(0));
  DevBuf a(bytes), b(bytes);
  QK_CUDA(cudaMemset(a.get(), 1, bytes));
  EventTimer timer;
  std::vector<float> ms;
  for (int i = 0; i < reps + 2; ++i) {
    timer.start();
    QK_CUDA(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
    timer.stop();
    if (i >= 2) ms.push_back(timer.ms());  // two warm-up copies
  }
  return 2.0 * double(bytes) / (summarize(ms).median * 1e-3) / 1e9;
}

BenchBackend device_bench_backend() {
  std::string why;
  if (!device_available(&why)) throw std::runtime_error(why);
  BenchBackend be;
  be.device = device_description();
  be.copy_gbs = [] { return measure_copy_gbs(size_t(2) << 30, 10); };  // 2 GiB, far past L2
  be.row = [](const BenchOptions& o, int ctx) { return run_bench_row(o, ctx); };
  return be;
}

}  // namespace qkmla::gpu
