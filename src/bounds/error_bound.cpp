#include "bounds/error_bound.hpp"

#include <algorithm>

namespace qkmla::bounds {

Units make_units(DType acc) {
  const FloatFormat f = format_of(acc);
  const double u = std::ldexp(1.0, -f.precision);
  return {u, 2 * u, kU0 / u, std::ldexp(1.0, f.emin - f.precision), std::ldexp(1.0, f.emin)};
}

namespace {
// The double at or above x (a long double bound made a double without lowering it).
double round_up(long double x) {
  const double d = double(x);
  return (long double)d >= x ? d : std::nextafter(d, std::numeric_limits<double>::infinity());
}
}  // namespace

EB EB::rounded_from(long double exact, double rounded) {
  // v = exact rounded to double: within (2^-53 + 2^-63) |exact| of the exact value, which is k
  // times u (1 + 2^-10) |exact|, so e carries that term as well.
  const long double u = units().u;
  return {double(exact), round_up(std::fabs((long double)rounded - exact) +
                                  std::fabs(exact) * (0x1p-63L + u * (1 + 0x1p-9L)))};
}

EB EB::converted(double x) { return {x, up(std::fabs(x) * units().u)}; }

EB store(DType d, const EB& x) {
  const FloatFormat f = format_of(d);
  const double ud = std::ldexp(1.0, -f.precision), half_sub = std::ldexp(1.0, f.emin - f.precision);
  return {x.v, up(x.e + ud * (std::fabs(x.v) + (1 + k_of(x)) * x.e) + half_sub), x.f};
}

// B.9. v follows the implementation's algorithm in double (shift by the largest logit, exp, the
// sum in order, divide; lse = m + log S), so the analysis below holds for it with its own unit
// roundoffs (u0 <= k u, glibc's exp and log within 1 ulp: 2u0 <= k u_f) and logit errors k Delta
// (k: the largest of the logits' factors): every term scales by at most k (each is convex in them
// and 0 at 0), so v's p and lse lie within k times the implementation's bounds. The range of the
// computed logits is at most the range of the v's plus (2 + 2k) max Delta.
EB softmax(std::vector<EB>& l) {
  const double u = units().u, uf = units().u_f, tiny = units().tiny;
  if (l.empty()) return {-std::numeric_limits<double>::infinity(), 0.0};
  const size_t T = l.size();
  double lmax = l[0].v, lmin = l[0].v, dmax = 0, k = units().k;
  for (const EB& x : l)
    lmax = std::max(lmax, x.v), lmin = std::min(lmin, x.v), dmax = std::max(dmax, x.e),
    k = std::max(k, x.f);
  const double f = k > units().k ? k : 0.0;
  // The computed shift m^ is one of the computed logits: |l^_t - m^| <= R.
  const double R = up((lmax - lmin) + (2 + 2 * k) * dmax);
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
    const double a = up(x.e + u * R + lf + Hs);
    // p^ = e^_t / S^ lies within a factor exp(+-a) (1 +- u) of the exact p, v's p within
    // exp(+-k a) (1 +- u0): the exact p is at most (p + tiny) exp(k a) (1 + 2u0). exp(l - m^) may
    // underflow to a subnormal or 0 (the relative analysis then fails), which costs at most the
    // smallest normal absolutely (S^ >= 1). exp(a)(1 + u) - 1 = expm1(a) + u exp(a): non-negative
    // terms, no cancellation.
    const double em = std::expm1(a);
    const double rel = up(em + u * (1 + em));
    const double exact_p = up((p + tiny) * (1 + std::expm1(up(k * a))) * (1 + 2 * kU0));
    const double e = rel < std::numeric_limits<double>::infinity()
                         ? up(times0(exact_p, rel) + tiny)
                         : std::numeric_limits<double>::infinity();
    // Both p and p^ lie in [0, 1] (S^ >= e^_t: a sum of non-negative terms rounded
    // monotonically), so |p^ - p| <= 1 whatever the logit errors: a vacuous relative bound (huge
    // logits, plain MLA with outliers) is capped at 1, and v's distance is then only known to be
    // within e (factor 1), which every value computed from it carries.
    x = e <= 1 ? EB{p, e, f} : EB{p, 1.0, 1.0};
  }
  // lse^ = fl(m^ + fl(log S^)): log S^ = log S_m^ + xi, |xi| <= Hs; log adds u_f |log S^|; the
  // final addition u |lse^|, where |lse^| is at most (|lse_v| + 3 e_log) (1 + 2u).
  const double e_log = up(Hs + uf * (logS_bound + Hs));
  return {lse, up(e_log + u * (std::fabs(lse) + 3 * e_log) * (1 + 2 * u)), f};
}

}  // namespace qkmla::bounds
