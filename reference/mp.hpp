// The reference's number type: Boost.Multiprecision over MPFR, precision chosen at run time.
#pragma once
#include <boost/multiprecision/mpfr.hpp>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace qkmla::ref {

using Mp = boost::multiprecision::mpfr_float;

// Boost 1.74 keeps one process-wide default precision (no per-thread one), which PrecisionScope
// sets. A computation that sets it (a truth, the convergence ladder) holds this lock for its whole
// run, so that computations started from several threads at once (the C++ and Python APIs allow
// it) run one after another instead of setting it under each other. Recursive: a holder may start
// a nested one on its own thread.
std::unique_lock<std::recursive_mutex> own_precision();

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
  static int effective_bits(int bits);  // the precision a scope asked for `bits` sets

 private:
  unsigned saved_digits10_;
};

// x = d, exactly (the precision is at least 53 bits here), as mpfr_set_d does, bit for bit: a
// normal double's significand written into x's own limbs (MPFR's custom interface re-labels the
// same storage, so x stays owned by whoever allocated it), ~4x as fast as mpfr_set_d at 114 bits;
// other values (zero, subnormal, inf, NaN, or a precision below 53) go through mpfr_set_d.
void set_double(mpfr_ptr x, double d);

// x += d and y = x * d with the rounding of mpfr_add_d and mpfr_mul_d (one correct rounding of the
// exact result into the destination's precision), through a per-thread scratch of the
// destination's precision that holds d exactly: MPFR's same-precision fast paths (add1sp, mul_2)
// instead of the mixed-precision general ones. The same bits; in a microbenchmark at 114 and 178
// bits, 1.4-2.0x (add) and 1.0-1.5x (mul) as fast as MPFR's own.
void add_d(mpfr_ptr x, double d);
void mul_d(mpfr_ptr y, mpfr_srcptr x, double d);

// Exact sum of an expansion, rounded into the current precision (proofs step X.3): x is set to
// the first term, then each further term is added with one rounding.
void set_expansion(Mp& x, std::span<const double> terms);

// Exact split of x into `parts` doubles (x == sum, each the nearest double to what is left),
// so that dot products with x can run in exact_matmul (step X.4). parts_for() is large enough
// for the current precision; throws std::logic_error if a remainder is left.
int parts_for(int bits);
void to_parts(const Mp& x, double* out, int parts);

// The nearest double to x and the nearest double to the remainder: a double-double image of x
// (~106 bits), enough to measure agreement between two reference runs.
void split_double(const Mp& x, double& hi, double& lo);

// Values of one precision packed in plain arrays through MPFR's custom interface (significand
// limbs, exponent and kind per value): ~21 B per 114-bit value instead of ~64 B for a
// heap-allocated Mp. Values are stored and read back exactly; the precision is the default at
// construction, or the one given.
class PackedMpVec {
 public:
  PackedMpVec();
  explicit PackedMpVec(mpfr_prec_t bits);
  void reserve(size_t n);
  void push_back(const Mp& x);        // rounds if x is more precise than the vector (never here)
  void resize(size_t n);              // new values are zero
  void set(size_t i, const Mp& x);    // as push_back; distinct i may be set concurrently
  void get(size_t i, Mp& out) const;  // exact when out is at least as precise as the vector
  size_t size() const { return exp_.size(); }

 private:
  mpfr_prec_t prec_;
  size_t limbs_;
  std::vector<mp_limb_t> sig_;  // [size, limbs_]
  std::vector<int32_t> exp_;    // [size]: the exponent (set() refuses one beyond int32)
  std::vector<int8_t> kind_;    // [size]: MPFR kind, negative for negative values
};

}  // namespace qkmla::ref
