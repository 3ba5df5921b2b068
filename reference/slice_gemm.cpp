// slice_gemm for each Highway target; foreach_target.h compiles this file once per target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "reference/slice_gemm.cpp"
#include "reference/slice_gemm.hpp"

#include <hwy/aligned_allocator.h>
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include <algorithm>

HWY_BEFORE_NAMESPACE();
namespace qkmla::ref::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register tile of C: 4 rows x 4 vectors (16 accumulators) where there are 32 registers
// (AVX-512), 6 rows x 2 vectors where there are 16 (measured best of 4x4, 6x4, 8x3 and 4x2, 4x3,
// 6x2 on Zen 5; 8x3 and 4x3 spill).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kNV = 4;
constexpr int kMR = 4;  // rows of C per register tile
#else
constexpr int kNV = 2;
constexpr int kMR = 6;
#endif
constexpr int64_t kKc = 128;  // inner indices per pass: the packed B panel stays in L1
using D = hn::ScalableTag<double>;

// Rows [0, MR) of C's panel (kNV vectors wide) += A's rows times the packed panel bp [np][kNV*N]
// over inner indices [p0, p0 + np); `first`: C starts at zero instead.
template <int MR>
HWY_INLINE void Tile(const double* A, int64_t lda, const double* bp, double* C, int64_t ldc,
                     int64_t p0, int64_t np, bool first) {
  const D d;
  const size_t N = hn::Lanes(d);
  hn::Vec<D> acc[MR][kNV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kNV; ++v)
      acc[r][v] = first ? hn::Zero(d) : hn::LoadU(d, C + r * ldc + v * N);
  for (int64_t p = 0; p < np; ++p) {
    hn::Vec<D> b[kNV];
    for (int v = 0; v < kNV; ++v) b[v] = hn::Load(d, bp + (p * kNV + v) * N);
    for (int r = 0; r < MR; ++r) {
      const auto a = hn::Set(d, A[r * lda + p0 + p]);
      for (int v = 0; v < kNV; ++v) acc[r][v] = hn::MulAdd(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kNV; ++v) hn::StoreU(acc[r][v], d, C + r * ldc + v * N);
}

void SliceGemm(const double* A, int64_t lda, const double* B, int64_t ldb, double* C, int64_t ldc,
               int64_t m, int64_t n, int64_t kc) {
  const D d;
  const int64_t width = kNV * int64_t(hn::Lanes(d));  // columns per panel
  auto bp = hwy::AllocateAligned<double>(size_t(std::min(n, kKc) * width));
  int64_t j = 0;
  for (; j + width <= kc; j += width)
    for (int64_t p0 = 0; p0 < n; p0 += kKc) {
      const int64_t np = std::min(kKc, n - p0);
      for (int64_t p = 0; p < np; ++p)
        std::copy_n(B + (p0 + p) * ldb + j, width, bp.get() + p * width);
      int64_t i = 0;
      for (; i + kMR <= m; i += kMR)
        Tile<kMR>(A + i * lda, lda, bp.get(), C + i * ldc + j, ldc, p0, np, p0 == 0);
      for (; i < m; ++i) Tile<1>(A + i * lda, lda, bp.get(), C + i * ldc + j, ldc, p0, np, p0 == 0);
    }
  for (; j < kc; ++j)  // columns left over: scalar sums (exact as well)
    for (int64_t i = 0; i < m; ++i) {
      double s = 0.0;
      for (int64_t p = 0; p < n; ++p) s += A[i * lda + p] * B[p * ldb + j];
      C[i * ldc + j] = s;
    }
}

int64_t Target() { return HWY_TARGET; }

}  // namespace qkmla::ref::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkmla::ref {

HWY_EXPORT(SliceGemm);
HWY_EXPORT(Target);

void slice_gemm(const double* A, int64_t lda, const double* B, int64_t ldb, double* C, int64_t ldc,
                int64_t m, int64_t n, int64_t kc) {
  HWY_DYNAMIC_DISPATCH(SliceGemm)(A, lda, B, ldb, C, ldc, m, n, kc);
}

std::string slice_gemm_target() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(Target)()); }

}  // namespace qkmla::ref
#endif
