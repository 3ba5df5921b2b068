#include "certify.hpp"

#include <boost/multiprecision/gmp.hpp>
#include <boost/multiprecision/mpfr.hpp>
#include <cmath>
#include <fmt/format.h>

#include "core/rope.hpp"
#include "exact_dot.hpp"

namespace qkmla::ref {

using boost::multiprecision::mpq_rational;
using boost::multiprecision::mpz_int;
using impl::Mutant;

bool rounding_only(Mutant m) { return m == Mutant::AlphaKLowp || m == Mutant::ScoreLowpAccum; }

namespace {

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
    mpz_int i = mpz_int(mant);
    const int shift = e - 53 + tz - scale * e0;
    if (shift < 0) throw std::logic_error(fmt::format("certify: {:a} is below the grid 2^{} (scale {})", x, scale * e0, scale));
    return i << shift;
  }
  mpq_rational q(const mpz_int& v, int scale) const {  // v * 2^(scale*e0)
    mpq_rational r(v);
    const int sh = scale * e0;
    if (sh >= 0) r *= mpq_rational(mpz_int(1) << sh);
    else r /= mpq_rational(mpz_int(1) << -sh);
    return r;
  }
};

int trailing(double x) {
  int e;
  const double m = std::frexp(std::fabs(x), &e);
  return e - 53 + __builtin_ctzll(uint64_t(std::ldexp(m, 53)));
}

std::string show(const mpq_rational& x) { return fmt::format("{:.17g}", x.convert_to<double>()); }

struct Certifier {
  const Case& k;
  Mutant m;
  CertifyResult res;
  Grid grid;
  std::vector<mpq_rational> first_row;  // exact logits of the first row with a visible token
  bool first_row_logits_done = false;

  bool differ(const char* check, const std::string& where, const mpq_rational& a, const mpq_rational& b) {
    if (a == b) return false;
    if (!res.refuted) {
      res.refuted = true;
      res.first = fmt::format("{} differs at {}: explicit {} vs absorbed {} (difference {})", check, where, show(a), show(b),
                              show(a - b));
    }
    return true;
  }
  void run();
};

mpq_rational exact_q(double x) { return mpq_rational(x); }

// 1/S as an exact rational input: the nearest double to the true value (any positive rational
// would do: the identities hold for every S).
mpq_rational inv_s(double ss, int n, double eps) { return exact_q(1.0 / std::sqrt(ss / n + eps)); }

