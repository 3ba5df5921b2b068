#include "bounds/error_bound.hpp"

#include <algorithm>

namespace qkmla::bounds {

Units make_units(DType acc) {
  const FloatFormat f = format_of(acc);
  const long double u = std::ldexp(1.0L, -f.precision);
  return {u, 2 * u, std::ldexp(1.0L, f.emin - f.precision), std::ldexp(1.0L, f.emin)};
}

EB EB::converted(double x) { return {x, up(std::fabs((long double)x) * units().u)}; }

EB store(DType d, const EB& x) {
  const FloatFormat f = format_of(d);
  const long double ud = std::ldexp(1.0L, -f.precision),
                    half_sub = std::ldexp(1.0L, f.emin - f.precision);
  return {x.v, up(x.e + ud * (std::fabs(x.v) + x.e) + half_sub)};
}

EB softmax(std::vector<EB>& l) {
  const long double u = units().u, uf = units().u_f;
  if (l.empty()) return {-std::numeric_limits<long double>::infinity(), 0};
  const size_t T = l.size();
  long double lmax = l[0].v, lmin = l[0].v, dmax = 0;
  for (const EB& x : l)
    lmax = std::max(lmax, x.v), lmin = std::min(lmin, x.v), dmax = std::max(dmax, x.e);
  // The computed shift m^ is one of the computed logits: |l^_t - m^| <= R.
  const long double R = (lmax - lmin) + 2 * dmax;
  const long double gamma = T > 1 ? (T - 1) * u / (1 - (T - 1) * u) : 0;
  const long double lf = -std::log1p(-uf);  // |log(1 + eps_f)| for |eps_f| <= u_f
  // e^_t = exp(l_t - m^) exp(eta_t): |eta_t| <= Delta_t + u R + lf; the sum adds gamma.
  long double H = 0;
  for (const EB& x : l) H = std::max(H, x.e + u * R + lf);
  const long double Hs = H - std::log1p(-gamma);
  // Exact softmax (the shift cancels): p_t = exp(l_t - lse).
  long double S = 0;
  for (const EB& x : l) S += std::exp(x.v - lmax);
  const long double lse = lmax + std::log(S);
  const long double logS_bound =
      std::log((long double)T) + 2 * dmax + R;  // |log S_m^| for any shift
  for (EB& x : l) {
    const long double p = std::exp(x.v - lse);
    const long double eta = x.e + u * R + lf;
    // p^ = e^_t / S^, one division rounding; exp(l - m^) may underflow to a subnormal or 0 (the
    // relative analysis then fails), which costs at most the smallest normal absolutely (S^ >= 1).
    // Both p and p^ lie in [0, 1] (S^ >= e^_t: a sum of non-negative terms rounded monotonically),
    // so |p^ - p| <= 1 whatever the logit errors: the cap keeps a vacuous relative bound (huge
    // logits, plain MLA with outliers) finite, and 0 * inf (p underflowed to 0) out of it.
    const long double rel = std::exp(eta + Hs) * (1 + u) - 1;
    const long double e = rel < std::numeric_limits<long double>::infinity()
                              ? up(p * rel + units().tiny)
                              : std::numeric_limits<long double>::infinity();
    x = {p, std::min(e, 1.0L)};
  }
  // lse^ = fl(m^ + fl(log S^)): log S^ = log S_m^ + xi, |xi| <= Hs; log adds u_f |log S^|; the
  // final addition u |lse^|.
  const long double e_log = Hs + uf * (logS_bound + Hs);
  return {lse, up(e_log + u * (std::fabs(lse) + e_log))};
}

}  // namespace qkmla::bounds
