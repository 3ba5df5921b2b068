#include "reference/exact_sum.hpp"

#include <gmp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace qkmla::ref {

namespace {

constexpr int64_t kDigitBits = 32;
constexpr int64_t kLimbBits = 64;
// The window's largest span: 1024 digits (32768 bits, 8 KB per accumulator). Terms further below
// the largest one than that are dropped (see the header).
constexpr int64_t kMaxDigits = 1024;

int64_t limbs_of(mpfr_srcptr x) { return (mpfr_get_prec(x) + kLimbBits - 1) / kLimbBits; }

const mp_limb_t* significand(mpfr_srcptr x) {
  return static_cast<const mp_limb_t*>(mpfr_custom_get_significand(x));
}

// Exponent of the significand's lowest limb bit: x = (integer limbs) * 2^low_exponent(x).
int64_t low_exponent(mpfr_srcptr x) { return int64_t(mpfr_get_exp(x)) - kLimbBits * limbs_of(x); }

// Per-thread scratch: a product's limbs.
thread_local std::vector<mp_limb_t> tl_product;

// All digits but the top one into [0, 2^32), the carries moved up; the top digit keeps the sign.
void carry(std::vector<int64_t>& d) {
  for (size_t i = 0; i + 1 < d.size(); ++i) {
    const int64_t c = d[i] >> kDigitBits;  // arithmetic shift: floor division
    d[i] -= c * (int64_t(1) << kDigitBits);
    d[i + 1] += c;
  }
}

// A finite double as m 2^e with m an integer below 2^53 (zero: m = 0).
void integer_parts(double x, uint64_t& m, int64_t& e) {
  uint64_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  const auto biased = int64_t((bits >> 52) & 0x7ff);
  m = bits & ((uint64_t(1) << 52) - 1);
  if (biased != 0) m |= uint64_t(1) << 52;
  e = (biased != 0 ? biased : 1) - 1075;
}

}  // namespace

void ExactSum::clear() {
  digits_.clear();
  dropped_ = false;
  adds_ = 0;
  special_ = 0;
}

bool ExactSum::reserve_digits(int64_t lo, int64_t hi) {
  if (digits_.empty()) {
    base_ = lo - 4;
    digits_.assign(size_t(hi - lo + 8), 0);
    return true;
  }
  const int64_t top = std::max(base_ + int64_t(digits_.size()), hi);
  const int64_t floor = top - kMaxDigits;  // the lowest digit the window may keep
  if (lo < floor) {                        // the term lies (almost) wholly below it: dropped
    dropped_ = true;
    return false;
  }
  if (base_ < floor) {  // a large term raised the top: the digits below the floor go
    const auto cut = std::min(size_t(floor - base_), digits_.size());  // all, if all lie below
    digits_.erase(digits_.begin(), digits_.begin() + std::ptrdiff_t(cut));
    base_ = floor;
    dropped_ = true;
  }
  if (lo < base_) {
    const int64_t grow = std::min(base_ - lo + 8, base_ - floor);
    digits_.insert(digits_.begin(), size_t(grow), 0);
    base_ -= grow;
  }
  const int64_t end = base_ + int64_t(digits_.size());
  if (hi > end) digits_.resize(digits_.size() + size_t(hi - end + 8), 0);
  return true;
}

void ExactSum::normalize() {
  digits_.push_back(0);  // room for the carries, so the top digit stays small
  carry(digits_);
  adds_ = 0;
}

