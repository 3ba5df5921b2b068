// The projections of the CPU model and of the CPU implementations: Y = X . W where every output is
// ONE sequential sum over the inner index, l = 0, 1, ..., n-1, starting from +0, rounded after each
// step in the element type: either the product, then the add (Fused::No: the CPU implementations'
// `y += x * w`), or one fma per term (Fused::Yes: the kernels' fmaf). SIMD runs across outputs
// only, never inside a sum, so every instruction set gives the bits of the scalar loop. Google
// Highway, dispatched at run time (fused terms fall back to scalar std::fma on an instruction set
// without a native fma, whose emulated MulAdd would round twice).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace qkmla::gemm {

enum class Fused { No, Yes };

// Y [rows, cols] (row stride cols) = X [rows, n] (row stride n) . W [n, cols] (row stride ld).
void ordered_gemm(const float* X, int64_t rows, int n, const float* W, int64_t ld, int cols,
                  float* Y, Fused f);
void ordered_gemm(const double* X, int64_t rows, int n, const double* W, int64_t ld, int cols,
                  double* Y, Fused f);

// The instruction set ordered_gemm dispatches to on this CPU (e.g. "AVX3"), for reports.
std::string ordered_gemm_target();

// Tests: calls f with each instruction set of this CPU forced in turn (its name as argument), then
// restores the normal dispatch. Highway's forcing is process-wide, so it forces every dispatched
// kernel at once: this GEMM, the reference's slice GEMMs and the error-bound type's axpy.
void for_each_simd_target(const std::function<void(const std::string&)>& f);

}  // namespace qkmla::gemm