void Certifier::run() {
  const MlaConfig& c = k.cfg;
  const int H = c.heads, G = c.groups, S = c.s_q, dc = c.d_c, dr = c.d_r, dv = c.d_v, r = c.latent_rank;
  const bool unified = c.norm == NormMode::Unified;
  const Tensor &qn = k.get("q_nope"), &qp = k.get("q_pe"), &kv = k.latent(), &kpe = k.get("k_pe"), &wk = k.get("w_uk"),
               &wv = k.get("w_uv"), &cos = k.get("rope_cos"), &sin = k.get("rope_sin");
  const Tensor& gq = k.get(unified ? "gamma_q" : "gamma_cq");
  const Tensor& gk = k.get(unified ? "gamma_k" : "gamma_ck");
  // The grid: the smallest lowest-set-bit exponent of every value read.
  int e0 = 0;
  for (const auto& [name, t] : k.tensors)
    for (double x : t.data)
      if (std::isfinite(x) && x != 0) e0 = std::min(e0, trailing(x));
  for (double x : kv.data)  // fp8: the dequantized cache (code x scale) has bits of its own
    if (std::isfinite(x) && x != 0) e0 = std::min(e0, trailing(x));
  grid.e0 = e0;
  const mpz_int one = grid.z(1.0);
  const mpq_rational eps = exact_q(c.eps), sigma = exact_q(c.softmax_scale);
  const mpq_rational sigma_a = m == Mutant::ScaleDcOnly ? exact_q(1.0 / std::sqrt(double(dc))) : sigma;
  for (int b = 0; b < c.batch; ++b) {
    const int64_t T = c.seqlens[size_t(b)];
    if (T == 0) continue;
    const double* cb = &kv.data[size_t(kv.index({b, 0, 0}))];
    const ExactProduct K0 = exact_matmul(cb, r, T, r, wk.data.data(), G * dc, G * dc);  // D.1 keys
    const ExactProduct V = exact_matmul(cb, r, T, r, wv.data.data(), G * dv, G * dv);
    auto key_int = [&](int64_t t, int col) {  // k0c at scale 2
      mpz_int s = 0;
      for (double term : K0.entry(t, col)) s += grid.z(term, 2);
      return s;
    };
    // (b) D.5: the key statistic from the materialized key and from the Gram form.
    std::vector<std::vector<mpz_int>> ss(static_cast<size_t>(T), std::vector<mpz_int>(static_cast<size_t>(G)));  // sum_j k0c^2, scale 4
    for (int g = 0; g < G; ++g) {
      std::vector<double> wkt(static_cast<size_t>(dc * r));  // WK_g^T [d_c, r]
      for (int l = 0; l < r; ++l)
        for (int j = 0; j < dc; ++j) wkt[size_t(j * r + l)] = wk[int64_t(l) * G * dc + g * dc + j];
      const ExactProduct M = exact_matmul(&wk.data[size_t(g * dc)], G * dc, r, dc, wkt.data(), r, r);  // WK_g WK_g^T
      std::vector<double> ct(static_cast<size_t>(r * T));  // c^T [r, T]
      for (int64_t t = 0; t < T; ++t)
        for (int l = 0; l < r; ++l) ct[size_t(l * T + t)] = kv.at({b, t, l});
      std::vector<mpz_int> gram(static_cast<size_t>(T), 0);  // c M c^T, scale 4
      for (int term = 0; term < M.max_terms(); ++term) {
        std::vector<double> mk(static_cast<size_t>(r * r), 0.0);
        for (int64_t x = 0; x < r; ++x)
          for (int64_t y = 0; y < r; ++y) {
            const auto e = M.entry(x, y);
            if (size_t(term) < e.size()) mk[size_t(x * r + y)] = e[size_t(term)];
          }
        const ExactProduct Y = exact_matmul(mk.data(), r, r, r, ct.data(), T, T);  // M^(term) c^T [r, T]
        for (int64_t t = 0; t < T; ++t)
          for (int l = 0; l < r; ++l) {
            mpz_int yl = 0;
            for (double v : Y.entry(l, t)) yl += grid.z(v, 3);
            gram[size_t(t)] += yl * grid.z(kv.at({b, t, l}));
          }
      }
      for (int64_t t = 0; t < T; ++t) {
        mpz_int s = 0;
        for (int j = 0; j < dc; ++j) {
          const mpz_int kj = key_int(t, g * dc + j);
          s += kj * kj;
        }
        ss[size_t(t)][size_t(g)] = s;
        ++res.key_statistics;
        const std::string where = fmt::format("b={} t={} g={}", b, t, g);
        differ("key mean square (materialized vs Gram)", where, grid.q(s, 4), grid.q(gram[size_t(t)], 4));
        // The statistic each form builds from it (mutants change the absorbed one).
        mpz_int rope_ss = 0;  // |k_pe|^2 or |Rot k_pe|^2 is not on the grid after rotation: raw only
        for (int j = 0; j < dr; ++j) rope_ss += grid.z(kpe.at({b, t, j})) * grid.z(kpe.at({b, t, j}));
        const mpq_rational ms = grid.q(s, 4) / dc;
        const mpq_rational se2 = unified ? (grid.q(s, 4) + grid.q(rope_ss, 2)) / (dc + dr) + eps : ms + eps;
        mpq_rational sa2 = se2;
        if (m == Mutant::NoEps) sa2 = se2 - eps;
        if (m == Mutant::AlphaKFromLatent) {
          mpz_int cs = 0;
          for (int l = 0; l < r; ++l) cs += grid.z(kv.at({b, t, l})) * grid.z(kv.at({b, t, l}));
          sa2 = grid.q(cs, 2) / r + eps;
        }
        if (m == Mutant::JointNormInBlockwise && !unified) sa2 = (grid.q(s, 4) + grid.q(rope_ss, 2)) / (dc + dr) + eps;
        if (m == Mutant::EpsOutsideSqrt) {
          // S_a = sqrt(ms) + eps equals S_e = sqrt(ms + eps) only if S_e = (1 + eps)/2.
          const mpq_rational s_needed = (1 + eps) / 2;
          differ("key statistic S^2 (eps outside the root)", where, se2, s_needed * s_needed);
        } else {
          differ("key statistic S^2", where, se2, sa2);
        }
      }
    }
    // Per-token rope keys and statistics as exact rationals.
    auto rotate_q = [&](std::vector<mpq_rational>& z, int64_t pos) {
      const int half = dr / 2;
      for (int j = 0; j < half; ++j) {
        int ia, ib;
        rope_pair(c.rope_style, dr, j, ia, ib);
        const mpq_rational cc = exact_q(cos[pos * half + j]), s = exact_q(sin[pos * half + j]);
        const mpq_rational a = z[size_t(ia)], bb = z[size_t(ib)];
        z[size_t(ia)] = a * cc - bb * s;
        z[size_t(ib)] = a * s + bb * cc;
      }
    };
    auto sumsq_d = [&](const std::vector<mpq_rational>& z) {
      double s = 0;
      for (const auto& x : z) s += std::pow(x.convert_to<double>(), 2);
      return s;
    };
    // Rope part of one row (query or key) in a given order: normalized (blockwise) or, unified,
    // gained and rotated, with `inv` the unified 1/S (explicit) or 1 (absorbed).
    auto rope_vec = [&](const double* raw, const Tensor& gamma, int g0, int64_t pos, bool ntr, const mpq_rational* unified_inv) {
      std::vector<mpq_rational> z(static_cast<size_t>(dr));
      for (int j = 0; j < dr; ++j) z[size_t(j)] = exact_q(raw[j]);
      if (!ntr) rotate_q(z, pos);
      const mpq_rational inv = unified_inv ? *unified_inv : inv_s(sumsq_d(z), dr, c.eps);
      for (int j = 0; j < dr; ++j) z[size_t(j)] *= exact_q(gamma[g0 + j]) * inv;
      if (ntr) rotate_q(z, pos);
      return z;
    };
    const bool ntr = c.rope_order == RopeOrder::NormThenRope;
    const bool ntr_a = (m == Mutant::RopeOrderSwapped) ? !ntr : ntr;
    // Probabilities for (d): the double softmax of double logits, an exact rational input.
    for (int i = 0; i < S; ++i) {
      const int64_t pos = k.pos(b, i);
      for (int h = 0; h < H; ++h) {
        const int g = c.group_of(h), ga = m == Mutant::GroupMapMod ? h % G : g;
        const double* q = &qn.data[size_t(qn.index({b, i, h, 0}))];
        std::vector<mpz_int> w(static_cast<size_t>(dc)), wa(static_cast<size_t>(dc));  // scale 3 (wa: 2, 3 or 4)
        int wa_scale = 3;
        for (int j = 0; j < dc; ++j) {
          w[size_t(j)] = grid.z(q[j]) * grid.z(gq[j]) * grid.z(gk[j]);
          if (m == Mutant::NoGammaK) wa[size_t(j)] = grid.z(q[j]) * grid.z(gq[j]), wa_scale = 2;
          else if (m == Mutant::GammaKTwice) wa[size_t(j)] = w[size_t(j)] * grid.z(gk[j]), wa_scale = 4;
          else wa[size_t(j)] = w[size_t(j)];
        }
        std::vector<mpz_int> ql(static_cast<size_t>(r), 0);  // q_latent (absorbed), scale wa_scale + 1
        for (int l = 0; l < r; ++l)
          for (int j = 0; j < dc; ++j) ql[size_t(l)] += wa[size_t(j)] * grid.z(wk[int64_t(l) * G * dc + ga * dc + j]);
        double qss = 0;
        for (int j = 0; j < dc; ++j) qss += q[j] * q[j];
        const double* qpe = &qp.data[size_t(qp.index({b, i, h, 0}))];
        double qrs = 0;
        for (int j = 0; j < dr; ++j) qrs += qpe[j] * qpe[j];  // rotation barely changes it: any S works
        const mpq_rational aq = unified ? inv_s(qss + qrs, dc + dr, c.eps) : inv_s(qss, dc, c.eps);
        const mpq_rational aq_a = m == Mutant::NoAlphaQ ? mpq_rational(1) : aq;
        std::vector<mpq_rational> qr_e, qr_a;
        if (pos >= 0) {
          qr_e = rope_vec(qpe, k.get(unified ? "gamma_q" : "gamma_rq"), unified ? dc : 0, pos, ntr, unified ? &aq : nullptr);
          const mpq_rational one_q = 1;
          qr_a = rope_vec(qpe, k.get(unified ? "gamma_q" : "gamma_rq"), unified ? dc : 0, pos, ntr_a, unified ? &one_q : nullptr);
        }
        std::vector<double> logits_d;
        std::vector<int64_t> visible;
        for (int64_t t = 0; t < T; ++t) {
          const bool vis_e = k.causal_visible(b, i, t);
          const bool vis_a = vis_e || (m == Mutant::CausalOffByOne && c.causal && t == pos + 1);
          ++res.masks;
          if (vis_e != vis_a)
            differ("visibility", fmt::format("b={} i={} h={} t={}", b, i, h, t), mpq_rational(int(vis_e)), mpq_rational(int(vis_a)));
          if (!vis_e) continue;
          const std::string where = fmt::format("b={} i={} t={} h={}", b, i, t, h);
          // (a) D.2: content score, explicit (materialized key) vs absorbed (q_latent . c).
          mpz_int left = 0, right = 0;
          for (int j = 0; j < dc; ++j) left += w[size_t(j)] * key_int(t, g * dc + j);
          for (int l = 0; l < r; ++l) right += ql[size_t(l)] * grid.z(kv.at({b, t, l}));
          ++res.content_scores;
          differ("content score", where, grid.q(left, 5), grid.q(right, wa_scale + 2));
          // (c) D.3/D.4: logits with exact S^q, S^k.
          const int64_t tk = m == Mutant::AlphaKOffByOne ? std::max<int64_t>(t - 1, 0) : t;
          auto key_inv = [&](int64_t tt) {
            double ks = ss[size_t(tt)][size_t(g)].convert_to<double>() * std::ldexp(1.0, 4 * grid.e0);
            double kr2 = 0;
            for (int j = 0; j < dr; ++j) kr2 += std::pow(kpe.at({b, tt, j}), 2);
            return unified ? inv_s(ks + kr2, dc + dr, c.eps) : inv_s(ks, dc, c.eps);
          };
          const mpq_rational ak = key_inv(t), ak_a = key_inv(tk);
          const mpq_rational one_k = 1;
          const std::vector<mpq_rational> kr_e = rope_vec(&kpe.data[size_t(kpe.index({b, t, 0}))], k.get(unified ? "gamma_k" : "gamma_rk"),
                                                         unified ? dc : 0, t, ntr, unified ? &ak : nullptr);
          const std::vector<mpq_rational> kr_a = rope_vec(&kpe.data[size_t(kpe.index({b, t, 0}))], k.get(unified ? "gamma_k" : "gamma_rk"),
                                                         unified ? dc : 0, t, ntr_a, unified ? &one_k : nullptr);
          mpq_rational rope_e = 0, rope_a = 0;
          for (int j = 0; j < dr; ++j) rope_e += qr_e[size_t(j)] * kr_e[size_t(j)], rope_a += qr_a[size_t(j)] * kr_a[size_t(j)];
          // Explicit: sigma * (sum_j (q gq aq)(k0c gk ak) + qr^.kr^).
          const mpq_rational le = sigma * (grid.q(left, 5) * aq * ak + rope_e);
          const mpq_rational la = unified ? sigma_a * aq_a * ak_a * (grid.q(right, wa_scale + 2) + rope_a)
                                          : sigma_a * (aq_a * ak_a * grid.q(right, wa_scale + 2) + rope_a);
          ++res.logits;
          differ("logit", where, le, la);
          logits_d.push_back(le.convert_to<double>());
          visible.push_back(t);
          if (first_row_logits_done == false) first_row.push_back(le);
        }
        if (visible.empty()) continue;
        first_row_logits_done = true;
        // (d) D.6: value path with exact rational p (the double softmax of the logits).
        double mx = logits_d[0], sum = 0;
        for (double l : logits_d) mx = std::max(mx, l);
        for (double l : logits_d) sum += std::exp(l - mx);
        std::vector<mpz_int> lat(static_cast<size_t>(r), 0);  // sum_t p c[t], scale 2 (p on the grid: scale 1 after rounding to it)
        std::vector<mpz_int> p(visible.size());
        for (size_t n = 0; n < visible.size(); ++n) {
          const double pd = std::exp(logits_d[n] - mx) / sum;
          // any rational p makes D.6 an identity; put it on the grid (scale 1)
          p[n] = grid.z(std::ldexp(std::nearbyint(std::ldexp(pd, -grid.e0)), grid.e0));
        }
        for (size_t n = 0; n < visible.size(); ++n)
          for (int l = 0; l < r; ++l) lat[size_t(l)] += p[n] * grid.z(kv.at({b, visible[n], l}));
        for (int j = 0; j < dv; ++j) {
          mpz_int ex = 0, ab = 0;
          for (size_t n = 0; n < visible.size(); ++n) {
            mpz_int vj = 0;
            for (double term : V.entry(visible[n], g * dv + j)) vj += grid.z(term, 2);
            ex += p[n] * vj;
          }
          for (int l = 0; l < r; ++l) ab += lat[size_t(l)] * grid.z(wv[int64_t(l) * G * dv + ga * dv + j]);
          ++res.value_paths;
          differ("out (value path)", fmt::format("b={} i={} h={} j={}", b, i, h, j), grid.q(ex, 3), grid.q(ab, 3));
        }
      }
    }
  }
}

}  // namespace

