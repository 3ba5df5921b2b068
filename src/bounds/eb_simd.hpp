// The error-bound type's one hot loop, vectorized: y[j] += c * x[j] over a row (B.1, B.2 in every
// lane exactly as EB's scalar operators compute them: the same operations in the same order, no
// fused multiply-add, so every instruction set gives the scalar bits). Google Highway, dispatched
// at run time.
#pragma once
#include <cstdint>

#include "bounds/error_bound.hpp"

namespace qkmla::bounds {

// y[j] = y[j] + c * x[j] for j < n, with units() of the calling thread.
void eb_axpy(const EB& c, const EB* x, EB* y, int64_t n);

}  // namespace qkmla::bounds
