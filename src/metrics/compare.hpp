// The one comparator (conventions §5): every implementation's tensors are judged by this code.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"

namespace qkmla {

struct Worst {
  std::vector<int64_t> index;  // multi-index into the tensor; empty when nothing was compared
  double value = 0, ref = 0;
};

struct Metrics {
  double max_abs = 0, max_ulp = 0, rel_l2 = 0, cos_diff = 0;
  int64_t nonfinite_mismatch = 0;
  int64_t compared = 0;  // positions where both values are finite
  Worst worst;           // position of max_abs
  double bound_ratio =
      std::numeric_limits<double>::quiet_NaN();  // max |x - y| / bound, if a bound is known
};

// max over compared positions of |x - y| / (bound + 2^-100 |y|): <= 1 when every element lies
// within its proven forward error bound (proofs/error_bounds.md); the 2^-100 |y| term is the
// reference's own error (it agrees with its 2P run on more than 100 bits).
double bound_ratio(const Tensor& x, const Tensor& y, const Tensor& bound,
                   const std::vector<bool>& mask);

// x against the reference y. x_lo / y_lo (optional, same shape) carry double-double remainders
// of multiprecision results so that two references can be compared to ~106 bits. ulp_dtype is
// the format whose ulp max_ulp counts in. Positions where both are the same non-finite value
// (NaN/NaN, or equal infinities) match and are not measured.
Metrics compare(const Tensor& x, const Tensor& y, DType ulp_dtype, const std::vector<bool>& mask,
                const Tensor* x_lo = nullptr, const Tensor* y_lo = nullptr);

// Bits on which two results agree: -log2 of the worst normwise relative difference over rows
// (the last dimension of out/latent_out; single values for lse, alpha_q, alpha_k). lse is
// measured relative to max(|lse|, 1), an absolute error where it is small. Capped at 120.
double agreeing_bits(const Case& k, const Outputs& a, const Outputs& b,
                     const std::vector<std::string>& tensors);

}  // namespace qkmla
