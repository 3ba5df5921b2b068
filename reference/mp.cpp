#include "mp.hpp"

#include <cmath>

namespace qkmla::ref {

PrecisionScope::PrecisionScope(int bits) : saved_digits10_(Mp::default_precision()) {
  // Boost counts decimal digits; pick the smallest digits10 that yields >= bits.
  unsigned d10 = 1;
  while (boost::multiprecision::detail::digits10_2_2(d10) < unsigned(bits)) ++d10;
  Mp::default_precision(d10);
}

PrecisionScope::~PrecisionScope() { Mp::default_precision(saved_digits10_); }

int PrecisionScope::current_bits() { return int(mpfr_get_prec(Mp(0).backend().data())); }

void set_expansion(Mp& x, std::span<const double> terms) {
  mpfr_set_d(x.backend().data(), terms[0], MPFR_RNDN);
  for (size_t i = 1; i < terms.size(); ++i)
    if (terms[i] != 0) mpfr_add_d(x.backend().data(), x.backend().data(), terms[i], MPFR_RNDN);
}

void split_double(const Mp& x, double& hi, double& lo) {
  hi = x.convert_to<double>();
  if (!std::isfinite(hi)) {
    lo = 0;
    return;
  }
  lo = Mp(x - hi).convert_to<double>();
}

}  // namespace qkmla::ref
