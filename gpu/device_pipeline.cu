// run_on_device: the pipeline on device 0 (query, append, decode, combine, up-projection).
#include "device_util.cuh"
#include "plan.hpp"
#include "qkmla_gpu.hpp"

namespace qkmla::gpu {

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why)
      *why = e != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(e) + ")"
                              : "no CUDA device";
    return false;
  }
  return true;
}

int device_sm_count() {
  if (!device_available(nullptr)) return 0;
  cudaDeviceProp p{};
  QK_CUDA(cudaGetDeviceProperties(&p, 0));
  return p.multiProcessorCount;
}

#define QK_STR2(...) #__VA_ARGS__
#define QK_STR(...) QK_STR2(__VA_ARGS__)
std::string compiled_arch_list() { return QK_STR(__CUDA_ARCH_LIST__); }

std::string device_description() {
  if (!device_available(nullptr)) return "";
  cudaDeviceProp p{};
  QK_CUDA(cudaGetDeviceProperties(&p, 0));
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, driver " + std::to_string(drv / 1000) +
         "." + std::to_string(drv % 1000 / 10) + ", runtime " + std::to_string(rt / 1000) + "." +
         std::to_string(rt % 1000 / 10);
}

namespace {

template <Store D, Store C>
GpuOutputs pipeline(const GpuCase& c, const RunOptions& o) {
  const Dims& d = c.d;
  const bool ex = o.explicit_form;
  check_dims(d, ex);
  const Paging pg = make_paging(c.seqlens);
  const RowBlocks rb = make_row_blocks(d, ex);
  const SplitPlan plan = make_plan(c.seqlens, rb.count, o.sm_count, o.pages_per_split);
  const int R = d.S_q * d.H, n_k = ex ? d.d_c : d.r, n_v = ex ? d.d_v : d.r;
  const size_t BR = size_t(d.B) * R, slots = size_t(std::max(pg.num_pages, 1)) * kPage;
  const size_t splits = size_t(std::max(plan.max_splits, 1));
  const DevBuf seq = upload(c.seqlens), bt = upload(pg.block_table), rows = upload(rb.rows),
               rgroup = upload(rb.group);
  const DevBuf q_nope = upload(c.q_nope), q_pe = upload(c.q_pe), g_q = upload(c.g_q),
               g_k = upload(c.g_k), g_rq = upload(c.g_rq), g_rk = upload(c.g_rk),
               cs = upload(c.rope_cos), sn = upload(c.rope_sin), k_pe = upload(c.k_pe),
               kv_scale = upload(c.kv_c_scale);
  const DevBuf w_uk = upload_as<D>(c.w_uk), w_uv = upload_as<D>(c.w_uv), kv = upload_as<C>(c.kv_c);
  DevBuf q(BR * n_k * sizeof(typename Bits<D>::T)),
      qrope(BR * d.d_r * sizeof(typename Bits<D>::T) + 4), alpha_q(BR * 4);
  DevBuf kcache = ex ? nan_buffer<D>(slots * d.G * d.d_c) : nan_buffer<C>(slots * d.r);
  DevBuf vcache = ex ? nan_buffer<D>(slots * d.G * d.d_v) : DevBuf();
  DevBuf kscale = !ex && C == Store::E4M3 ? upload(std::vector<float>(slots, qk_nan())) : DevBuf();
  DevBuf rope = nan_buffer<D>(slots * d.d_r + 1),
         alpha_k = upload(std::vector<float>(slots * d.G, qk_nan()));
  DevBuf o_part(BR * splits * n_v * 4), lse_part(BR * splits * 4), latent(BR * n_v * 4),
      lse(BR * 4), out(BR * d.d_v * sizeof(typename Bits<D>::T));

  query_kernel<D><<<unsigned(BR), 128>>>(
      QueryArgs{d, ex, seq.get<int>(), q_nope.get<float>(), q_pe.get<float>(), g_q.get<float>(),
                g_k.get<float>(), g_rq.get<float>(), cs.get<float>(), sn.get<float>(), w_uk.get(),
                q.get(), qrope.get(), alpha_q.get<float>()});
  QK_CUDA(cudaGetLastError());
  // A grid with a zero dimension is an invalid launch: with no token in any sequence there is
  // nothing to append (and every row is empty).
  if (d.t_max > 0 && d.B > 0)
    append_kernel<D, C><<<dim3(unsigned(d.t_max), unsigned(d.B)), 256>>>(
        AppendArgs{d, ex, seq.get<int>(), bt.get<int>(), pg.max_pages, kv.get(),
                   kv_scale.get<float>(), k_pe.get<float>(), g_k.get<float>(), g_rk.get<float>(),
                   cs.get<float>(), sn.get<float>(), w_uk.get(), w_uv.get(), kcache.get(),
                   vcache.get(), rope.get(), kscale.get<float>(), alpha_k.get<float>()});
  QK_CUDA(cudaGetLastError());
  EventTimer timer;
  timer.start();
  if (plan.max_splits > 0) {
    const DecodeArgs da{d,
                        o.qk_norm && !ex,
                        n_k,
                        n_v,
                        ex ? d.G : 1,
                        plan.pages_per_split,
                        plan.max_splits,
                        pg.max_pages,
                        seq.get<int>(),
                        bt.get<int>(),
                        rows.get<int>(),
                        rgroup.get<int>(),
                        q.get(),
                        qrope.get(),
                        alpha_q.get<float>(),
                        kcache.get(),
                        ex ? vcache.get() : kcache.get(),
                        kscale.get<float>(),
                        rope.get(),
                        alpha_k.get<float>(),
                        o_part.get<float>(),
                        lse_part.get<float>()};
    const dim3 grid(unsigned(d.B), unsigned(plan.max_splits), unsigned(rb.count));
    if (ex)
      decode_kernel<D, D><<<grid, kDecodeThreads>>>(da);
    else
      decode_kernel<C, D><<<grid, kDecodeThreads>>>(da);
    QK_CUDA(cudaGetLastError());
  }
  combine_kernel<><<<unsigned(BR), 128>>>(
      CombineArgs{R, n_v, plan.pages_per_split, int(splits), seq.get<int>(), o_part.get<float>(),
                  lse_part.get<float>(), latent.get<float>(), lse.get<float>()});
  QK_CUDA(cudaGetLastError());
  timer.stop();
  upproj_kernel<D>
      <<<unsigned(BR), 128>>>(UpArgs{d, ex, latent.get<float>(), w_uv.get(), out.get()});
  QK_CUDA(cudaGetLastError());
  QK_CUDA(cudaDeviceSynchronize());
  const float ms = timer.ms();

  GpuOutputs r;
  r.device = device_description();
  r.decode_ms = ms;
  r.pages_per_split = plan.pages_per_split;
  r.max_splits = plan.max_splits;
  r.out = download_as<D>(out, BR * d.d_v);
  r.lse = download<float>(lse, BR);
  r.alpha_q = download<float>(alpha_q, BR);
  if (!ex) {
    r.latent_out = download<float>(latent, BR * d.r);
    for (float& x : r.latent_out) x = round_store(D, x);
  }
  r.alpha_k = dense_from_paged(pg, c.seqlens, download<float>(alpha_k, slots * d.G), d.t_max, d.G);
  return r;
}

}  // namespace

GpuOutputs run_on_device(const GpuCase& c, const RunOptions& o) {
  std::string why;
  if (!device_available(&why)) throw std::runtime_error(why);
  QK_CUDA(cudaSetDevice(0));
  switch (c.d.cache) {
    case Store::F32:
      return pipeline<Store::F32, Store::F32>(c, o);
    case Store::F16:
      return pipeline<Store::F16, Store::F16>(c, o);
    case Store::E4M3:
      return pipeline<Store::BF16, Store::E4M3>(c, o);
    default:
      return pipeline<Store::BF16, Store::BF16>(c, o);
  }
}

}  // namespace qkmla::gpu