namespace {
// d[0 .. 2n] += the 32-bit digits of (limbs * 2^s), s < 32, each digit negated when m == -1 (m is 0
// or -1: (v ^ m) - m is v or -v without a branch, as signs of a dot's terms are unpredictable).
// Shifted limb i is limbs[i] << s joined with the bits limbs[i-1] shifted out; the top digit takes
// what limbs[n-1] shifted out (below 2^s). Every digit added is below 2^32 in magnitude. N > 0: the
// number of limbs known at compile time (the loop unrolls).
template <int N = 0>
inline void add_shifted(int64_t* d, const mp_limb_t* limbs, int64_t n, unsigned s, int64_t m) {
  constexpr uint64_t kLow = (uint64_t(1) << kDigitBits) - 1;
  if constexpr (N > 0) n = N;
  // x >> (64 - s) for s in [0, 32) without shifting by 64: (x >> 1) >> (63 - s).
  auto out = [s](mp_limb_t x) { return (x >> 1) >> (63 - s); };
  mp_limb_t prev = 0;
  for (int64_t i = 0; i < n; ++i) {
    const mp_limb_t v = (limbs[i] << s) | out(prev);
    d[2 * i] += (int64_t(v & kLow) ^ m) - m;
    d[2 * i + 1] += (int64_t(v >> kDigitBits) ^ m) - m;
    prev = limbs[i];
  }
  d[2 * n] += (int64_t(out(prev)) ^ m) - m;
}

// p[0, NA + NB) = a[0, NA) * b[0, NB): schoolbook with 128-bit partial products, for the small
// significands of the reference's precisions (114 bits: 2 limbs, 178: 3), where mpn_mul's call
// and size dispatch cost more than the multiplications. Each step's a_i b_j + p + carry is below
// 2^128, so nothing overflows.
template <int NA, int NB>
inline void mul_small(mp_limb_t* p, const mp_limb_t* a, const mp_limb_t* b) {
  for (int i = 0; i < NA + NB; ++i) p[i] = 0;
  for (int i = 0; i < NA; ++i) {
    mp_limb_t carry = 0;
    for (int j = 0; j < NB; ++j) {
      const unsigned __int128 t = static_cast<unsigned __int128>(a[i]) * b[j] + p[i + j] + carry;
      p[i + j] = mp_limb_t(t);
      carry = mp_limb_t(t >> 64);
    }
    p[i + NB] = carry;
  }
}
}  // namespace

template <int N>
[[gnu::always_inline]] inline void ExactSum::add_limbs(const mp_limb_t* limbs, int64_t n, int64_t e,
                                                       bool neg) {
  if constexpr (N > 0) n = N;
  const int64_t q = e >> 5, s = e & 31;  // e = 32 q + s, 0 <= s < 32 (arithmetic shift: floor)
  static_assert(kDigitBits == 32);
  if (digits_.empty() || q < base_ || q + 2 * n + 1 > base_ + int64_t(digits_.size()))
    if (!reserve_digits(q, q + 2 * n + 1)) return;
  add_shifted<N>(digits_.data() + (q - base_), limbs, n, unsigned(s), -int64_t(neg));
  if (++adds_ >= (int64_t(1) << 29)) normalize();  // |digit| < 2^29 * 2^32 < 2^62
}

void ExactSum::add(double x) { add(x, 0); }

void ExactSum::add(double x, int64_t scale2) {
  if (x == 0) return;
  if (!std::isfinite(x)) {
    special_ += x;
    return;
  }
  int e = 0;
  const double m = std::frexp(std::fabs(x), &e);   // |x| = m 2^e, m in [0.5, 1)
  const auto limb = mp_limb_t(std::ldexp(m, 53));  // exact: 53 significant bits
  add_limbs(&limb, 1, int64_t(e) - 53 + scale2, x < 0);
}

void ExactSum::add(mpfr_srcptr x) {
  if (mpfr_zero_p(x)) return;
  if (!mpfr_regular_p(x)) {
    special_ += mpfr_get_d(x, MPFR_RNDN);
    return;
  }
  add_limbs(significand(x), limbs_of(x), low_exponent(x), mpfr_signbit(x) != 0);
}

template <int N>
[[gnu::always_inline]] inline void ExactSum::add_product_limbs(mpfr_srcptr a, mpfr_srcptr b) {
  mp_limb_t p[2 * N];
  mul_small<N, N>(p, significand(a), significand(b));
  const int64_t e = int64_t(mpfr_get_exp(a)) + int64_t(mpfr_get_exp(b)) - 2 * N * kLimbBits;
  add_limbs<2 * N>(p, 2 * N, e, (mpfr_signbit(a) != 0) != (mpfr_signbit(b) != 0));
}

// The reference's own precisions, P (2 limbs) and its check (3), inline; the rest by
// add_product_general.
[[gnu::always_inline]] inline void ExactSum::add_product_inline(mpfr_srcptr x, mpfr_srcptr y) {
  if (mpfr_regular_p(x) && mpfr_regular_p(y) && mpfr_get_prec(x) == mpfr_get_prec(y)) {
    const mpfr_prec_t prec = mpfr_get_prec(x);
    if (prec > kLimbBits && prec <= 2 * kLimbBits) return add_product_limbs<2>(x, y);
    if (prec > 2 * kLimbBits && prec <= 3 * kLimbBits) return add_product_limbs<3>(x, y);
  }
  add_product_general(x, y);
}

