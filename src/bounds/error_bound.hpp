// Forward error analysis by operation (proofs/error_bounds.md, steps B.0-B.9): an arithmetic
// type that carries, for each value an implementation computes, an approximation v of the exact
// value it stands for and a bound e with |computed - exact| <= e and |v - exact| <= f e, where
// f = max(k, the value's own f): k = u0 / u (v is computed in double, u0 = 2^-53; u is the
// implementation's unit roundoff), f = 1 downstream of a softmax weight whose bound was capped.
// Running a CPU profile implementation on this type (the same template code, the same operation
// order) yields its error bound, element by element.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.hpp"

namespace qkmla::bounds {

// Unit roundoffs of the arithmetic being bounded: u of the accumulate type, u_f of the library's
// exp/log (assumption F: within 1 ulp, so 2u), set before a run (one thread). v is computed in
// double, u0 = 2^-53 <= u, by the same operations in the same order: every rule below bounds the
// implementation's result and v alike (B.0).
struct Units {
  double u = 0, u_f = 0;
  double k = 1;     // u0 / u: v's distance from the exact value is within k e
  double eta = 0;   // half the smallest subnormal of the accumulate type (underflow, B.2)
  double tiny = 0;  // the smallest normal of the accumulate type (exp underflow, B.9)
};
// Per thread (the gate bounds several profiles side by side); inline, since every operation of
// the type reads it.
inline Units& units() {
  thread_local Units u;
  return u;
}
Units make_units(DType accumulate);  // u, u_f = 2u, eta of that format

// B.0: a rule's formula takes at most 16 roundings to nearest in double, each a relative 2^-53 of
// non-negative terms (or an underflow of at most 2^-1075); times 1 + 2^-48 plus 2^-1068 covers
// them, so a bound's own rounding never makes it smaller than the formula's value.
inline double up(double x) { return x * (1.0 + 0x1p-48) + 0x1p-1068; }
constexpr double kU0 = 0x1p-53;  // unit roundoff of double, in which v is computed

struct EB {
  double v = 0;  // approximates the exact value: |v - exact| <= max(k, f) e
  double e = 0;  // |computed - exact| <= e
  double f = 0;  // 0, or 1 where v may be as far from the exact value as e (a capped p, B.9)
  EB() = default;
  EB(double x) : v(x), e(0) {}  // stored inputs and constants are exact
  EB(double value, double err, double fac = 0) : v(value), e(err), f(fac) {}
  // A run's outputs are written through double(x): what comes out is the bound.
  explicit operator double() const { return e; }
  // A value computed offline and rounded to `rounded`, which the implementation then uses: v is
  // `exact` in double, e the distance of `rounded` from the exact value (`exact` is a long double
  // product, itself within 2^-63 of the exact value), at least v's distance over k.
  static EB rounded_from(long double exact, double rounded);
  // A decimal constant of the config (eps, the softmax scale) converted to the accumulate type:
  // one rounding, u |x|.
  static EB converted(double x);
};

// An exact zero times an unbounded error is zero, not NaN. Both tests are evaluated (no short
// circuit), so the select needs no branch.
inline double times0(double x, double y) {
  const double p = x * y;
  return (x == 0) | (y == 0) ? 0 : p;
}

// The factor of a result: the larger of its operands'.
inline double factor(const EB& a, const EB& b) { return std::max(a.f, b.f); }
inline double k_of(const EB& a) { return std::max(units().k, a.f); }

// B.1 addition and subtraction, s = e_x + e_y: e = s + u(|v|(1 + 2u0) + 2s) bounds the rounding
// of x^ + y^ (|x^ + y^| <= |x + y| + s); v's error, k_x e_x + k_y e_y + u0 |v_x + v_y|, is within
// max(k_x, k_y) e.
inline EB operator+(const EB& a, const EB& b) {
  const double v = a.v + b.v, s = a.e + b.e;
  return {v, up(s + units().u * (std::fabs(v) * (1 + 2 * kU0) + 2 * s)), factor(a, b)};
}
inline EB operator-(const EB& a) { return {-a.v, a.e, a.f}; }
inline EB operator-(const EB& a, const EB& b) { return a + (-b); }
// B.2 multiplication: |x^ y^ - xy| <= d = |v_x| e_y + |v_y| e_x + (1 + k_x + k_y) e_x e_y
// (|x| <= |v_x| + k_x e_x), and |v_x v_y - xy| <= max(k_x, k_y) d; then one rounding of a value
// at most M = (|v_x| + k_x e_x)(|v_y| + k_y e_y) + d, and eta. An exact operand (e = 0) zeroes
// two terms.
inline EB operator*(const EB& a, const EB& b) {
  const double v = a.v * b.v, ax = std::fabs(a.v), bx = std::fabs(b.v);
  const double ka = k_of(a), kb = k_of(b);
  const double d = b.e == 0 ? times0(bx, a.e)
                   : a.e == 0
                       ? times0(ax, b.e)
                       : times0(ax, b.e) + times0(bx, a.e) + (1 + ka + kb) * times0(a.e, b.e);
  const double m = times0(ax + ka * a.e, bx + kb * b.e) + d;
  return {v, up(d + units().u * m + units().eta), factor(a, b)};
}
// B.3 division (requires (1 + k_y) e_y < |v_y|): with Q = (|v_x| + k_x e_x) / (|v_y| - k_y e_y)
// >= |x/y| and |y^| >= |v_y| - (1 + k_y) e_y, d = (e_x + Q e_y) / (|v_y| - (1 + k_y) e_y) bounds
// |x^/y^ - x/y| (and |v_x/v_y - x/y| within max(k_x, k_y) d); then one rounding of a value at most
// Q + d, and eta.
inline EB operator/(const EB& a, const EB& b) {
  const double v = a.v / b.v, by = std::fabs(b.v), ka = k_of(a), kb = k_of(b);
  const double den = by - (1 + kb) * b.e;
  if (!(den > 0)) return {v, std::numeric_limits<double>::infinity(), factor(a, b)};
  const double q = (std::fabs(a.v) + ka * a.e) / (by - kb * b.e);
  const double d = (a.e + q * b.e + 0x1p-1068) / den;  // the floor: an underflow before dividing
  return {v, up(d + units().u * (q + d) + units().eta), factor(a, b)};
}
inline EB& operator+=(EB& a, const EB& b) { return a = a + b; }
inline EB& operator-=(EB& a, const EB& b) { return a = a - b; }
inline EB& operator*=(EB& a, const EB& b) { return a = a * b; }
inline EB& operator/=(EB& a, const EB& b) { return a = a / b; }
// B.4 square root (correctly rounded): x >= v_x - k e_x, so
// d = e_x / (sqrt(max(v_x - k e_x, 0)) + sqrt(max(v_x - (1 + k) e_x, 0))) bounds |sqrt(x^) -
// sqrt(x)| (and v's, within k d); where that is 0, sqrt(e_x / k) (|sqrt a - sqrt b| <=
// sqrt|a - b|). Then one rounding of at most sqrt(v_x + k e_x) + d.
inline EB sqrt(const EB& a) {
  const double v = std::sqrt(a.v), k = k_of(a);
  const double den =
      std::sqrt(std::max(a.v - k * a.e, 0.0)) + std::sqrt(std::max(a.v - (1 + k) * a.e, 0.0));
  const double d = den > 0 ? a.e / den : std::sqrt(a.e / k);
  return {v, up(d + units().u * (std::sqrt(std::max(a.v + k * a.e, 0.0)) + d)), a.f};
}

// B.7 rounding to the stored dtype D: one more relative u_D of the computed value (at most
// |v| + (1 + k) e), or half the smallest subnormal of D in its subnormal range; v is not rounded,
// so its distance stays within k of the old e.
EB store(DType d, const EB& x);
// B.9 softmax over one row (shift-invariant analysis; replaces the generic code for EB).
EB softmax(std::vector<EB>& logits_to_p);

}  // namespace qkmla::bounds

namespace std {
template <>
struct numeric_limits<qkmla::bounds::EB> {
  static qkmla::bounds::EB quiet_NaN() { return {std::numeric_limits<double>::quiet_NaN(), 0.0}; }
  static qkmla::bounds::EB infinity() { return {std::numeric_limits<double>::infinity(), 0.0}; }
};
}  // namespace std