CertifyResult certify(const Case& k, Mutant m) {
  Certifier c{k, m, {}, {}};
  c.run();
  if (m == Mutant::LseBase2 && !c.res.refuted && !c.first_row.empty()) {
    // D.7: lse/ln 2 equals lse only where lse = 0, i.e. sum_t exp(logit) = 1. Outward-rounded
    // MPFR bounds on that sum (from the exact logits) decide it: a proof, not an estimate.
    mpfr_t lo, hi, x, e;
    mpfr_inits2(256, lo, hi, x, e, (mpfr_ptr) nullptr);
    mpfr_set_zero(lo, 1);
    mpfr_set_zero(hi, 1);
    for (const mpq_rational& l : c.first_row) {
      mpfr_set_q(x, l.backend().data(), MPFR_RNDD);
      mpfr_exp(e, x, MPFR_RNDD);
      mpfr_add(lo, lo, e, MPFR_RNDD);
      mpfr_set_q(x, l.backend().data(), MPFR_RNDU);
      mpfr_exp(e, x, MPFR_RNDU);
      mpfr_add(hi, hi, e, MPFR_RNDU);
    }
    const bool above = mpfr_cmp_ui(lo, 1) > 0, below = mpfr_cmp_ui(hi, 1) < 0;
    if (above || below) {
      c.res.refuted = true;
      c.res.first = fmt::format("lse differs at the first non-empty row: sum_t exp(logit) in [{:.17g}, {:.17g}] excludes 1, so "
                                "lse = {:.17g} != 0 and lse / ln 2 = {:.17g} != lse",
                                mpfr_get_d(lo, MPFR_RNDD), mpfr_get_d(hi, MPFR_RNDU), std::log(mpfr_get_d(lo, MPFR_RNDN)),
                                std::log(mpfr_get_d(lo, MPFR_RNDN)) / std::log(2.0));
    }
    mpfr_clears(lo, hi, x, e, (mpfr_ptr) nullptr);
  }
  return c.res;
}

}  // namespace qkmla::ref
