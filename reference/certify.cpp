// certify: the checks D.1-D.7 of proofs/absorption.md on every (b, i, t, h) of a case. Explicit
// side: the conventions §1.1 formulas on materialized keys. Absorbed side: q_latent, the Gram-form
// key statistic and the caller's Perturbation through the hooks of core/perturbation.hpp.
#include "reference/certify.hpp"

#include <fmt/format.h>

#include <boost/multiprecision/gmp.hpp>
#include <cmath>

#include "core/rope.hpp"
#include "reference/exact_dot.hpp"
#include "reference/mp.hpp"

namespace qkmla::ref {

using boost::multiprecision::mpq_rational;
using boost::multiprecision::mpz_int;

namespace {

constexpr int kStatBits = 512;  // precision of the hooks' statistics and lse (see certify.hpp)

// Every value of the case is an integer multiple of 2^e0; a product of s inputs is an integer
// multiple of 2^(s*e0). Integers at a known scale add and multiply without any gcd.
struct Grid {
  int e0 = 0;
  mpz_int z(double x, int scale = 1) const {  // x / 2^(scale*e0), exact
    if (x == 0) return 0;
    int e;
    const double m = std::frexp(x, &e);  // x = m 2^e, |m| in [0.5, 1)
    int64_t mant = static_cast<int64_t>(std::ldexp(m, 53));
    const int tz = __builtin_ctzll(uint64_t(mant < 0 ? -mant : mant));
    mant /= int64_t(1) << tz;  // odd now: x = mant 2^(e - 53 + tz)
    const int shift = e - 53 + tz - scale * e0;
    if (shift < 0)
      throw std::logic_error(
          fmt::format("certify: {:a} is below the grid 2^{} (scale {})", x, scale * e0, scale));
    return mpz_int(mant) << shift;
  }
  mpq_rational q(const mpz_int& v, int scale) const {  // v * 2^(scale*e0)
    mpq_rational r(v);
    const int sh = scale * e0;
    if (sh >= 0)
      r *= mpq_rational(mpz_int(1) << sh);
    else
      r /= mpq_rational(mpz_int(1) << -sh);
    return r;
  }
};

int trailing(double x) {
  int e;
  const double m = std::frexp(std::fabs(x), &e);
  return e - 53 + __builtin_ctzll(uint64_t(std::ldexp(m, 53)));
}

std::string show(const mpq_rational& x) { return fmt::format("{:.17g}", x.convert_to<double>()); }

Mp mp_of(const mpq_rational& q) {
  Mp x;
  mpfr_set_q(x.backend().data(), q.backend().data(), MPFR_RNDN);
  return x;
}

// A statistic or lse evaluated at kStatBits, and the exact rational the checks use for it.
struct Num {
  Mp v;
  mpq_rational q() const { return mpq_rational(v.convert_to<double>()); }
};

class Certifier {
 public:
  Certifier(const Case& k, const Perturbation& p) : k_(k), c_(k.cfg), p_(p) {}
  CertifyResult run();

 private:
  const Case& k_;
  const MlaConfig& c_;
  const Perturbation& p_;
  CertifyResult res_;
  Grid grid_;
  bool lse_done_ = false;
  // Per sequence: the materialized keys and values, and alpha_k of both forms [T][G].
  std::vector<std::vector<mpq_rational>> ak_e_, ak_a_;

