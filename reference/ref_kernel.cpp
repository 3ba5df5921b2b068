// ref.kernel: the kernel-level reference (conventions §2), computed at the current precision from
// the already-rounded kernel inputs, so that an audit measures a kernel's own error (steps
// A.4-A.5).
#include <chrono>

#include "reference/latent_core.hpp"
#include "reference/reference.hpp"

namespace qkmla::ref {

Outputs ref_kernel(const Case& k) {
  const auto start = std::chrono::steady_clock::now();
  const MlaConfig& c = k.cfg;
  const int H = c.heads, S = c.s_q, G = c.groups, dr = c.d_r, r = c.latent_rank;
  const bool stats = c.norm != NormMode::None;  // plain MLA: alpha_q = alpha_k = 1, no tensors
  const Tensor &ql = k.get("q_latent"), &qr = k.get("q_rope"), &kr = k.get("k_rope");
  Outputs o;
  o.id = ref_id(Form::Kernel);
  init_outputs(o, k, {"latent_out", "lse"});
  for (int b = 0; b < c.batch; ++b) {
    MpLatentRows q;  // the rows of this sequence, exact
    for (int i = 0; i < S; ++i)
      for (int h = 0; h < H; ++h) {
        q.q_latent.push_back(to_mp(ql.ptr({b, i, h, 0}), r));
        q.rope.push_back(to_mp(qr.ptr({b, i, h, 0}), dr));
        q.row_scale.push_back(stats ? Mp(k.get("alpha_q").at({b, i, h})) : Mp(1));
      }
    const CacheRows cache = [&](int64_t) -> CacheRow {  // the given rope keys and alpha_k
      return [&, b](int64_t t, MpVec& rope, MpVec& alpha_k) {
        rope = to_mp(kr.ptr({b, t, 0}), dr);
        alpha_k = stats ? to_mp(k.get("alpha_k").ptr({b, t, 0}), G) : MpVec(size_t(G), Mp(1));
      };
    };
    const MpLatentResult res = mp_latent_attend(k, b, q, cache);
    for (size_t row = 0; row < q.q_latent.size(); ++row) {
      const int64_t base = int64_t(b * S * H) + int64_t(row);
      store(o, "lse", base, res.lse[row]);
      for (int l = 0; l < r; ++l)
        store(o, "latent_out", base * r + l, res.latent_out[row][size_t(l)]);
    }
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

}  // namespace qkmla::ref
