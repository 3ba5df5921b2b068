// ref.kernel: the kernel-level reference (SPEC §2), computed at the current precision from the
// already-rounded kernel inputs, so that an audit measures a kernel's own error (steps A.4-A.5).
#include <chrono>

#include "mp_matmul.hpp"
#include "ref_common.hpp"
#include "reference.hpp"

namespace qkmla::ref {

Outputs ref_kernel(const Case& k) {
  const auto start = std::chrono::steady_clock::now();
  const MlaConfig& c = k.cfg;
  const int H = c.heads, S = c.s_q, G = c.groups, dr = c.d_r, r = c.latent_rank;
  const int64_t T_max = k.t_max();
  const Mp scale = c.softmax_scale;
  const bool unified = c.norm == NormMode::Unified;
  const Tensor &ql = k.get("q_latent"), &aq = k.get("alpha_q"), &qr = k.get("q_rope"), &kv = k.latent(),
               &kr = k.get("k_rope"), &ak = k.get("alpha_k");
  Outputs o;
  o.impl = "ref.kernel";
  init_outputs(o, k, {"latent_out", "lse"});
  for (int b = 0; b < c.batch; ++b) {
    const int64_t T = c.seqlens[size_t(b)];
    std::vector<MpVec> rows;  // q_latent rows of this sequence [S*H][r] (exact)
    for (int i = 0; i < S; ++i)
      for (int h = 0; h < H; ++h) rows.push_back(to_mp(&ql.data[size_t(ql.index({b, i, h, 0}))], r));
    std::vector<double> c_t(size_t(r * T));  // c^T [r, T]
    for (int64_t t = 0; t < T; ++t)
      for (int l = 0; l < r; ++l) c_t[size_t(l * T + t)] = kv.at({b, t, l});
    const std::vector<MpVec> latent = mp_times_doubles(rows, r, c_t.data(), T, T);  // A.4, exact sums
    std::vector<MpVec> probs(rows.size(), MpVec(size_t(T), Mp(0)));
    for (size_t row = 0; row < rows.size(); ++row) {
      const int i = int(row) / H, h = int(row) % H, g = c.group_of(h);
      const MpVec q_rope = to_mp(&qr.data[size_t(qr.index({b, i, h, 0}))], dr);
      const Mp alpha_q = aq.at({b, i, h});
      MpVec logits;
      for (int64_t t = 0; t < T; ++t) {
        if (!k.causal_visible(b, i, t)) continue;
        const Mp rope = dot(q_rope, to_mp(&kr.data[size_t(kr.index({b, t, 0}))], dr));
        const Mp s = alpha_q * Mp(ak.at({b, t, g}));
        logits.push_back(unified ? Mp(scale * s * (latent[row][size_t(t)] + rope))
                                 : Mp(scale * (s * latent[row][size_t(t)] + rope)));
      }
      Mp lse;
      MpVec p;
      softmax(logits, lse, p);
      store(o, "lse", int64_t(b * S * H) + int64_t(row), lse);
      size_t n = 0;
      for (int64_t t = 0; t < T; ++t)
        if (k.causal_visible(b, i, t)) probs[row][size_t(t)] = p[n++];
    }
    Mp tmp;
    MpVec ct(static_cast<size_t>(r));
    std::vector<MpVec> lat(rows.size(), MpVec(static_cast<size_t>(r), Mp(0)));  // A.5
    for (int64_t t = 0; t < T; ++t) {
      for (int l = 0; l < r; ++l) ct[size_t(l)] = kv.at({b, t, l});
      for (size_t row = 0; row < rows.size(); ++row)
        if (k.causal_visible(b, int(row) / H, t))
          for (int l = 0; l < r; ++l) mac(lat[row][size_t(l)], probs[row][size_t(t)], ct[size_t(l)], tmp);
    }
    for (size_t row = 0; row < rows.size(); ++row)
      for (int l = 0; l < r; ++l) store(o, "latent_out", (int64_t(b * S * H) + int64_t(row)) * r + l, lat[row][size_t(l)]);
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

}  // namespace qkmla::ref