void ExactSum::add_dot(std::span<const Mp> a, std::span<const Mp> b) {
  for (size_t j = 0; j < a.size(); ++j)
    add_product_inline(a[j].backend().data(), b[j].backend().data());
}

void ExactSum::add_scaled(std::span<ExactSum> sums, const Mp& a, std::span<const Mp> b) {
  for (size_t j = 0; j < b.size(); ++j)
    sums[j].add_product_inline(a.backend().data(), b[j].backend().data());
}

void ExactSum::add_product(mpfr_srcptr a, mpfr_srcptr b) { add_product_inline(a, b); }

void ExactSum::add_product_general(mpfr_srcptr a, mpfr_srcptr b) {
  if (!mpfr_regular_p(a) || !mpfr_regular_p(b)) {
    if (!mpfr_number_p(a) || !mpfr_number_p(b))
      special_ += mpfr_get_d(a, MPFR_RNDN) * mpfr_get_d(b, MPFR_RNDN);
    return;  // otherwise a zero factor
  }
  if (limbs_of(a) < limbs_of(b)) std::swap(a, b);  // mpn_mul wants the longer operand first
  const int64_t na = limbs_of(a), nb = limbs_of(b);
  std::vector<mp_limb_t>& p = tl_product;
  p.resize(size_t(na + nb));
  mpn_mul(p.data(), significand(a), na, significand(b), nb);
  add_limbs(p.data(), na + nb, low_exponent(a) + low_exponent(b),
            (mpfr_signbit(a) != 0) != (mpfr_signbit(b) != 0));
}

namespace {
// The limbs of a regular value of 2-4 limbs (the reference's P, P + gain bits, the check), else 0:
// the general path.
int inline_limbs(mpfr_srcptr a) {
  if (!mpfr_regular_p(a)) return 0;
  const int64_t n = limbs_of(a);
  return n >= 2 && n <= 4 ? int(n) : 0;
}

// f(std::integral_constant<int, N>) with N = inline_limbs(a): one instantiation per inline width.
template <class F>
void by_limbs(mpfr_srcptr a, F&& f) {
  switch (inline_limbs(a)) {
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    default:
      return f(std::integral_constant<int, 0>{});
  }
}
}  // namespace

template <int N>
[[gnu::always_inline]] inline void ExactSum::add_times_terms(mpfr_srcptr a,
                                                             std::span<const double> terms) {
  if constexpr (N == 0) {
    for (double d : terms)
      if (d != 0) add_product(a, d);
  } else {
    const mp_limb_t* sig = significand(a);
    const int64_t low = low_exponent(a);
    const bool neg = mpfr_signbit(a) != 0;
    for (double d : terms) {
      if (d == 0) continue;
      if (!std::isfinite(d)) {
        add_product(a, d);
        continue;
      }
      uint64_t m = 0;
      int64_t e = 0;
      integer_parts(d, m, e);
      mp_limb_t p[N + 1];
      mul_small<N, 1>(p, sig, &m);
      add_limbs<N + 1>(p, N + 1, low + e, neg != (d < 0));
    }
  }
}

void ExactSum::add_product(mpfr_srcptr a, double x) {
  if (!mpfr_number_p(a) || !std::isfinite(x)) {
    special_ += mpfr_get_d(a, MPFR_RNDN) * x;
    return;
  }
  if (mpfr_zero_p(a) || x == 0) return;
  if (inline_limbs(a) != 0)
    return by_limbs(a, [&](auto n) {
      if constexpr (n() > 0) add_times_terms<n()>(a, std::span<const double>(&x, 1));
    });
  uint64_t limb = 0;
  int64_t e = 0;
  integer_parts(x, limb, e);
  const int64_t na = limbs_of(a);
  std::vector<mp_limb_t>& p = tl_product;
  p.resize(size_t(na + 1));
  p[size_t(na)] = mpn_mul_1(p.data(), significand(a), na, limb);
  add_limbs(p.data(), na + 1, low_exponent(a) + e, (mpfr_signbit(a) != 0) != (x < 0));
}

