#include "bounds/error_bound.hpp"

#include <algorithm>

namespace qkmla::bounds {

Units make_units(DType acc) {
  const FloatFormat f = format_of(acc);
  const double u = std::ldexp(1.0, -f.precision);
  return {u, 2 * u, std::ldexp(1.0, f.emin - f.precision), std::ldexp(1.0, f.emin)};
}

namespace {
// The double at or above x (a long double bound made a double without lowering it).
double round_up(long double x) {
  const double d = double(x);
  return (long double)d >= x ? d : std::nextafter(d, std::numeric_limits<double>::infinity());
}
}  // namespace

EB EB::rounded_from(long double exact, double rounded) {
  return {rounded, round_up(std::fabs((long double)rounded - exact) + std::fabs(exact) * 0x1p-63L)};
}

EB EB::converted(double x) { return {x, up(std::fabs(x) * units().u)}; }

EB store(DType d, const EB& x) {
  const FloatFormat f = format_of(d);
  const double ud = std::ldexp(1.0, -f.precision), half_sub = std::ldexp(1.0, f.emin - f.precision);
  return {x.v, up(x.e + ud * (std::fabs(x.v) + 2 * x.e) + half_sub)};
}

// B.9. v follows the implementation's algorithm in double (shift by the largest logit, exp, the
// sum in order, divide; lse = m + log S): with u0 <= u and glibc's exp and log within 1 ulp
// (u_f0 = 2u0 <= u_f) the analysis below bounds both. Each logit's v is within Delta_t of the
// exact logit, as the implementation's is, so the range of the computed logits is at most the
// range of the v's plus 4 max Delta.
EB softmax(std::vector<EB>& l) {
  const double u = units().u, uf = units().u_f;
  if (l.empty()) return {-std::numeric_limits<double>::infinity(), 0.0};
  const size_t T = l.size();
  double lmax = l[0].v, lmin = l[0].v, dmax = 0;
  for (const EB& x : l)
    lmax = std::max(lmax, x.v), lmin = std::min(lmin, x.v), dmax = std::max(dmax, x.e);
  // The computed shift m^ is one of the computed logits: |l^_t - m^| <= R.
  const double R = up((lmax - lmin) + 4 * dmax);
  const double gamma = T > 1 ? up((T - 1) * u / (1 - (T - 1) * u)) : 0;
  const double lf = up(-std::log1p(-uf));  // |log(1 + eps_f)| for |eps_f| <= u_f
  // e^_t = exp(l_t - m^) exp(eta_t): |eta_t| <= Delta_t + u R + lf; the sum adds gamma.
  double H = 0;
  for (const EB& x : l) H = std::max(H, up(x.e + u * R + lf));
  const double Hs = up(H - std::log1p(-gamma));
  double S = 0;  // v: the implementation's algorithm, in double
  for (const EB& x : l) S += std::exp(x.v - lmax);
  const double lse = lmax + std::log(S);
  const double logS_bound = up(std::log(double(T)) + 2 * dmax + R);  // |log S_m^| for any shift
  for (EB& x : l) {
    const double p = std::exp(x.v - lmax) / S;
    const double eta = x.e + u * R + lf;
    // p^ = e^_t / S^ lies within a factor exp(+-(eta + Hs)) (1 +- u) of the exact p, and so does
    // v's p: the exact p is at most (p + tiny) exp(eta + Hs) / (1 - u). exp(l - m^) may underflow
    // to a subnormal or 0 (the relative analysis then fails), which costs at most the smallest
    // normal absolutely (S^ >= 1). Both p and p^ lie in [0, 1] (S^ >= e^_t: a sum of non-negative
    // terms rounded monotonically), so |p^ - p| <= 1 whatever the logit errors: the cap keeps a
    // vacuous relative bound (huge logits, plain MLA with outliers) finite, and 0 * inf (p
    // underflowed to 0) out of it.
    // exp(a)(1 + u) - 1 = expm1(a) + u exp(a): non-negative terms, no cancellation
    const double em = std::expm1(up(eta + Hs));
    const double rel = up(em + u * (1 + em));
    const double exact_p = up((p + units().tiny) * (1 + em) * (1 + 2 * u));
    const double e = rel < std::numeric_limits<double>::infinity()
                         ? up(times0(exact_p, rel) + units().tiny)
                         : std::numeric_limits<double>::infinity();
    x = {p, std::min(e, 1.0)};
  }
  // lse^ = fl(m^ + fl(log S^)): log S^ = log S_m^ + xi, |xi| <= Hs; log adds u_f |log S^|; the
  // final addition u |lse^|, where |lse^| and |lse_v| are at most (|lse_v| + 3 e_log) (1 + 2u).
  const double e_log = up(Hs + uf * (logS_bound + Hs));
  return {lse, up(e_log + u * (std::fabs(lse) + 3 * e_log) * (1 + 2 * u))};
}

}  // namespace qkmla::bounds
