// Kernel vs model: do two implementations agree bit for bit on their common tensors? (The CUDA
// kernels against their CPU model, gpu/README.md.)
#pragma once
#include <string>

#include "core/outputs.hpp"

namespace qkmla {

// "a vs b: bit-identical on all N elements", or "K of N elements differ (first: ...)"; values
// compared as fp32 bits, NaN equal to NaN.
std::string bitwise_summary(const Outputs& a, const Outputs& b);

}  // namespace qkmla
