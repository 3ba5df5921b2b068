// Forward error analysis by operation (proofs/error_bounds.md, steps B.1-B.9): an arithmetic
// type that carries, for each value an implementation computes, the exact value it stands for
// (v) and a bound on the difference (e). Running a CPU profile implementation on this type (the
// same template code, the same operation order) yields its error bound, element by element.
#pragma once
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.hpp"

namespace qkmla::bounds {

// Unit roundoffs of the arithmetic being bounded: u of the accumulate type, u_f of the library's
// exp/log (assumption F: within 1 ulp, so 2u), set before a run (one thread).
struct Units {
  long double u = 0, u_f = 0;
  long double eta = 0;   // half the smallest subnormal of the accumulate type (underflow, B.2)
  long double tiny = 0;  // the smallest normal of the accumulate type (exp underflow, B.8)
};
// Per thread (the gate bounds several profiles side by side); inline, since every operation of
// the type reads it.
inline Units& units() {
  thread_local Units u;
  return u;
}
Units make_units(DType accumulate);  // u, u_f = 2u, eta of that format

// Bounds are computed in long double and pushed up by 2^-60 per operation, so their own
// rounding never makes them smaller than the true bound (B.0).
inline long double up(long double x) { return x * (1.0L + 0x1p-60L); }

struct EB {
  long double v = 0;  // the exact value this quantity approximates
  long double e = 0;  // |computed - v| <= e
  EB() = default;
  EB(double x) : v(x), e(0) {}  // stored inputs and constants are exact
  EB(long double value, long double err) : v(value), e(err) {}
  // A run's outputs are written through double(x): what comes out is the bound.
  explicit operator double() const { return double(e); }
  // A value computed offline in long double and rounded to `rounded`: the long double value is
  // itself within 2^-63 of the exact one (64-bit significand), so both count.
  static EB rounded_from(long double exact, double rounded) {
    return {exact, up(std::fabs((long double)rounded - exact) + std::fabs(exact) * 0x1p-63L)};
  }
  // A decimal constant of the config (eps, the softmax scale) converted to the accumulate type:
  // one rounding, u |x|.
  static EB converted(double x);
};

// B.1 addition and subtraction: |fl(x^ +- y^) - (x +- y)| <= ex + ey + u(|x +- y| + ex + ey).
inline EB operator+(const EB& a, const EB& b) {
  const long double v = a.v + b.v, s = a.e + b.e;
  return {v, up(s + units().u * (std::fabs(v) + s))};
}
inline EB operator-(const EB& a) { return {-a.v, a.e}; }
inline EB operator-(const EB& a, const EB& b) { return a + (-b); }
// B.2 multiplication: |x^y^ - xy| <= |x|ey + |y|ex + ex ey, then one rounding.
// An exact zero times an unbounded error is zero, not NaN: the term is |x| e_y with x = 0.
// Both tests are evaluated (no short circuit), so the select needs no branch.
inline long double times0(long double x, long double y) {
  const long double p = x * y;
  return (x == 0) | (y == 0) ? 0 : p;
}
inline EB operator*(const EB& a, const EB& b) {
  const long double v = a.v * b.v;
  // An exact operand (a stored input: e = 0) zeroes two of the three terms; adding those +0s is
  // exact, so skipping them gives the same bits (measured: the default gate's JSON unchanged).
  const long double d =
      b.e == 0   ? times0(std::fabs(b.v), a.e)
      : a.e == 0 ? times0(std::fabs(a.v), b.e)
                 : times0(std::fabs(a.v), b.e) + times0(std::fabs(b.v), a.e) + times0(a.e, b.e);
  return {v, up(d + units().u * (std::fabs(v) + d) + units().eta)};
}
// B.3 division (requires ey < |y|): |x^/y^ - x/y| <= (ex + |x/y| ey) / (|y| - ey), then one
// rounding.
inline EB operator/(const EB& a, const EB& b) {
  const long double v = a.v / b.v;
  const long double den = std::fabs(b.v) - b.e;
  const long double d =
      den > 0 ? (a.e + std::fabs(v) * b.e) / den : std::numeric_limits<long double>::infinity();
  return {v, up(d + units().u * (std::fabs(v) + d) + units().eta)};
}
inline EB& operator+=(EB& a, const EB& b) { return a = a + b; }
inline EB& operator-=(EB& a, const EB& b) { return a = a - b; }
inline EB& operator*=(EB& a, const EB& b) { return a = a * b; }
inline EB& operator/=(EB& a, const EB& b) { return a = a / b; }
// B.4 square root (correctly rounded): |sqrt(x^) - sqrt(x)| <= ex / (sqrt(x) + sqrt(max(x - ex,
// 0))).
inline EB sqrt(const EB& a) {
  const long double v = std::sqrt(a.v);
  const long double den = v + std::sqrt(std::max(a.v - a.e, 0.0L));
  const long double d = den > 0 ? a.e / den : std::sqrt(a.e);
  return {v, up(d + units().u * (v + d))};
}

// B.7 rounding to the stored dtype D: one more relative u_D of the computed value, or half the
// smallest subnormal of D in its subnormal range.
EB store(DType d, const EB& x);
// B.8 softmax over one row (shift-invariant analysis; replaces the generic code for EB).
EB softmax(std::vector<EB>& logits_to_p);

}  // namespace qkmla::bounds

namespace std {
template <>
struct numeric_limits<qkmla::bounds::EB> {
  static qkmla::bounds::EB quiet_NaN() {
    return {std::numeric_limits<long double>::quiet_NaN(), 0};
  }
  static qkmla::bounds::EB infinity() { return {std::numeric_limits<long double>::infinity(), 0}; }
};
}  // namespace std
