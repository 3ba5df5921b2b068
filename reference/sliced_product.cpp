#include "reference/sliced_product.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_map>

#include "reference/slice_gemm.hpp"

namespace qkmla::ref {

namespace {

constexpr int64_t kChunk = 256;  // rows of A per GEMM: each chunk gets only the slices it needs
constexpr int64_t kTile = 512;   // columns of B per GEMM: bounds the scratch of GEMM terms

struct Bits {
  int top = 0;   // every |x| < 2^top
  int span = 0;  // top minus the lowest set bit's exponent; 0 when every x is zero
};

Bits bits_of(const double* x, int64_t count, int64_t stride) {
  int top = std::numeric_limits<int>::min(), low = std::numeric_limits<int>::max();
  for (int64_t i = 0; i < count; ++i) {
    const double v = x[i * stride];
    if (v == 0) continue;
    top = std::max(top, top_exponent(v));
    low = std::min(low, trailing_exponent(v));
  }
  if (low == std::numeric_limits<int>::max()) return {};
  return {top, top - low};
}

int slices_for(int span, int beta) { return (span + beta - 1) / beta; }

// Cuts the values x[i * stride] (all |x| < 2^top) into `count` slices of beta bits: slice s is the
// part on the grid 2^(top - beta (s + 1)), an integer below 2^beta times that power of two, written
// to out[s * out_step + i * out_stride]. Scaling by a power of two is exact here: every scaled
// value lies between 2^-900 and 2^beta (X.5), far from under- and overflow; r - piece only clears
// bits.
void slice(const double* x, int64_t n, int64_t stride, int top, int beta, int count, double* out,
           int64_t out_step, int64_t out_stride) {
  double down[64], up[64];
  for (int s = 0; s < count; ++s) {
    down[s] = std::ldexp(1.0, beta * (s + 1) - top);
    up[s] = std::ldexp(1.0, top - beta * (s + 1));
  }
  for (int64_t i = 0; i < n; ++i) {
    double r = x[i * stride];
    for (int s = 0; s < count; ++s) {
      const double piece = std::trunc(r * down[s]) * up[s];
      out[s * out_step + i * out_stride] = piece;
      r -= piece;
    }
    if (r != 0) throw std::logic_error("sliced products: a value is not covered by its slices");
  }
}

// Shewchuk's Grow-Expansion with zero elimination (Discrete Comput. Geom. 18, 1997, Thm. 10):
// adds b to the nonoverlapping expansion h[0 .. len) (increasing magnitude) with exact two-sums,
// keeping it nonoverlapping; returns its new length (at most len + 1). Nothing is rounded away: the
// sum of h stays the exact sum of what was added.
int grow(double* h, int len, double b) {
  if (b == 0) return len;
  int out = 0;
  double q = b;
  for (int i = 0; i < len; ++i) {
    const double s = q + h[i], bv = s - q, err = (q - (s - bv)) + (h[i] - bv);
    q = s;
    if (err != 0) h[out++] = err;
  }
  if (q != 0) h[out++] = q;
  return out;
}

// Every entry of the [rows, cols] matrix (row stride ld) fits a float: at most 24 significant
// bits in float's range (a storage choice only: wider entries just go long).
bool all_narrow(const double* p, int64_t rows, int64_t ld, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      if (double(float(p[i * ld + j])) != p[i * ld + j]) return false;
  return true;
}

// Writes the exact sum of terms[w * stride], w < width, as a nonoverlapping expansion, largest
// term first: inline when it has at most `levels` terms (zero padded), else into `long_terms`.
// `h` is scratch of at least width + 1 doubles.
void compress(const double* terms, int64_t stride, int width, int64_t flat, double* inline_terms,
              int levels, std::unordered_map<int64_t, std::vector<double>>& long_terms, double* h) {
  int len = 0;
  for (int w = 0; w < width; ++w) len = grow(h, len, terms[w * stride]);
  if (len <= levels) {
    for (int i = 0; i < len; ++i) inline_terms[i] = h[len - 1 - i];
    return;
  }
  std::vector<double>& e = long_terms[flat];
  e.assign(h, h + len);
  std::reverse(e.begin(), e.end());
}

}  // namespace

std::vector<int> row_spans(const double* A, int64_t lda, int64_t m, int64_t n) {
  std::vector<int> spans{};
  spans.resize(size_t(m));
  for (int64_t i = 0; i < m; ++i) spans[size_t(i)] = bits_of(A + i * lda, n, 1).span;
  return spans;
}

// bits_of for every column, read row by row (a column's stride would miss the cache on every
// element of a large B); min and max do not depend on the order.
std::vector<int> col_spans(const double* B, int64_t ldb, int64_t n, int64_t k) {
  std::vector<int> top(size_t(k), std::numeric_limits<int>::min()),
      low(size_t(k), std::numeric_limits<int>::max()), spans(size_t(k), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const double v = B[i * ldb + j];
      if (v == 0) continue;
      top[size_t(j)] = std::max(top[size_t(j)], top_exponent(v));
      low[size_t(j)] = std::min(low[size_t(j)], trailing_exponent(v));
    }
  for (int64_t j = 0; j < k; ++j)
    if (low[size_t(j)] != std::numeric_limits<int>::max())
      spans[size_t(j)] = top[size_t(j)] - low[size_t(j)];
  return spans;
}

Slicing plan_slicing(std::span<const int> a_spans, std::span<const int> b_spans, int64_t n) {
  const int log_n = n <= 1 ? 0 : int(std::bit_width(uint64_t(n - 1)));  // ceil(log2 n)
  const int total = 53 - log_n;
  if (total < 2)
    throw std::domain_error("sliced products: inner dimension " + std::to_string(n) +
                            " leaves fewer than 2 bits per slice");
  Slicing best;
  best.gemms_per_chunk = std::numeric_limits<double>::infinity();
  for (int beta_b = 1; beta_b < total; ++beta_b) {
    const int beta_a = total - beta_b;
    int sb = 1;
    for (int s : b_spans) sb = std::max(sb, slices_for(s, beta_b));
    int sa_max = 1;
    double sum = 0.0;
    int64_t chunks = 0;
    for (size_t i0 = 0; i0 < a_spans.size(); i0 += size_t(kChunk), ++chunks) {
      int sa = 1;
      for (size_t i = i0; i < std::min(a_spans.size(), i0 + size_t(kChunk)); ++i)
        sa = std::max(sa, slices_for(a_spans[i], beta_a));
      sum += sa;
      sa_max = std::max(sa_max, sa);
    }
    const double cost = sb * (chunks ? sum / double(chunks) : 1.0);
    if (cost < best.gemms_per_chunk) best = {beta_a, beta_b, sa_max, sb, cost};
  }
  if (best.slices_a > 64 || best.slices_b > 64)
    throw std::domain_error("sliced products: operands span too many binades to slice");
  return best;
}

SlicedWeights::SlicedWeights(const double* B, int64_t ldb, int64_t n_, int64_t k_, const Slicing& s)
    : n(n_), k(k_), plan(s) {
  check_exact_range(B, n, ldb, k, "B");
  narrow = all_narrow(B, n, ldb, k);
  slices.assign(size_t(s.slices_b), std::vector<double>(size_t(n * k), 0.0));
  std::vector<double> column(size_t(s.slices_b * n));
  for (int64_t j = 0; j < k; ++j) {
    const Bits b = bits_of(B + j, n, ldb);
    const int count = slices_for(b.span, s.beta_b);
    if (count > s.slices_b)
      throw std::logic_error("sliced products: a column needs more slices than planned");
    slice(B + j, n, ldb, b.top, s.beta_b, count, column.data(), n, 1);
    for (int t = 0; t < count; ++t)
      for (int64_t l = 0; l < n; ++l)
        slices[size_t(t)][size_t(l * k + j)] = column[size_t(t * n + l)];
  }
}

SlicedProduct::SlicedProduct(const double* A, int64_t lda, int64_t m, const SlicedWeights& W)
    : m_(m), W_(W) {
  const int64_t n = W.n;
  const Slicing& p = W.plan;
  check_exact_range(A, m, lda, n, "A");
  // Narrow operands (bf16, fp16, fp32, fp8 data): entries had 1 or 2 terms in every case measured
  // (paper-decode, 4096 tokens: 16.8 M entries per product), so 2 slots inline; wider entries
  // still go long, with the same terms. fp64 data: 2 or 3 terms, kLevels slots.
  levels_ = W.narrow && all_narrow(A, m, lda, W.n) ? 2 : ExactProduct::kLevels;
  terms_ = take_terms(size_t(m * W.k * levels_));  // [m, k, levels_], zero
  long_terms_.resize(size_t(tiles()));
  // Each chunk of kChunk rows is cut into only the slices its rows need, once for every tile.
  std::vector<Bits> rows(size_t(std::min(kChunk, m)));
  for (int64_t i0 = 0; i0 < m; i0 += kChunk) {
    const int64_t mc = std::min(kChunk, m - i0);
    int sa = 0;
    for (int64_t r = 0; r < mc; ++r) {
      rows[size_t(r)] = bits_of(A + (i0 + r) * lda, n, 1);
      sa = std::max(sa, slices_for(rows[size_t(r)].span, p.beta_a));
    }
    if (sa > p.slices_a)
      throw std::logic_error("sliced products: a row needs more slices than planned");
    const size_t at = a_.size();
    chunks_.push_back({at, sa});
    a_.resize(at + size_t(sa * mc * n), 0.0);
    for (int64_t r = 0; r < mc; ++r)
      slice(A + (i0 + r) * lda, n, 1, rows[size_t(r)].top, p.beta_a,
            slices_for(rows[size_t(r)].span, p.beta_a), &a_[at + size_t(r * n)], mc * n, 1);
  }
}

int64_t SlicedProduct::tiles_for(int64_t k) { return (k + kTile - 1) / kTile; }

// Columns [j0, j0 + kTile) of every row, a chunk of rows at a time: the GEMM terms of the chunk's
// entries are small scratch, summed into their expansions before the next chunk.
void SlicedProduct::tile(int64_t i) {
  const int64_t n = W_.n, k = W_.k, j0 = i * kTile, kc = std::min(kTile, k - j0);
  const Slicing& p = W_.plan;
  std::vector<double> parts;  // [GEMMs][chunk rows, kc]: every GEMM's terms
  std::vector<double> h;
  for (int64_t i0 = 0; i0 < m_; i0 += kChunk) {
    const int64_t mc = std::min(kChunk, m_ - i0);
    const auto [at, sa] = chunks_[size_t(i0 / kChunk)];  // [sa, mc, n] slices of the rows
    const int used = sa * p.slices_b;                    // GEMMs this chunk needs
    parts.resize(size_t(used * mc * kc));
    for (int s = 0; s < sa; ++s)
      for (int t = 0; t < p.slices_b; ++t)  // [mc, n] slice s of the rows times [n, kc] slice t
        slice_gemm(&a_[at + size_t(s * mc * n)], n, W_.slices[size_t(t)].data() + j0, k,
                   &parts[size_t((s * p.slices_b + t) * mc * kc)], kc, mc, n, kc);  // exact (X.5)
    h.resize(size_t(used + 1));
    for (int64_t r = 0; r < mc; ++r)
      for (int64_t j = 0; j < kc; ++j) {  // entry (r, j)'s GEMM terms lie mc * kc apart
        const int64_t flat = (i0 + r) * k + j0 + j;
        compress(&parts[size_t(r * kc + j)], mc * kc, used, flat, &terms_[size_t(flat * levels_)],
                 levels_, long_terms_[size_t(i)], h.data());
      }
  }
}

ExactProduct SlicedProduct::finish() {
  std::unordered_map<int64_t, std::vector<double>> long_terms;
  for (auto& t : long_terms_) long_terms.merge(t);
  return ExactProduct::of(m_, W_.k, levels_, std::move(terms_), std::move(long_terms));
}

ExactProduct sliced_matmul(const double* A, int64_t lda, int64_t m, const SlicedWeights& W) {
  SlicedProduct product(A, lda, m, W);
  for (int64_t i = 0; i < product.tiles(); ++i) product.tile(i);
  return product.finish();
}

}  // namespace qkmla::ref
