// The reference's number type: Boost.Multiprecision over MPFR, precision chosen at run time.
#pragma once
#include <boost/multiprecision/mpfr.hpp>
#include <span>

namespace qkmla::ref {

using Mp = boost::multiprecision::mpfr_float;

// Sets the precision (bits) of every Mp constructed in its lifetime. Boost keeps this default in
// one global, so a scope must not change while other threads construct Mp values: callers run
// all work of one precision inside one scope.
class PrecisionScope {
 public:
  explicit PrecisionScope(int bits);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;
  static int current_bits();

 private:
  unsigned saved_digits10_;
};

// Exact sum of an expansion, rounded into the current precision (proofs step X.3): x is set to
// the first term, then each further term is added with one rounding.
void set_expansion(Mp& x, std::span<const double> terms);

// acc += a * b with one product rounding and one sum rounding (tmp is scratch of the same
// precision; passing it avoids an allocation per call).
inline void mac(Mp& acc, const Mp& a, const Mp& b, Mp& tmp) {
  mpfr_mul(tmp.backend().data(), a.backend().data(), b.backend().data(), MPFR_RNDN);
  mpfr_add(acc.backend().data(), acc.backend().data(), tmp.backend().data(), MPFR_RNDN);
}

// Exact split of x into `parts` doubles (x == sum, each the nearest double to what is left),
// so that dot products with x can run in exact_matmul (step X.4). parts_for() is large enough
// for the current precision; throws std::logic_error if a remainder is left.
int parts_for(int bits);
void to_parts(const Mp& x, double* out, int parts);

// x += the exact value of an expansion, one rounding per term.
void add_expansion(Mp& x, std::span<const double> terms);

// The nearest double to x and the nearest double to the remainder: a double-double image of x
// (~106 bits), enough to measure agreement between two reference runs.
void split_double(const Mp& x, double& hi, double& lo);

}  // namespace qkmla::ref
