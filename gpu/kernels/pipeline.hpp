// The decode pipeline (query, append, decode, combine, up-projection) as one launch sequence over a
// memory-and-launch backend: device_pipeline.cu runs it on a CUDA device (DeviceBackend), and
// emulated_pipeline.cpp on the CPU emulator (HostBackend), so both run the same buffers, the same
// launch shapes and the same kernel arguments. C++17; included after kernels.cuh.
//
// A backend B provides: B::Buf (get<T>(): the pointer, null for 0 bytes); Buf alloc(bytes);
// Buf upload(const std::vector<T>&); std::vector<T> download(const Buf&, n);
// launch(kernel, dim3 grid, unsigned threads, args); synchronize() (waits for every launch and
// names a failed one); timer_start(); double timer_stop_ms(); std::string describe().
#pragma once
#include <algorithm>
#include <vector>

#include "gpu/kernels/plan.hpp"
#include "gpu/qkmla_gpu.hpp"

namespace qkmla::gpu {

// fp32 values as the bits of format S (exact: each value is representable in S).
template <Store S, class B>
typename B::Buf upload_as(B& be, const std::vector<float>& h) {
  std::vector<typename Bits<S>::T> bits(h.size());
  for (size_t i = 0; i < h.size(); ++i) bits[i] = Bits<S>::enc(h[i]);
  return be.upload(bits);
}

// n elements of format S filled with NaN (e4m3 has a NaN code as well): padding that must never
// reach an output.
template <Store S, class B>
typename B::Buf nan_buffer(B& be, size_t n) {
  return upload_as<S>(be, std::vector<float>(n, qk_nan()));
}

template <Store S, class B>
std::vector<float> download_as(B& be, const typename B::Buf& d, size_t n) {
  const auto bits = be.template download<typename Bits<S>::T>(d, n);
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = Bits<S>::ld(bits[i]);
  return h;
}

template <Store D, Store C, class B>
GpuOutputs run_pipeline(B& be, const GpuCase& c, const RunOptions& o) {
  using Buf = typename B::Buf;
  const Dims& d = c.d;
  const bool ex = o.explicit_form;
  check_dims(d, ex);
  const Paging pg = make_paging(c.seqlens);
  const RowBlocks rb = make_row_blocks(d, ex);
  const SplitPlan plan = make_plan(c.seqlens, rb.count, o.sm_count, o.pages_per_split);
  const int R = d.S_q * d.H, n_k = ex ? d.d_c : d.r, n_v = ex ? d.d_v : d.r;
  const size_t BR = size_t(d.B) * R, slots = size_t(std::max(pg.num_pages, 1)) * kPage;
  const size_t splits = size_t(std::max(plan.max_splits, 1));
  const Buf seq = be.upload(c.seqlens), bt = be.upload(pg.block_table), rows = be.upload(rb.rows),
            rgroup = be.upload(rb.group);
  const Buf q_nope = be.upload(c.q_nope), q_pe = be.upload(c.q_pe), g_q = be.upload(c.g_q),
            g_k = be.upload(c.g_k), g_rq = be.upload(c.g_rq), g_rk = be.upload(c.g_rk),
            cs = be.upload(c.rope_cos), sn = be.upload(c.rope_sin), k_pe = be.upload(c.k_pe),
            kv_scale = be.upload(c.kv_c_scale);
  const Buf w_uk = upload_as<D>(be, c.w_uk), w_uv = upload_as<D>(be, c.w_uv),
            kv = upload_as<C>(be, c.kv_c);
  Buf q = be.alloc(BR * n_k * sizeof(typename Bits<D>::T)),
      qrope = be.alloc(BR * d.d_r * sizeof(typename Bits<D>::T) + 4), alpha_q = be.alloc(BR * 4);
  Buf kcache = ex ? nan_buffer<D>(be, slots * d.G * d.d_c) : nan_buffer<C>(be, slots * d.r);
  Buf vcache = ex ? nan_buffer<D>(be, slots * d.G * d.d_v) : be.alloc(0);
  Buf kscale =
      !ex && C == Store::E4M3 ? be.upload(std::vector<float>(slots, qk_nan())) : be.alloc(0);
  Buf rope = nan_buffer<D>(be, slots * d.d_r + 1),
      alpha_k = be.upload(std::vector<float>(slots * d.G, qk_nan()));
  Buf o_part = be.alloc(BR * splits * n_v * 4), lse_part = be.alloc(BR * splits * 4),
      latent = be.alloc(BR * n_v * 4), lse = be.alloc(BR * 4),
      out = be.alloc(BR * d.d_v * sizeof(typename Bits<D>::T));

  be.launch(
      query_kernel<D>, dim3(unsigned(BR)), 128,
      QueryArgs{d, ex, seq.template get<int>(), q_nope.template get<float>(),
                q_pe.template get<float>(), g_q.template get<float>(), g_k.template get<float>(),
                g_rq.template get<float>(), cs.template get<float>(), sn.template get<float>(),
                w_uk.get(), q.get(), qrope.get(), alpha_q.template get<float>()});
  // A grid with a zero dimension is an invalid launch: with no token in any sequence there is
  // nothing to append (and every row is empty).
  if (d.t_max > 0 && d.B > 0)
    be.launch(
        append_kernel<D, C>, dim3(unsigned(d.t_max), unsigned(d.B)), 256,
        AppendArgs{d, ex, seq.template get<int>(), bt.template get<int>(), pg.max_pages, kv.get(),
                   kv_scale.template get<float>(), k_pe.template get<float>(),
                   g_k.template get<float>(), g_rk.template get<float>(), cs.template get<float>(),
                   sn.template get<float>(), w_uk.get(), w_uv.get(), kcache.get(), vcache.get(),
                   rope.get(), kscale.template get<float>(), alpha_k.template get<float>()});
  be.timer_start();
  if (plan.max_splits > 0) {
    const DecodeArgs da{d,
                        o.qk_norm && !ex,
                        n_k,
                        n_v,
                        ex ? d.G : 1,
                        plan.pages_per_split,
                        plan.max_splits,
                        pg.max_pages,
                        seq.template get<int>(),
                        bt.template get<int>(),
                        rows.template get<int>(),
                        rgroup.template get<int>(),
                        q.get(),
                        qrope.get(),
                        alpha_q.template get<float>(),
                        kcache.get(),
                        ex ? vcache.get() : kcache.get(),
                        kscale.template get<float>(),
                        rope.get(),
                        alpha_k.template get<float>(),
                        o_part.template get<float>(),
                        lse_part.template get<float>()};
    const dim3 grid = decode_grid(d.B, plan.max_splits, rb.count);
    if (ex)
      be.launch(decode_kernel<D, D>, grid, kDecodeThreads, da);
    else
      be.launch(decode_kernel<C, D>, grid, kDecodeThreads, da);
  }
  be.launch(combine_kernel<>, dim3(unsigned(BR)), 128,
            CombineArgs{R, n_v, plan.pages_per_split, int(splits), seq.template get<int>(),
                        o_part.template get<float>(), lse_part.template get<float>(),
                        latent.template get<float>(), lse.template get<float>()});
  const double ms = be.timer_stop_ms();
  be.launch(upproj_kernel<D>, dim3(unsigned(BR)), 128,
            UpArgs{d, ex, latent.template get<float>(), w_uv.get(), out.get()});
  be.synchronize();

  GpuOutputs r;
  r.device = be.describe();
  r.decode_ms = ms;
  r.pages_per_split = plan.pages_per_split;
  r.max_splits = plan.max_splits;
  r.out = download_as<D>(be, out, BR * d.d_v);
  r.lse = be.template download<float>(lse, BR);
  r.alpha_q = be.template download<float>(alpha_q, BR);
  if (!ex) {
    r.latent_out = be.template download<float>(latent, BR * d.r);
    for (float& x : r.latent_out) x = round_store(D, x);
  }
  r.alpha_k = dense_from_paged(pg, c.seqlens, be.template download<float>(alpha_k, slots * d.G),
                               d.t_max, d.G);
  return r;
}

// The pipeline instantiated for the case's cache format.
template <class B>
GpuOutputs run_pipeline_for(B& be, const GpuCase& c, const RunOptions& o) {
  switch (c.d.cache) {
    case Store::F32:
      return run_pipeline<Store::F32, Store::F32>(be, c, o);
    case Store::F16:
      return run_pipeline<Store::F16, Store::F16>(be, c, o);
    case Store::E4M3:
      return run_pipeline<Store::BF16, Store::E4M3>(be, c, o);
    default:
      return run_pipeline<Store::BF16, Store::BF16>(be, c, o);
  }
}

}  // namespace qkmla::gpu
