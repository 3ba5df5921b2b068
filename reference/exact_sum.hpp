// X.6: sums of products held exactly, rounded once (proofs/reference.md, step X.6).
//
// A fixed-point accumulator over 32-bit digits kept in int64 slots: a term's integer significand
// (MPFR limbs, a double's 53 bits, or their product) is shifted onto the digit grid and added
// digit by digit, so every addition is exact and carries are deferred (each slot takes 2^29
// additions of less than 2^32 before it is normalized). The window of digits grows to the terms'
// span, up to 2^15 bits (8 KB): see dropped(). round() is the one rounding: the exact value,
// carried out, into MPFR by mpfr_set_z_2exp (correctly rounded, to nearest). Non-finite terms make
// the sum non-finite as double arithmetic would (inf + -inf = NaN).
#pragma once
#include <gmp.h>
#include <mpfr.h>

#include <cstdint>
#include <span>
#include <vector>

#include "reference/mp.hpp"

namespace qkmla::ref {

class ExactSum {
 public:
  void clear();
  void add(double d);
  void add(double d, int64_t scale2);  // += d * 2^scale2, exactly
  void add(mpfr_srcptr x);
  void add_product(mpfr_srcptr a, mpfr_srcptr b);            // += a * b, exactly
  void add_product(mpfr_srcptr a, double d);                 // += a * d, exactly
  void add_product(double x, double y, int64_t scale2 = 0);  // += x * y * 2^scale2, exactly
  // X.7, values times exact products' expansions (each b_j the terms of one entry, their sum
  // exact): += (sum of the terms)^2; += sum_j a_j (sum of b_j's terms).
  void add_square(std::span<const double> terms);
  void add_dot(std::span<const Mp> a, std::span<const std::span<const double>> b);
  // sums[j] += a * (sum of b_j's terms) for every j (sums at least as long as b).
  static void add_scaled(std::span<ExactSum> sums, const Mp& a,
                         std::span<const std::span<const double>> b);
  void add_dot(std::span<const Mp> a, std::span<const Mp> b);  // += sum_j a_j b_j (a, b one size)
  // sums[j] += a * b_j for every j (sums at least as long as b).
  static void add_scaled(std::span<ExactSum> sums, const Mp& a, std::span<const Mp> b);
  static void add_scaled(std::span<ExactSum> sums, mpfr_srcptr a, std::span<const double> b);
  // out = the exact sum rounded once to nearest (even) at out's precision; 0 when empty.
  void round(mpfr_ptr out) const;
  // out = the exact sum itself: out's precision is set to the sum's significant bits (at least
  // MPFR_PREC_MIN), so nothing rounds (X.8); a non-finite sum as a 53-bit value.
  void value(mpfr_ptr out) const;
  // Whether anything was dropped: the window keeps 2^15 bits below the largest term's top digit,
  // and terms (or digits) further down are dropped, an absolute error below n * 2^-32000 times the
  // largest term (n terms). It matters only where the terms cancel to within that: the rounded
  // result is exact whenever nothing was dropped.
  bool dropped() const { return dropped_; }

 private:
  // += (integer in n little-endian limbs) * 2^e, negated when `neg`; N > 0: n == N, known at
  // compile time.
  template <int N = 0>
  void add_limbs(const mp_limb_t* limbs, int64_t n, int64_t e, bool neg);
  void add_product_inline(mpfr_srcptr x, mpfr_srcptr y);
  void add_product_general(mpfr_srcptr x, mpfr_srcptr y);  // any precisions, zero, non-finite
  // += a * b for regular a, b of one precision in N limbs.
  template <int N>
  void add_product_limbs(mpfr_srcptr a, mpfr_srcptr b);
  // += a * (sum of the terms) with a's significand in N limbs (N = 0: any a, by add_product).
  template <int N>
  void add_times_terms(mpfr_srcptr a, std::span<const double> terms);
  // Digit indices [lo, hi) exist; false when the term must be dropped (below the window).
  bool reserve_digits(int64_t lo, int64_t hi);
  void normalize();
  // The sum carried out as sign and magnitude: z reads this thread's scratch limbs (valid until
  // the next call on this thread), the value is z * 2^(32 base_).
  void carried(mpz_t z) const;

  std::vector<int64_t> digits_;  // digits_[i]: a signed multiple of 2^(32 (base_ + i))
  int64_t base_ = 0;
  int64_t adds_ = 0;      // additions since the last normalize()
  double special_ = 0;    // the sum of the non-finite terms (0: none)
  bool dropped_ = false;  // a term or digits fell below the window
};

}  // namespace qkmla::ref
