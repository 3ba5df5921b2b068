#include "reference/mp.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "core/parallel.hpp"

namespace qkmla::ref {

namespace {
// MPFR keeps constants (log 2, pi, exp internals) in per-thread caches: a worker thread frees its
// own before it ends.
[[maybe_unused]] const bool kFreesThreadCaches = [] {
  thread_exit_hooks().push_back([] { mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE); });
  return true;
}();
// A double held exactly (precision >= 53) at the given precision, one scratch per thread.
mpfr_srcptr exact_double(double d, mpfr_prec_t prec) {
  struct Scratch {
    mpfr_t v;
    Scratch() { mpfr_init2(v, 64); }
    ~Scratch() { mpfr_clear(v); }
  };
  thread_local Scratch s;
  prec = std::max<mpfr_prec_t>(prec, 53);
  if (mpfr_get_prec(s.v) != prec) mpfr_set_prec(s.v, prec);
  set_double(s.v, d);
  return s.v;
}

}  // namespace

void set_double(mpfr_ptr x, double d) {
  uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof bits);
  const auto biased = int((bits >> 52) & 0x7ff);
  const mpfr_prec_t prec = mpfr_get_prec(x);
  if (biased == 0 || biased == 0x7ff || prec < 53) {  // zero, subnormal, inf, NaN: MPFR's way
    mpfr_set_d(x, d, MPFR_RNDN);
    return;
  }
  // d = 0.1f * 2^(biased - 1022): the 53-bit significand at the top of the top limb, every other
  // bit zero, so the value is exact and normalized at any precision >= 53.
  auto* sig = static_cast<mp_limb_t*>(mpfr_custom_get_significand(x));
  const auto n = size_t((prec + 63) / 64);
  for (size_t i = 0; i + 1 < n; ++i) sig[i] = 0;
  sig[n - 1] = ((bits & ((uint64_t(1) << 52) - 1)) | (uint64_t(1) << 52)) << 11;
  const int kind = (bits >> 63) != 0 ? -MPFR_REGULAR_KIND : MPFR_REGULAR_KIND;
  mpfr_custom_init_set(x, kind, mpfr_exp_t(biased - 1022), prec, sig);  // same significand
}

void add_d(mpfr_ptr x, double d) { mpfr_add(x, x, exact_double(d, mpfr_get_prec(x)), MPFR_RNDN); }

void mul_d(mpfr_ptr y, mpfr_srcptr x, double d) {
  mpfr_mul(y, x, exact_double(d, mpfr_get_prec(y)), MPFR_RNDN);
}

namespace {
// Boost counts decimal digits; the smallest digits10 that yields >= bits.
unsigned digits10_for(int bits) {
  unsigned d10 = 1;
  while (boost::multiprecision::detail::digits10_2_2(d10) < unsigned(bits)) ++d10;
  return d10;
}
}  // namespace

std::unique_lock<std::recursive_mutex> own_precision() {
  static std::recursive_mutex m;
  return std::unique_lock<std::recursive_mutex>(m);
}

PrecisionScope::PrecisionScope(int bits) : saved_digits10_(Mp::default_precision()) {
  Mp::default_precision(digits10_for(bits));
}

int PrecisionScope::effective_bits(int bits) {
  return int(boost::multiprecision::detail::digits10_2_2(digits10_for(bits)));
}

PrecisionScope::~PrecisionScope() { Mp::default_precision(saved_digits10_); }

int PrecisionScope::current_bits() { return int(mpfr_get_prec(Mp(0).backend().data())); }

void set_expansion(Mp& x, std::span<const double> terms) {
  set_double(x.backend().data(), terms[0]);
  for (size_t i = 1; i < terms.size(); ++i)
    if (terms[i] != 0) add_d(x.backend().data(), terms[i]);
}

int parts_for(int bits) { return (bits + 51) / 52 + 1; }

void to_parts(const Mp& x, double* out, int parts) {
  Mp rest = x;
  for (int i = 0; i < parts; ++i) {
    out[i] = mpfr_get_d(rest.backend().data(), MPFR_RNDN);
    mpfr_sub_d(rest.backend().data(), rest.backend().data(), out[i], MPFR_RNDN);  // exact
  }
  if (!mpfr_zero_p(rest.backend().data())) throw std::logic_error("to_parts: remainder left");
}

void split_double(const Mp& x, double& hi, double& lo) {
  hi = x.convert_to<double>();
  if (!std::isfinite(hi)) {
    lo = 0;
    return;
  }
  lo = Mp(x - hi).convert_to<double>();
}

PackedMpVec::PackedMpVec() : PackedMpVec(PrecisionScope::current_bits()) {}

PackedMpVec::PackedMpVec(mpfr_prec_t bits)
    : prec_(bits),
      limbs_((mpfr_custom_get_size(prec_) + sizeof(mp_limb_t) - 1) / sizeof(mp_limb_t)) {}

void PackedMpVec::reserve(size_t n) {
  sig_.reserve(n * limbs_);
  exp_.reserve(n);
  kind_.reserve(n);
}

void PackedMpVec::push_back(const Mp& x) {
  resize(size() + 1);
  set(size() - 1, x);
}

void PackedMpVec::resize(size_t n) {
  sig_.resize(n * limbs_);
  exp_.resize(n, 0);
  kind_.resize(n, int8_t(MPFR_ZERO_KIND));
}

void PackedMpVec::set(size_t i, const Mp& x) {
  mp_limb_t* limbs = sig_.data() + i * limbs_;
  mpfr_custom_init(limbs, prec_);
  mpfr_t view;
  mpfr_custom_init_set(view, MPFR_ZERO_KIND, 0, prec_, limbs);
  mpfr_set(view, x.backend().data(), MPFR_RNDN);
  kind_[i] = int8_t(mpfr_custom_get_kind(view));
  const mpfr_exp_t e = mpfr_regular_p(view) ? mpfr_custom_get_exp(view) : 0;
  // MPFR's default exponent range, [1 - 2^30, 2^30 - 1], fits; a caller that widened it may not
  if (e < std::numeric_limits<int32_t>::min() || e > std::numeric_limits<int32_t>::max())
    throw std::overflow_error("PackedMpVec: an exponent beyond 32 bits");
  exp_[i] = int32_t(e);
}

void PackedMpVec::get(size_t i, Mp& out) const {
  mpfr_t view;
  mpfr_custom_init_set(view, kind_[i], exp_[i], prec_, const_cast<mp_limb_t*>(&sig_[i * limbs_]));
  mpfr_set(out.backend().data(), view, MPFR_RNDN);
}

}  // namespace qkmla::ref
