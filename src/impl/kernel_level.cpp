#include "impl/kernel_level.hpp"

#include <chrono>

#include "impl/profile_math.hpp"

namespace qkmla::impl {

namespace {
template <class Acc>
Outputs run(const Case& k) {
  const MlaConfig& cf = k.cfg;
  const DType D = stored_dtype(cf.profile), A = accumulate_dtype(cf.profile);
  const int H = cf.heads, S = cf.s_q, G = cf.groups, dr = cf.d_r, r = cf.latent_rank;
  const Acc scale = Acc(cf.softmax_scale);
  const bool unified = cf.norm == NormMode::Unified;
  const std::vector<Acc> ql = to_acc<Acc>(k.get("q_latent")), aq = to_acc<Acc>(k.get("alpha_q")),
                         qr = to_acc<Acc>(k.get("q_rope")),
                         kr = to_acc<Acc>(k.get("k_rope")), ak = to_acc<Acc>(k.get("alpha_k"));
  const int64_t T_max = k.t_max();
  std::vector<Acc> kv;  // [B, T_max, r]
  for (int b = 0; b < cf.batch; ++b) {
    const std::vector<Acc> rows = latent_rows<Acc>(k, b, T_max);
    kv.insert(kv.end(), rows.begin(), rows.end());
  }
  Outputs o;
  o.impl = "cpu.kernel." + to_string(cf.profile);
  Tensor& lat = o.tensors["latent_out"] = make_output(k, "latent_out", D, 0.0);
  Tensor& lse = o.tensors["lse"] = make_output(k, "lse", A, 0.0);
  for (int b = 0; b < cf.batch; ++b)
    for (int i = 0; i < S; ++i)
      for (int h = 0; h < H; ++h) {
        const int64_t row = (int64_t(b) * S + i) * H + h;
        const int g = cf.group_of(h);
        std::vector<Acc> p;
        std::vector<int64_t> ts;
        for (int64_t t = 0; t < cf.seqlens[size_t(b)]; ++t) {
          if (!k.causal_visible(b, i, t)) continue;
          const int64_t bt = int64_t(b) * T_max + t;
          const Acc latent = dot(&ql[size_t(row * r)], &kv[size_t(bt * r)], r);
          const Acc rope = dot(&qr[size_t(row * dr)], &kr[size_t(bt * dr)], dr);
          const Acc s = aq[size_t(row)] * ak[size_t(bt * G + g)];
          p.push_back(unified ? scale * (s * (latent + rope)) : scale * (s * latent + rope));
          ts.push_back(t);
        }
        lse[row] = double(softmax(p));
        std::vector<Acc> acc(size_t(r), Acc(0));
        for (size_t n = 0; n < ts.size(); ++n)
          for (int l = 0; l < r; ++l) acc[size_t(l)] += p[n] * kv[size_t((int64_t(b) * T_max + ts[n]) * r + l)];
        for (int l = 0; l < r; ++l) lat[row * r + l] = double(store(D, acc[size_t(l)]));
      }
  return o;
}
}  // namespace

Outputs cpu_kernel(const Case& k) {
  const auto start = std::chrono::steady_clock::now();
  Outputs o = accumulate_dtype(k.cfg.profile) == DType::F64 ? run<double>(k) : run<float>(k);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

}  // namespace qkmla::impl
