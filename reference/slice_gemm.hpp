// The GEMMs of X.5 (proofs/reference.md): C = A * B in plain double arithmetic, summed in an
// order of the kernel's own. Only for slice matrices, whose every partial sum is an integer below
// 2^53 times one power of two: exact in any order, with or without fma, so every instruction set
// gives the same bits. SIMD by Google Highway with dispatch at run time (AVX-512 where the CPU has
// it, AVX2, SSE4 or scalar otherwise), so one binary runs anywhere.
#pragma once
#include <cstdint>
#include <string>

namespace qkmla::ref {

// C [m, kc] (row stride ldc) = A [m, n] (row stride lda) times B [n, kc] (row stride ldb).
void slice_gemm(const double* A, int64_t lda, const double* B, int64_t ldb, double* C, int64_t ldc,
                int64_t m, int64_t n, int64_t kc);

// The instruction set slice_gemm dispatches to on this CPU (e.g. "AVX3"), for reports.
std::string slice_gemm_target();

}  // namespace qkmla::ref
