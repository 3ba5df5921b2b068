#include "exact_dot.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace qkmla::ref {

namespace {

constexpr int kBlock = 64;  // columns per vectorized block

// X.1: Veltkamp split x = hi + lo with hi, lo of at most 26 significant bits each, so that every
// product of two parts is exact in double.
void split(double x, double& hi, double& lo) {
  const double c = 134217729.0 * x;  // 2^27 + 1
  hi = c - (c - x);
  lo = x - hi;
}

bool narrow(double x) { return double(float(x)) == x; }  // <= 24 bits: products exact

void check_range(const double* p, int64_t count, int64_t stride, int64_t width, const char* what) {
  for (int64_t r = 0; r < count; ++r)
    for (int64_t j = 0; j < width; ++j) {
      const double a = std::fabs(p[r * stride + j]);
      if (!std::isfinite(a) || (a != 0 && (a < 0x1p-400 || a > 0x1p400)))
        throw std::domain_error(std::string("exact_matmul: ") + what + " entry " +
                                std::to_string(p[r * stride + j]) +
                                " outside the exact range [2^-400, 2^400]");
    }
}

// Expanded operands: A'' [m, n*parts^2] and B'' [n*parts^2, k] such that every product of
// matching entries is exact and the dot products are unchanged.
struct Expanded {
  int64_t n2 = 0;
  std::vector<double> a, b;
};

Expanded expand(const double* A, int64_t lda, int64_t m, int64_t n, const double* B, int64_t ldb,
                int64_t k) {
  bool all_narrow = true;
  for (int64_t i = 0; i < m && all_narrow; ++i)
    for (int64_t l = 0; l < n; ++l) all_narrow &= narrow(A[i * lda + l]);
  for (int64_t l = 0; l < n && all_narrow; ++l)
    for (int64_t j = 0; j < k; ++j) all_narrow &= narrow(B[l * ldb + j]);
  const int parts = all_narrow ? 1 : 2;
  Expanded e;
  e.n2 = n * parts * parts;
  e.a.resize(size_t(m * e.n2));
  e.b.resize(size_t(e.n2 * k));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < n; ++l) {
      double h = A[i * lda + l], lo = 0;
      if (parts == 2) split(A[i * lda + l], h, lo);
      double* dst = &e.a[size_t(i * e.n2 + l * parts * parts)];
      if (parts == 1) dst[0] = h;
      else dst[0] = dst[1] = h, dst[2] = dst[3] = lo;
    }
  for (int64_t l = 0; l < n; ++l)
    for (int64_t j = 0; j < k; ++j) {
      double h = B[l * ldb + j], lo = 0;
      if (parts == 2) split(B[l * ldb + j], h, lo);
      for (int x = 0; x < parts * parts; ++x)
        e.b[size_t((l * parts * parts + x) * k + j)] = (parts == 1 || x % 2 == 0) ? h : lo;
    }
  return e;
}

// X.2: sigma = 2^e with 2^M * max|p| <= sigma where n2 < 2^M (Rump-Ogita-Oishi, ExtractVector).
double top_sigma(double bound, int M) {
  if (bound == 0) return 0;
  return std::ldexp(1.0, std::ilogb(bound) + 1 + M);
}

// Scalar fallback: extraction repeated until nothing is left (terminates: each level removes
// 53 - M bits from every residual).
std::vector<double> exact_sum(std::vector<double> p, int M) {
  std::vector<double> terms;
  for (int level = 0; level < 200; ++level) {
    double mx = 0;
    for (double v : p) mx = std::max(mx, std::fabs(v));
    if (mx == 0) return terms;
    const double sigma = top_sigma(mx, M);
    double tau = 0;
    for (double& v : p) {
      const double q = (sigma + v) - sigma;
      tau += q;
      v -= q;
    }
    terms.push_back(tau);
  }
  throw std::logic_error("exact_sum: extraction did not terminate");
}

}  // namespace

std::span<const double> ExactProduct::entry(int64_t i, int64_t j) const {
  const int64_t flat = i * cols + j;
  if (auto it = long_terms_.find(flat); it != long_terms_.end()) return it->second;
  return {&terms_[size_t(flat * kLevels)], size_t(kLevels)};
}

ExactProduct exact_matmul(const double* A, int64_t lda, int64_t m, int64_t n, const double* B,
                          int64_t ldb, int64_t k) {
  check_range(A, m, lda, n, "A");
  check_range(B, n, ldb, k, "B");
  const Expanded e = expand(A, lda, m, n, B, ldb, k);
  int M = 1;
  while ((int64_t(1) << M) <= e.n2) ++M;
  const double level_shrink = std::ldexp(1.0, M - 53);  // sigma_{k+1} = 2^M eps sigma_k
  std::vector<double> colmax(size_t(k), 0.0);
  for (int64_t l = 0; l < e.n2; ++l)
    for (int64_t j = 0; j < k; ++j)
      colmax[size_t(j)] = std::max(colmax[size_t(j)], std::fabs(e.b[size_t(l * k + j)]));
  ExactProduct out;
  out.rows = m;
  out.cols = k;
  out.terms_.assign(size_t(m * k * ExactProduct::kLevels), 0.0);
  constexpr int L = ExactProduct::kLevels;
  for (int64_t i = 0; i < m; ++i) {
    const double* a = &e.a[size_t(i * e.n2)];
    double rowmax = 0;
    for (int64_t l = 0; l < e.n2; ++l) rowmax = std::max(rowmax, std::fabs(a[l]));
    for (int64_t j0 = 0; j0 < k; j0 += kBlock) {
      const int jb = int(std::min<int64_t>(kBlock, k - j0));
      double sigma[L][kBlock], tau[L][kBlock] = {}, rest[kBlock] = {};
      for (int j = 0; j < jb; ++j) {
        // rowmax * colmax may round down, but never below 2^ilogb of the true bound.
        sigma[0][j] = top_sigma(rowmax * colmax[size_t(j0 + j)], M);
        for (int lv = 1; lv < L; ++lv) sigma[lv][j] = sigma[lv - 1][j] * level_shrink;
      }
      for (int64_t l = 0; l < e.n2; ++l) {
        const double al = a[l];
        const double* bl = &e.b[size_t(l * k + j0)];
        for (int j = 0; j < jb; ++j) {  // independent lanes: vectorizes, no reassociation
          double p = al * bl[j];
          for (int lv = 0; lv < L; ++lv) {
            const double q = (sigma[lv][j] + p) - sigma[lv][j];
            tau[lv][j] += q;
            p -= q;
          }
          rest[j] = std::max(rest[j], std::fabs(p));
        }
      }
      for (int j = 0; j < jb; ++j) {
        const int64_t flat = i * k + j0 + j;
        if (rest[j] == 0) {
          for (int lv = 0; lv < L; ++lv) out.terms_[size_t(flat * L + lv)] = tau[lv][j];
          continue;
        }
        std::vector<double> p(size_t(e.n2));
        for (int64_t l = 0; l < e.n2; ++l) p[size_t(l)] = a[l] * e.b[size_t(l * k + j0 + j)];
        out.long_terms_[flat] = exact_sum(std::move(p), M);
      }
    }
  }
  return out;
}

}  // namespace qkmla::ref