  void differ(const char* check, const std::string& where, const mpq_rational& a,
              const mpq_rational& b) {
    if (a == b || res_.refuted) return;
    res_.refuted = true;
    res_.first = fmt::format("{} differs at {}: explicit {} vs absorbed {} (difference {})", check,
                             where, show(a), show(b), show(a - b));
  }
  void differ(const char* check, const std::string& where, const Num& a, const Num& b) {
    const Mp d = abs(a.v - b.v), scale = std::max(Mp(abs(a.v)), Mp(1e-300));
    if (!(d > ldexp(scale, -400)) || res_.refuted) return;
    res_.refuted = true;
    res_.first = fmt::format(
        "{} differs at {}: explicit {:.17g} vs absorbed {:.17g} (difference {:.3g}, evaluated at "
        "{} bits)",
        check, where, a.v.convert_to<double>(), b.v.convert_to<double>(),
        Mp(a.v - b.v).convert_to<double>(), kStatBits);
  }
  Num stat(const Perturbation& p, const mpq_rational& ss, int n) const {
    return {hook::inv_rms(p, mp_of(ss), n, Mp(c_.eps))};
  }
  void set_grid();
  void sequence(int b);
  void key_statistics(int b, int64_t T, const ExactProduct& K0);
  std::vector<mpq_rational> rope_vec(const double* raw, const Tensor* gamma, int g0, int64_t pos,
                                     bool ntr, const Perturbation& p,
                                     const mpq_rational* unified_inv) const;
  void query_row(int b, int i, int h, const ExactProduct& K0, const ExactProduct& V);
  void lse_check(const std::vector<mpq_rational>& logits, const std::string& where, int h);
  void value_path(int b, int i, int h, const std::vector<int64_t>& visible,
                  const std::vector<double>& logits_d, const ExactProduct& V);
  mpz_int key_int(const ExactProduct& K0, int64_t t, int col) const {  // k0c at scale 2
    mpz_int s = 0;
    for (double term : K0.entry(t, col)) s += grid_.z(term, 2);
    return s;
  }
};

// The grid: the smallest lowest-set-bit exponent of every value read (the fp8 dequantized cache
// has bits of its own).
void Certifier::set_grid() {
  int e0 = 0;
  for (const auto& [name, t] : k_.tensors)
    for (double x : t.data)
      if (std::isfinite(x) && x != 0) e0 = std::min(e0, trailing(x));
  for (double x : k_.latent().data)
    if (std::isfinite(x) && x != 0) e0 = std::min(e0, trailing(x));
  grid_.e0 = e0;
}

// (b) D.5: the key sum of squares from the materialized key and from the Gram form, then alpha_k
// of each form: explicit from the materialized sum, absorbed from the Gram sum through the hooks.
void Certifier::key_statistics(int b, int64_t T, const ExactProduct& K0) {
  const int G = c_.groups, dc = c_.d_c, dr = c_.d_r, r = c_.latent_rank;
  const Tensor &kv = k_.latent(), &kpe = k_.get("k_pe"), &wk = k_.get("w_uk");
  ak_e_.assign(size_t(T), std::vector<mpq_rational>(size_t(G), mpq_rational(1)));
  ak_a_ = ak_e_;
  if (c_.norm == NormMode::None) return;               // plain MLA: alpha_k = 1 in both forms
  std::vector<double> ct(static_cast<size_t>(r * T));  // c^T [r, T]
  for (int64_t t = 0; t < T; ++t)
    for (int l = 0; l < r; ++l) ct[size_t(l * T + t)] = kv.at({b, t, l});
  for (int g = 0; g < G; ++g) {
    std::vector<double> wkt(static_cast<size_t>(dc * r));  // WK_g^T [d_c, r]
    for (int l = 0; l < r; ++l)
      for (int j = 0; j < dc; ++j) wkt[size_t(j * r + l)] = wk[int64_t(l) * G * dc + g * dc + j];
    const ExactProduct M =
        exact_matmul(&wk.data[size_t(g * dc)], G * dc, r, dc, wkt.data(), r, r);  // WK_g WK_g^T
    std::vector<mpz_int> gram(static_cast<size_t>(T), 0);  // c M c^T, scale 4
    for (int term = 0; term < M.max_terms(); ++term) {
      std::vector<double> mk(static_cast<size_t>(r * r), 0.0);
      for (int64_t x = 0; x < r; ++x)
        for (int64_t y = 0; y < r; ++y) {
          const auto e = M.entry(x, y);
          if (size_t(term) < e.size()) mk[size_t(x * r + y)] = e[size_t(term)];
        }
      const ExactProduct Y =
          exact_matmul(mk.data(), r, r, r, ct.data(), T, T);  // M^(term) c^T [r, T]
      for (int64_t t = 0; t < T; ++t)
        for (int l = 0; l < r; ++l) {
          mpz_int yl = 0;
          for (double v : Y.entry(l, t)) yl += grid_.z(v, 3);
          gram[size_t(t)] += yl * grid_.z(kv.at({b, t, l}));
        }
    }
    for (int64_t t = 0; t < T; ++t) {
      mpz_int s = 0;
      for (int j = 0; j < dc; ++j) {
        const mpz_int kj = key_int(K0, t, g * dc + j);
        s += kj * kj;
      }
      ++res_.key_statistics;
      const std::string where = fmt::format("b={} t={} g={}", b, t, g);
      differ("key mean square (materialized vs Gram)", where, grid_.q(s, 4),
             grid_.q(gram[size_t(t)], 4));
      mpz_int rope_ss =
          0;  // |k_pe|^2 of the raw rope key (rotation is not on the grid; any S works)
      for (int j = 0; j < dr; ++j)
        rope_ss += grid_.z(kpe.at({b, t, j})) * grid_.z(kpe.at({b, t, j}));
      const bool unified = c_.norm == NormMode::Unified;
      const mpq_rational ss_e = grid_.q(s, 4) + (unified ? grid_.q(rope_ss, 2) : mpq_rational(0));
      mpq_rational ss_a = grid_.q(gram[size_t(t)], 4);
      int n_a = dc;
      if (p_.key_stat_from_latent) {
        mpz_int cs = 0;
        for (int l = 0; l < r; ++l) cs += grid_.z(kv.at({b, t, l})) * grid_.z(kv.at({b, t, l}));
        ss_a = grid_.q(cs, 2), n_a = r;
      }
      if (hook::joint_key_stat(p_, c_)) ss_a += grid_.q(rope_ss, 2), n_a += dr;
      const Num e = stat(Perturbation{}, ss_e, unified ? dc + dr : dc), a = stat(p_, ss_a, n_a);
      differ("key statistic alpha_k", where, e, a);
      ak_e_[size_t(t)][size_t(g)] = e.q();
      ak_a_[size_t(t)][size_t(g)] = a.q();
    }
  }
}

// The rope part of one row (query or key) in a given order: normalized (blockwise, the statistic
// through the hooks of `p`), or, unified, gained and rotated and scaled by `unified_inv`; norm
// none: rotated.
std::vector<mpq_rational> Certifier::rope_vec(const double* raw, const Tensor* gamma, int g0,
                                              int64_t pos, bool ntr, const Perturbation& p,
                                              const mpq_rational* unified_inv) const {
  const int dr = c_.d_r, half = dr / 2;
  const Tensor &cos = k_.get("rope_cos"), &sin = k_.get("rope_sin");
  std::vector<mpq_rational> z(static_cast<size_t>(dr));
  for (int j = 0; j < dr; ++j) z[size_t(j)] = mpq_rational(raw[j]);
  auto rotate = [&] {
    for (int j = 0; j < half; ++j) {
      int ia, ib;
      rope_pair(c_.rope_style, dr, j, ia, ib);
      const mpq_rational cc(cos[pos * half + j]), s(sin[pos * half + j]);
      const mpq_rational a = z[size_t(ia)], bb = z[size_t(ib)];
      z[size_t(ia)] = a * cc - bb * s;
      z[size_t(ib)] = a * s + bb * cc;
    }
  };
  if (c_.norm == NormMode::None || dr == 0) {  // plain MLA: rotated only; NoPE: nothing to do
    rotate();
    return z;
  }
  if (!ntr) rotate();
  mpq_rational inv;
  if (unified_inv) {
    inv = *unified_inv;
  } else {
    double ss =
        0;  // the rotated vector is not on the grid: its statistic from doubles (any S works)
    for (const auto& x : z) ss += std::pow(x.convert_to<double>(), 2);
    inv = stat(p, mpq_rational(ss), dr).q();
  }
  for (int j = 0; j < dr; ++j) z[size_t(j)] *= mpq_rational((*gamma)[g0 + j]) * inv;
  if (ntr) rotate();
  return z;
}

// (a), (b'), (c), (d), (e) for one query row (b, i, h).
void Certifier::query_row(int b, int i, int h, const ExactProduct& K0, const ExactProduct& V) {
  const int G = c_.groups, dc = c_.d_c, dr = c_.d_r, r = c_.latent_rank;
  const int64_t T = c_.seqlens[size_t(b)], pos = k_.pos(b, i);
  const bool none = c_.norm == NormMode::None, unified = c_.norm == NormMode::Unified;
  const Tensor &qn = k_.get("q_nope"), &qp = k_.get("q_pe"), &kv = k_.latent(),
               &kpe = k_.get("k_pe"), &wk = k_.get("w_uk");
  const Tensor* gq = none ? nullptr : &k_.get(unified ? "gamma_q" : "gamma_cq");
  const Tensor* gk = none ? nullptr : &k_.get(unified ? "gamma_k" : "gamma_ck");
  const int g = c_.group_of(h), ga = hook::group_of(p_, c_, h);
  const double* q = qn.ptr({b, i, h, 0});
  const double* qpe = qp.ptr({b, i, h, 0});
  // q (.) gq (.) gk at scale 3 (explicit); the absorbed one with gamma_k through its hook.
  std::vector<mpz_int> w(static_cast<size_t>(dc)), wa(static_cast<size_t>(dc));
  const int w_scale = none ? 1 : 3, wa_scale = none ? 1 : 2 + p_.gamma_k_power;
  for (int j = 0; j < dc; ++j) {
    if (none) {
      w[size_t(j)] = wa[size_t(j)] = grid_.z(q[j]);
      continue;
    }
    w[size_t(j)] = grid_.z(q[j]) * grid_.z((*gq)[j]) * grid_.z((*gk)[j]);
    wa[size_t(j)] = grid_.z(q[j]) * grid_.z((*gq)[j]);
    for (int n = 0; n < p_.gamma_k_power; ++n) wa[size_t(j)] *= grid_.z((*gk)[j]);
  }
  std::vector<mpz_int> ql(static_cast<size_t>(r), 0);  // q_latent (absorbed), scale wa_scale + 1
  for (int l = 0; l < r; ++l)
    for (int j = 0; j < dc; ++j)
      ql[size_t(l)] += wa[size_t(j)] * grid_.z(wk[int64_t(l) * G * dc + ga * dc + j]);
  // (b') alpha_q of both forms (the raw rope share: rotation barely changes it, any S works).
  mpq_rational qss = 0, qrs = 0;
  for (int j = 0; j < dc; ++j) qss += mpq_rational(q[j]) * q[j];
  for (int j = 0; j < dr; ++j) qrs += mpq_rational(qpe[j]) * qpe[j];
  Num aq_e{Mp(1)}, aq_a{Mp(1)};
  if (!none) {
    const bool joint_a = unified || p_.joint_stat_in_blockwise;
    aq_e = stat(Perturbation{}, unified ? qss + qrs : qss, unified ? dc + dr : dc);
    aq_a = stat(p_, joint_a ? qss + qrs : qss, joint_a ? dc + dr : dc);
    ++res_.query_statistics;
    differ("query statistic alpha_q", fmt::format("b={} i={} h={}", b, i, h), aq_e, aq_a);
    aq_a.v = hook::alpha_q_applied(p_, aq_a.v);
  }
  const mpq_rational aq = aq_e.q(), aqa = aq_a.q(), one = 1;
  const bool ntr = c_.rope_order == RopeOrder::NormThenRope, ntr_a = hook::norm_then_rope(p_, c_);
  const Tensor* grq = none ? nullptr : &k_.get(unified ? "gamma_q" : "gamma_rq");
  const Tensor* grk = none ? nullptr : &k_.get(unified ? "gamma_k" : "gamma_rk");
  std::vector<mpq_rational> qr_e, qr_a;
  if (pos >= 0) {
    qr_e = rope_vec(qpe, grq, unified ? dc : 0, pos, ntr, Perturbation{}, unified ? &aq : nullptr);
    qr_a = rope_vec(qpe, grq, unified ? dc : 0, pos, ntr_a, p_, unified ? &one : nullptr);
  }
  const mpq_rational sigma(c_.softmax_scale), sigma_a(hook::softmax_scale(p_, c_));
  std::vector<double> logits_d;
  std::vector<mpq_rational> logits;
  std::vector<int64_t> visible;
  for (int64_t t = 0; t < T; ++t) {
    const bool vis_e = k_.visible(b, i, t), vis_a = hook::visible(p_, k_, b, i, t);
    ++res_.masks;
    if (vis_e != vis_a)
      differ("visibility", fmt::format("b={} i={} h={} t={}", b, i, h, t), mpq_rational(int(vis_e)),
             mpq_rational(int(vis_a)));
    if (!vis_e) continue;
    const std::string where = fmt::format("b={} i={} t={} h={}", b, i, t, h);
    // (a) D.2: content score, explicit (materialized key) vs absorbed (q_latent . c).
    mpz_int left = 0, right = 0;
    for (int j = 0; j < dc; ++j) left += w[size_t(j)] * key_int(K0, t, g * dc + j);
    for (int l = 0; l < r; ++l) right += ql[size_t(l)] * grid_.z(kv.at({b, t, l}));
    ++res_.content_scores;
    differ("content score", where, grid_.q(left, w_scale + 2), grid_.q(right, wa_scale + 2));
    // (c) D.3/D.4: logits with S^q, S^k as exact inputs.
    const mpq_rational& ak = ak_e_[size_t(t)][size_t(g)];
    const mpq_rational& aka = ak_a_[size_t(hook::alpha_k_token(p_, t))][size_t(ga)];
    const double* kraw = kpe.ptr({b, t, 0});
    const std::vector<mpq_rational> kr_e =
        rope_vec(kraw, grk, unified ? dc : 0, t, ntr, Perturbation{}, unified ? &ak : nullptr);
    const std::vector<mpq_rational> kr_a =
        rope_vec(kraw, grk, unified ? dc : 0, t, ntr_a, p_, unified ? &one : nullptr);
    mpq_rational rope_e = 0, rope_a = 0;
    for (int j = 0; j < dr; ++j)
      rope_e += qr_e[size_t(j)] * kr_e[size_t(j)], rope_a += qr_a[size_t(j)] * kr_a[size_t(j)];
    const mpq_rational le = sigma * (grid_.q(left, w_scale + 2) * aq * ak + rope_e);
    const mpq_rational la = unified ? sigma_a * aqa * aka * (grid_.q(right, wa_scale + 2) + rope_a)
                                    : sigma_a * (aqa * aka * grid_.q(right, wa_scale + 2) + rope_a);
    ++res_.logits;
    differ("logit", where, le, la);
    logits.push_back(le);
    logits_d.push_back(le.convert_to<double>());
    visible.push_back(t);
  }
  if (visible.empty()) return;
  lse_check(logits, fmt::format("b={} i={} h={}", b, i, h), h);
  value_path(b, i, h, visible, logits_d, V);
}

// (d) D.6 for row (b, i, h): sum_t p v == latent_out . WV for exact rational p on the grid (the
// double softmax of the row's logits).
void Certifier::value_path(int b, int i, int h, const std::vector<int64_t>& visible,
                           const std::vector<double>& logits_d, const ExactProduct& V) {
  const int G = c_.groups, dv = c_.d_v, r = c_.latent_rank;
  const int g = c_.group_of(h), ga = hook::group_of(p_, c_, h);
  const Tensor &kv = k_.latent(), &wv = k_.get("w_uv");
  double mx = logits_d[0], sum = 0;
  for (double l : logits_d) mx = std::max(mx, l);
  for (double l : logits_d) sum += std::exp(l - mx);
  std::vector<mpz_int> p(visible.size()),
      lat(static_cast<size_t>(r), 0);  // p at scale 1; lat at scale 2
  for (size_t n = 0; n < visible.size(); ++n) {
    const double pd = std::exp(logits_d[n] - mx) / sum;
    p[n] = grid_.z(std::ldexp(std::nearbyint(std::ldexp(pd, -grid_.e0)), grid_.e0));
    for (int l = 0; l < r; ++l) lat[size_t(l)] += p[n] * grid_.z(kv.at({b, visible[n], l}));
  }
  for (int j = 0; j < dv; ++j) {
    mpz_int ex = 0, ab = 0;
    for (size_t n = 0; n < visible.size(); ++n) {
      mpz_int vj = 0;
      for (double term : V.entry(visible[n], g * dv + j)) vj += grid_.z(term, 2);
      ex += p[n] * vj;
    }
    for (int l = 0; l < r; ++l)
      ab += lat[size_t(l)] * grid_.z(wv[int64_t(l) * G * dv + ga * dv + j]);
    ++res_.value_paths;
    differ("out (value path)", fmt::format("b={} i={} h={} j={}", b, i, h, j), grid_.q(ex, 3),
           grid_.q(ab, 3));
  }
}

// (f) D.7 on the first non-empty row: lse = log sum_t exp(logit) from the exact logits, and what
// the absorbed side reports for it. (g) K.1 on every row under an attention sink: the factor that
// scales out and the lse reported beside it.
void Certifier::lse_check(const std::vector<mpq_rational>& logits, const std::string& where,
                          int h) {
  if (lse_done_ && !c_.attn_sink) return;
  Mp sum = 0;
  for (const mpq_rational& l : logits) sum += exp(mp_of(l));
  const Mp lse = log(sum);
  if (!lse_done_) {
    lse_done_ = true;
    ++res_.lse_rows;
    differ("lse", where, Num{lse}, Num{hook::lse_out(p_, lse, Mp(log(Mp(2))))});
  }
  if (!c_.attn_sink) return;
  const Mp s = k_.sink(h);
  ++res_.sink_rows;
  differ("sink factor", where, Num{sink_factor(s, lse)}, Num{hook::sink_scale(p_, true, s, lse)});
  differ("lse beside a sink", where, Num{lse}, Num{hook::sink_lse(p_, true, s, lse)});
}

void Certifier::sequence(int b) {
  const int64_t T = c_.seqlens[size_t(b)];
  if (T == 0) return;
  const int G = c_.groups, dc = c_.d_c, dv = c_.d_v, r = c_.latent_rank;
  const Tensor &kv = k_.latent(), &wk = k_.get("w_uk"), &wv = k_.get("w_uv");
  const double* cb = kv.ptr({b, 0, 0});
  const ExactProduct K0 = exact_matmul(cb, r, T, r, wk.data.data(), G * dc, G * dc);  // D.1 keys
  const ExactProduct V = exact_matmul(cb, r, T, r, wv.data.data(), G * dv, G * dv);
  key_statistics(b, T, K0);
  for (int i = 0; i < c_.s_q; ++i)
    for (int h = 0; h < c_.heads; ++h) query_row(b, i, h, K0, V);
}

CertifyResult Certifier::run() {
  set_grid();
  PrecisionScope scope(kStatBits);
  for (int b = 0; b < c_.batch; ++b) sequence(b);
  return res_;
}

}  // namespace

CertifyResult certify(const Case& k, const Perturbation& p) {
  bool compact = false;
  for (const auto& [name, t] : k.tensors) compact |= t.is_compact();
  if (!compact) return Certifier(k, p).run();
  Case whole = k;  // the certifier reads every tensor as doubles: a compact one is expanded
  for (auto& [name, t] : whole.tensors)
    if (t.is_compact()) t = t.expanded();
  return Certifier(whole, p).run();
}

}  // namespace qkmla::ref
