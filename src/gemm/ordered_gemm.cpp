// ordered_gemm for each Highway target; foreach_target.h compiles this file once per target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "gemm/ordered_gemm.cpp"
#include "gemm/ordered_gemm.hpp"

#include <hwy/aligned_allocator.h>
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

HWY_BEFORE_NAMESPACE();
namespace qkmla::gemm::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register tile of Y: MR rows x NV vectors; 4 x 4 where there are 32 vector registers (AVX-512),
// 4 x 2 where there are 16. The packed panel of W (kKc inner indices) stays in L1.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kNV = 4;
#else
constexpr int kNV = 2;
#endif
constexpr int kMR = 4;
constexpr int64_t kKc = 128;

// Rows [0, MR) of Y's panel (NV vectors wide) continue their sums over inner indices
// [p0, p0 + np) from the packed panel bp [np][NV * N]; `first`: the sums start at +0.
template <class T, bool kFused, int MR, int NV>
HWY_INLINE void Tile(const T* X, int64_t ldx, const T* bp, T* Y, int64_t ldy, int64_t p0,
                     int64_t np, bool first) {
  const hn::ScalableTag<T> d;
  const size_t N = hn::Lanes(d);
  hn::Vec<decltype(d)> acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = first ? hn::Zero(d) : hn::LoadU(d, Y + r * ldy + v * N);
  for (int64_t p = 0; p < np; ++p) {
    hn::Vec<decltype(d)> w[NV];
    for (int v = 0; v < NV; ++v) w[v] = hn::Load(d, bp + (p * NV + v) * N);
    for (int r = 0; r < MR; ++r) {
      const auto x = hn::Set(d, X[r * ldx + p0 + p]);
      for (int v = 0; v < NV; ++v)
        acc[r][v] = kFused ? hn::MulAdd(x, w[v], acc[r][v]) : hn::Add(acc[r][v], hn::Mul(x, w[v]));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[r][v], d, Y + r * ldy + v * N);
}

// Columns [j, j + NV * N) of every row.
template <class T, bool kFused, int NV>
void Panel(const T* X, int64_t rows, int64_t n, const T* W, int64_t ld, int64_t cols, T* Y,
           int64_t j, T* bp) {
  const hn::ScalableTag<T> d;
  const int64_t width = NV * int64_t(hn::Lanes(d));
  for (int64_t p0 = 0; p0 < n; p0 += kKc) {
    const int64_t np = std::min(kKc, n - p0);
    for (int64_t p = 0; p < np; ++p) std::copy_n(W + (p0 + p) * ld + j, width, bp + p * width);
    int64_t i = 0;
    for (; i + kMR <= rows; i += kMR)
      Tile<T, kFused, kMR, NV>(X + i * n, n, bp, Y + i * cols + j, cols, p0, np, p0 == 0);
    for (; i < rows; ++i)
      Tile<T, kFused, 1, NV>(X + i * n, n, bp, Y + i * cols + j, cols, p0, np, p0 == 0);
  }
}

// Columns [j0, cols) of every row as the scalar sums themselves.
template <class T, bool kFused>
void ScalarColumns(const T* X, int64_t rows, int64_t n, const T* W, int64_t ld, int64_t cols, T* Y,
                   int64_t j0) {
  for (int64_t j = j0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) {
      T s = T(0);
      for (int64_t p = 0; p < n; ++p)
        s = kFused ? std::fma(X[i * n + p], W[p * ld + j], s) : s + X[i * n + p] * W[p * ld + j];
      Y[i * cols + j] = s;
    }
}

template <class T, bool kFused>
void Columns(const T* X, int64_t rows, int64_t n, const T* W, int64_t ld, int64_t cols, T* Y) {
  const hn::ScalableTag<T> d;
  const int64_t N = int64_t(hn::Lanes(d));
  auto bp = hwy::AllocateAligned<T>(size_t(std::min(n, kKc) * kNV * N));
  int64_t j = 0;
  for (; j + kNV * N <= cols; j += kNV * N)
    Panel<T, kFused, kNV>(X, rows, n, W, ld, cols, Y, j, bp.get());
  for (; j + N <= cols; j += N) Panel<T, kFused, 1>(X, rows, n, W, ld, cols, Y, j, bp.get());
  ScalarColumns<T, kFused>(X, rows, n, W, ld, cols, Y, j);  // columns left over
}

template <class T>
void Gemm(const T* X, int64_t rows, int n, const T* W, int64_t ld, int cols, T* Y, bool fused) {
  if (rows <= 0 || cols <= 0) return;
  if (n <= 0) return std::fill(Y, Y + rows * cols, T(0));
  if (!fused) return Columns<T, false>(X, rows, n, W, ld, cols, Y);
#if HWY_NATIVE_FMA
  Columns<T, true>(X, rows, n, W, ld, cols, Y);
#else
  ScalarColumns<T, true>(X, rows, n, W, ld, cols, Y, 0);  // no native fma: std::fma per term
#endif
}

void GemmF32(const float* X, int64_t rows, int n, const float* W, int64_t ld, int cols, float* Y,
             bool fused) {
  Gemm(X, rows, n, W, ld, cols, Y, fused);
}
void GemmF64(const double* X, int64_t rows, int n, const double* W, int64_t ld, int cols, double* Y,
             bool fused) {
  Gemm(X, rows, n, W, ld, cols, Y, fused);
}

int64_t Target() { return HWY_TARGET; }

}  // namespace qkmla::gemm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkmla::gemm {

HWY_EXPORT(GemmF32);
HWY_EXPORT(GemmF64);
HWY_EXPORT(Target);

void ordered_gemm(const float* X, int64_t rows, int n, const float* W, int64_t ld, int cols,
                  float* Y, Fused f) {
  HWY_DYNAMIC_DISPATCH(GemmF32)(X, rows, n, W, ld, cols, Y, f == Fused::Yes);
}
void ordered_gemm(const double* X, int64_t rows, int n, const double* W, int64_t ld, int cols,
                  double* Y, Fused f) {
  HWY_DYNAMIC_DISPATCH(GemmF64)(X, rows, n, W, ld, cols, Y, f == Fused::Yes);
}

std::string ordered_gemm_target() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(Target)()); }

void for_each_simd_target(const std::function<void(const std::string&)>& f) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    try {
      f(hwy::TargetName(target));
    } catch (...) {
      hwy::SetSupportedTargetsForTest(0);
      throw;
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace qkmla::gemm
#endif
