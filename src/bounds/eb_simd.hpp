// The error-bound type's hot loops, vectorized: y[j] += c * x[j] over a row and many dots (B.1, B.2
// in every lane exactly as EB's scalar operators compute them: the same operations in the same
// order, no fused multiply-add, so every instruction set gives the scalar bits). Google Highway,
// dispatched at run time.
#pragma once
#include <cstdint>

#include "bounds/error_bound.hpp"

namespace qkmla::bounds {

// y[j] = y[j] + c * x[j] for j < n, with units() of the calling thread.
void eb_axpy(const EB& c, const EB* x, EB* y, int64_t n);
// out[u] = the dot of a and row u (rows + u * stride), n terms from +0 in increasing order, for
// u < m: ordered_sum's value for each row.
void eb_dots(const EB* a, const EB* rows, int64_t stride, int64_t m, int n, EB* out);

}  // namespace qkmla::bounds
