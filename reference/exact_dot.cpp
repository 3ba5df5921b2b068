#include "reference/exact_dot.hpp"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

namespace qkmla::ref {

namespace {

constexpr int kBlock = 8;  // columns per vectorized block: the L*2 accumulators stay in registers

// X.1: Veltkamp split x = hi + lo with hi, lo of at most 26 significant bits each, so that every
// product of two parts is exact in double.
void split(double x, double& hi, double& lo) {
  const double c = 134217729.0 * x;  // 2^27 + 1
  hi = c - (c - x);
  lo = x - hi;
}

bool narrow(double x) { return double(float(x)) == x; }  // <= 24 bits: products exact

}  // namespace

void check_exact_range(const double* p, int64_t count, int64_t stride, int64_t width,
                       const char* what) {
  for (int64_t r = 0; r < count; ++r)
    for (int64_t j = 0; j < width; ++j) {
      const double a = std::fabs(p[r * stride + j]);
      if (!std::isfinite(a) || (a != 0 && (a < 0x1p-400 || a > 0x1p400)))
        throw std::domain_error(std::string("exact_matmul: ") + what + " entry " +
                                std::to_string(p[r * stride + j]) +
                                " outside the exact range [2^-400, 2^400]");
    }
}

namespace {

// Expanded operands: A'' [m, n*parts^2] and B'' [n*parts^2, k] such that every product of
// matching entries is exact and the dot products are unchanged.
struct Expanded {
  bool two_prod = false;  // products need their fma error term to be exact
  int64_t n2 = 0;
  int64_t kp = 0;  // columns of b, padded with zeros to whole blocks (no ragged inner loop)
  std::vector<double> a, b;
};

bool all_narrow(const double* p, int64_t rows, int64_t stride, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      if (!narrow(p[i * stride + j])) return false;
  return true;
}

// Veltkamp halves per operand: 2 where some operand is wide and products have no fma.
int parts_of(bool every_narrow) {
#ifdef __FMA__
  (void)every_narrow;
  return 1;  // wide products are made exact by fma instead (two_prod in the kernel)
#else
  return every_narrow ? 1 : 2;
#endif
}

// `every_narrow`: whether every operand of the product (or of the whole product) is narrow.
Expanded expand(const double* A, int64_t lda, int64_t m, int64_t n, const double* B, int64_t ldb,
                int64_t k, bool every_narrow) {
  const int parts = parts_of(every_narrow);
  Expanded e;
  e.two_prod = !every_narrow && parts == 1;
  e.n2 = n * parts * parts;
  e.a.resize(size_t(m * e.n2));
  e.kp = (k + kBlock - 1) / kBlock * kBlock;
  e.b.assign(size_t(e.n2 * e.kp), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < n; ++l) {
      double h = A[i * lda + l], lo = 0;
      if (parts == 2) split(A[i * lda + l], h, lo);
      double* dst = &e.a[size_t(i * e.n2 + l * parts * parts)];
      if (parts == 1)
        dst[0] = h;
      else
        dst[0] = dst[1] = h, dst[2] = dst[3] = lo;
    }
  for (int64_t l = 0; l < n; ++l)
    for (int64_t j = 0; j < k; ++j) {
      double h = B[l * ldb + j], lo = 0;
      if (parts == 2) split(B[l * ldb + j], h, lo);
      for (int x = 0; x < parts * parts; ++x)
        e.b[size_t((l * parts * parts + x) * e.kp + j)] = (parts == 1 || x % 2 == 0) ? h : lo;
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

struct TermPool {  // take_terms' arrays: those of destroyed products, by capacity
  std::mutex m;
  std::vector<std::vector<double>> free;
};
TermPool& term_pool() {
  static TermPool pool;
  return pool;
}
}  // namespace

std::vector<double> take_terms(size_t n) {
  std::vector<double> v;
  if (n * sizeof(double) >= kPooledBytes) {  // the smallest pooled array that holds n
    TermPool& pool = term_pool();
    const std::lock_guard<std::mutex> lock(pool.m);
    auto best = pool.free.end();
    for (auto it = pool.free.begin(); it != pool.free.end(); ++it)
      if (it->capacity() >= n && (best == pool.free.end() || it->capacity() < best->capacity()))
        best = it;
    if (best != pool.free.end()) {
      v = std::move(*best);
      pool.free.erase(best);
    }
  }
  v.assign(n, 0.0);  // within the capacity: no new pages
  return v;
}

void drain_term_pool() {
  TermPool& pool = term_pool();
  std::vector<std::vector<double>> gone;
  {
    const std::lock_guard<std::mutex> lock(pool.m);
    gone.swap(pool.free);
  }
}

ExactProduct::~ExactProduct() {
  if (terms_.capacity() * sizeof(double) < kPooledBytes) return;
  TermPool& pool = term_pool();
  const std::lock_guard<std::mutex> lock(pool.m);
  if (pool.free.size() < kPooledArrays) pool.free.push_back(std::move(terms_));
}

std::span<const double> ExactProduct::entry(int64_t i, int64_t j) const {
  const int64_t flat = i * cols + j;
  const double* inline_terms = &terms_[size_t(flat * levels_)];
  if (std::isnan(inline_terms[0])) return long_terms_.find(flat)->second;  // marked by mark_long
  return {inline_terms, size_t(levels_)};
}

void ExactProduct::mark_long() {
  for (const auto& [flat, terms] : long_terms_)
    terms_[size_t(flat * levels_)] = std::numeric_limits<double>::quiet_NaN();
}

ExactProduct ExactProduct::of(int64_t rows, int64_t cols, int levels, std::vector<double> terms,
                              std::unordered_map<int64_t, std::vector<double>> long_terms) {
  if (levels < 1 || levels > kLevels || int64_t(terms.size()) != rows * cols * levels)
    throw std::logic_error("ExactProduct::of: terms do not match [rows, cols, levels]");
  ExactProduct p;
  p.rows = rows, p.cols = cols, p.levels_ = levels, p.terms_ = std::move(terms);
  p.long_terms_ = std::move(long_terms);
  p.mark_long();
  return p;
}

int ExactProduct::max_terms() const {
  size_t n = size_t(levels_);
  for (const auto& [flat, terms] : long_terms_) n = std::max(n, terms.size());
  return int(n);
}

namespace {

using v4d = double __attribute__((vector_size(32)));  // four independent lanes (GCC/Clang)
constexpr int kVec = 4, kBlockVecs = kBlock / kVec;

int min_trailing_exponent(const std::vector<double>& v) {
  int e = 1 << 20;
  for (double x : v)
    if (x != 0) e = std::min(e, trailing_exponent(x));
  return e;
}

// One row of C, one block of kBlock columns: L - 1 extraction levels, then the residuals are
// summed plainly. With L from levels_needed() that last sum is exact (X.2): every residual is a
// multiple of 2^e_low and every partial sum is below sigma_L <= 2^(e_low + 52).
template <int L, bool kTwoProd>
void block_kernel(const double* a, int64_t n2, const double* b, int64_t ldb, int64_t k, int64_t j0,
                  const double* colmax, double rowmax, int M, double shrink, double* terms) {
  const int jb = int(std::min<int64_t>(kBlock, k - j0));
  alignas(32) double sig[L][kBlock] = {};
  for (int j = 0; j < jb; ++j) {
    sig[0][j] = top_sigma(rowmax * colmax[j0 + j], M);
    for (int lv = 1; lv < L; ++lv) sig[lv][j] = sig[lv - 1][j] * shrink;
  }
  v4d s[L][kBlockVecs], t[L][kBlockVecs];
  for (int lv = 0; lv < L; ++lv)
    for (int v = 0; v < kBlockVecs; ++v) {
      std::memcpy(&s[lv][v], &sig[lv][v * kVec], sizeof(v4d));
      t[lv][v] = v4d{0, 0, 0, 0};
    }
  for (int64_t l = 0; l < n2; ++l) {
    const double* src = b + l * ldb + j0;  // zero-padded past column k: zero products
    const v4d al = v4d{a[l], a[l], a[l], a[l]};
    for (int v = 0; v < kBlockVecs; ++v) {
      v4d bv;
      std::memcpy(&bv, src + v * kVec, sizeof(v4d));
      v4d p = al * bv;
      if constexpr (kTwoProd) {
#ifdef __FMA__
        // X.1 with fma: a*b = p + err exactly; |err| <= 2^-M sigma_2, so it enters at level 2.
        v4d err = v4d(_mm256_fmadd_pd(__m256d(al), __m256d(bv), __m256d(-p)));
        for (int lv = 1; lv < L - 1; ++lv) {
          const v4d q = (s[lv][v] + err) - s[lv][v];
          t[lv][v] += q;
          err -= q;
        }
        t[L - 1][v] += err;  // last level: a plain, provably exact sum (X.2)
#endif
      }
      for (int lv = 0; lv < L - 1; ++lv) {
        const v4d q = (s[lv][v] + p) - s[lv][v];
        t[lv][v] += q;
        p -= q;
      }
      t[L - 1][v] += p;  // last level: a plain, provably exact sum (X.2)
    }
  }
  for (int j = 0; j < jb; ++j)
    for (int lv = 0; lv < L; ++lv)
      terms[(j0 + j) * ExactProduct::kLevels + lv] = t[lv][j / kVec][j % kVec];
}

template <bool kTwoProd>
void dispatch(int L, const double* a, int64_t n2, const double* b, int64_t ldb, int64_t k,
              int64_t j0, const double* colmax, double rowmax, int M, double shrink,
              double* terms) {
  switch (L) {
    case 1:
      block_kernel<1, kTwoProd>(a, n2, b, ldb, k, j0, colmax, rowmax, M, shrink, terms);
      break;
    case 2:
      block_kernel<2, kTwoProd>(a, n2, b, ldb, k, j0, colmax, rowmax, M, shrink, terms);
      break;
    case 3:
      block_kernel<3, kTwoProd>(a, n2, b, ldb, k, j0, colmax, rowmax, M, shrink, terms);
      break;
    default:
      block_kernel<4, kTwoProd>(a, n2, b, ldb, k, j0, colmax, rowmax, M, shrink, terms);
      break;
  }
}

// X.2: the number of levels after which every residual is zero: all products are multiples of
// 2^e_low, and a value on that grid is extracted whole once the level grid 2 eps sigma_L is no
// coarser than 2^e_low.
int levels_needed(double sigma_max, double shrink, int e_low) {
  double sigma = sigma_max;
  for (int L = 1; L <= 64; ++L) {
    if (std::ldexp(sigma, -52) <= std::ldexp(1.0, e_low)) return L;
    sigma *= shrink;
  }
  return 65;
}

}  // namespace

void WholeB::add(const double* p, int64_t rows, int64_t stride, int64_t cols) {
  narrow = narrow && all_narrow(p, rows, stride, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double x = p[i * stride + j];
      if (x == 0) continue;
      double hi, lo;
      split(x, hi, lo);
      max_whole = std::max(max_whole, std::fabs(x));
      max_split = std::max({max_split, std::fabs(hi), std::fabs(lo)});
      low_whole = std::min(low_whole, trailing_exponent(x));
      low_split = std::min(low_split, trailing_exponent(hi));
      if (lo != 0) low_split = std::min(low_split, trailing_exponent(lo));
    }
}

ExactProduct exact_matmul(const double* A, int64_t lda, int64_t m, int64_t n, const double* B,
                          int64_t ldb, int64_t k, const WholeB* whole) {
  check_exact_range(A, m, lda, n, "A");
  check_exact_range(B, n, ldb, k, "B");
  const bool narrow_here = all_narrow(B, n, ldb, k);
  if (whole && whole->narrow && !narrow_here)
    throw std::logic_error("exact_matmul: B is not part of the B its summary describes");
  const bool b_narrow = whole ? whole->narrow : narrow_here;
  const Expanded e = expand(A, lda, m, n, B, ldb, k, b_narrow && all_narrow(A, m, lda, n));
  const int64_t summands = e.two_prod ? 2 * e.n2 : e.n2;
  int M = 1;
  while ((int64_t(1) << M) <= summands) ++M;
  const double shrink = std::ldexp(1.0, M - 53);  // sigma_{k+1} = 2^M eps sigma_k
  std::vector<double> colmax(size_t(e.kp), 0.0), rowmax(size_t(m), 0.0);
  for (int64_t l = 0; l < e.n2; ++l)
    for (int64_t j = 0; j < k; ++j)
      colmax[size_t(j)] = std::max(colmax[size_t(j)], std::fabs(e.b[size_t(l * e.kp + j)]));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < e.n2; ++l)
      rowmax[size_t(i)] = std::max(rowmax[size_t(i)], std::fabs(e.a[size_t(i * e.n2 + l)]));
  // X.2: levels per row, from the row's own magnitude and trailing bits (rows of very different
  // scales, such as the parts of a multiprecision value, each get what they need).
  const bool halves = e.n2 != n;  // B entered as Veltkamp halves
  const double bmax = whole ? (halves ? whole->max_split : whole->max_whole)
                            : (k ? *std::max_element(colmax.begin(), colmax.end()) : 0.0);
  const int b_low =
      whole ? (halves ? whole->low_split : whole->low_whole) : min_trailing_exponent(e.b);
  std::vector<int> levels(size_t(m), 1);
  for (int64_t i = 0; i < m; ++i) {
    const std::vector<double> row(e.a.begin() + i * e.n2, e.a.begin() + (i + 1) * e.n2);
    levels[size_t(i)] = levels_needed(top_sigma(rowmax[size_t(i)] * bmax, M), shrink,
                                      min_trailing_exponent(row) + b_low);
  }
  ExactProduct out;
  out.rows = m;
  out.cols = k;
  out.terms_ = take_terms(size_t(m * k * ExactProduct::kLevels));
  // Column blocks outside, rows inside: a [n2, kBlock] slab of B stays in cache for all rows.
  auto rows = [&](int64_t i0, int64_t i1) {
    for (int64_t j0 = 0; j0 < k; j0 += kBlock)
      for (int64_t i = i0; i < i1; ++i) {
        if (levels[size_t(i)] > ExactProduct::kLevels) continue;  // done by the scalar path
        const double* a = &e.a[size_t(i * e.n2)];
        double* terms = &out.terms_[size_t(i * k * ExactProduct::kLevels)];
        const double rm = rowmax[size_t(i)];
        const double* b = e.b.data();
        if (e.two_prod)
          dispatch<true>(levels[size_t(i)], a, e.n2, b, e.kp, k, j0, colmax.data(), rm, M, shrink,
                         terms);
        else
          dispatch<false>(levels[size_t(i)], a, e.n2, b, e.kp, k, j0, colmax.data(), rm, M, shrink,
                          terms);
      }
  };
  for (int64_t i = 0; i < m; ++i) {  // extreme exponent spread: scalar extraction, entry by entry
    if (levels[size_t(i)] <= ExactProduct::kLevels) continue;
    for (int64_t j = 0; j < k; ++j) {
      std::vector<double> p;
      for (int64_t l = 0; l < e.n2; ++l) {
        const double x = e.a[size_t(i * e.n2 + l)], y = e.b[size_t(l * e.kp + j)];
        p.push_back(x * y);
        if (e.two_prod) p.push_back(std::fma(x, y, -p.back()));
      }
      out.long_terms_[i * k + j] = exact_sum(std::move(p), M);
    }
  }
  rows(0, m);  // single-threaded: callers run independent products side by side
  out.mark_long();
  return out;
}

}  // namespace qkmla::ref