void ExactSum::add_product(double x, double y, int64_t scale2) {
  if (!std::isfinite(x) || !std::isfinite(y)) {
    special_ += std::ldexp(x * y, int(scale2));
    return;
  }
  if (x == 0 || y == 0) return;
  uint64_t mx = 0, my = 0;
  int64_t ex = 0, ey = 0;
  integer_parts(x, mx, ex);
  integer_parts(y, my, ey);
  const unsigned __int128 p = static_cast<unsigned __int128>(mx) * my;  // below 2^106
  const mp_limb_t limbs[2] = {mp_limb_t(p), mp_limb_t(p >> 64)};
  add_limbs<2>(limbs, 2, ex + ey + scale2, (x < 0) != (y < 0));
}

void ExactSum::add_square(std::span<const double> terms) {
  for (size_t a = 0; a < terms.size(); ++a) {
    if (terms[a] == 0) continue;
    add_product(terms[a], terms[a]);
    for (size_t b = a + 1; b < terms.size(); ++b)
      if (terms[b] != 0) add_product(terms[a], terms[b], 1);  // the two cross terms at once
  }
}

void ExactSum::add_dot(std::span<const Mp> a, std::span<const std::span<const double>> b) {
  for (size_t j = 0; j < a.size(); ++j) {
    mpfr_srcptr x = a[j].backend().data();
    by_limbs(x, [&](auto n) { add_times_terms<n()>(x, b[j]); });
  }
}

void ExactSum::add_scaled(std::span<ExactSum> sums, mpfr_srcptr a, std::span<const double> b) {
  by_limbs(a, [&](auto n) {
    for (size_t j = 0; j < b.size(); ++j) sums[j].add_times_terms<n()>(a, b.subspan(j, 1));
  });
}

void ExactSum::add_scaled(std::span<ExactSum> sums, const Mp& a,
                          std::span<const std::span<const double>> b) {
  mpfr_srcptr x = a.backend().data();
  by_limbs(x, [&](auto n) {
    for (size_t j = 0; j < b.size(); ++j) sums[j].add_times_terms<n()>(x, b[j]);
  });
}

void ExactSum::carried(mpz_t z) const {
  thread_local std::vector<int64_t> d;  // scratch: no allocation per rounding once warm
  thread_local std::vector<mp_limb_t> limbs;
  d.assign(digits_.begin(), digits_.end());
  d.push_back(0);
  d.push_back(0);
  carry(d);
  const bool neg = d.back() < 0;
  if (neg) {  // the magnitude: negate every digit and carry again
    for (int64_t& x : d) x = -x;
    carry(d);
  }
  if (d.size() % 2) d.push_back(0);
  limbs.resize(d.size() / 2);
  for (size_t i = 0; i < limbs.size(); ++i)
    limbs[i] = mp_limb_t(d[2 * i]) | (mp_limb_t(d[2 * i + 1]) << 32);
  auto n = mp_size_t(limbs.size());
  while (n > 0 && limbs[size_t(n - 1)] == 0) --n;
  mpz_roinit_n(z, limbs.data(), neg ? -n : n);
}

void ExactSum::round(mpfr_ptr out) const {
  if (special_ != 0) {
    mpfr_set_d(out, special_, MPFR_RNDN);
    return;
  }
  mpz_t z;
  carried(z);
  mpfr_set_z_2exp(out, z, mpfr_exp_t(kDigitBits * base_), MPFR_RNDN);
}

void ExactSum::value(mpfr_ptr out) const {
  if (special_ != 0) {
    mpfr_set_prec(out, 53);
    mpfr_set_d(out, special_, MPFR_RNDN);
    return;
  }
  mpz_t z;
  carried(z);
  // significant bits: from the top set bit down to the lowest set bit (none when zero)
  const auto bits =
      mpz_sgn(z) == 0 ? mpfr_prec_t(0) : mpfr_prec_t(mpz_sizeinbase(z, 2) - mpz_scan1(z, 0));
  mpfr_set_prec(out, std::max<mpfr_prec_t>(bits, MPFR_PREC_MIN));
  mpfr_set_z_2exp(out, z, mpfr_exp_t(kDigitBits * base_), MPFR_RNDN);  // exact at that precision
}

}  // namespace qkmla::ref
