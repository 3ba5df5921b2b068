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
constexpr int kMaxSlices = 64;   // slices of one row or column at most
// What one remainder costs per entry of the product it touches, in a slice GEMM's multiply-adds:
// an exact product (fma) and two steps of Grow-Expansion. Measured on [1024x512]x[512x2048] fp64
// (one slice of B replaced by 1.05 M remainders): ~20 ns each, against 0.085 ns per multiply-add
// of a GEMM with its expansions (0.03-0.04 ns for the GEMM alone), so 600 errs towards slices.
// Only the plan depends on it, never a value.
constexpr double kRemainderMacs = 600;

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

void count_depth(std::vector<int64_t>& depths, int depth) {
  if (size_t(depth) >= depths.size()) depths.resize(size_t(depth) + 1, 0);
  ++depths[size_t(depth)];
}

int slices_for(int span, int beta) { return (span + beta - 1) / beta; }

// Cuts the values x[i * stride] (all |x| < 2^top) into `count` slices of beta bits: slice s is the
// part on the grid 2^(top - beta (s + 1)), an integer below 2^beta times that power of two, written
// to out[s * out_step + i * out_stride]. Scaling by a power of two is exact here: every scaled
// value lies between 2^-900 and 2^beta (X.5), far from under- and overflow; r - piece only clears
// bits. What the slices leave of value i goes to `rest` as {i, r} (null: nothing may be left).
void slice(const double* x, int64_t n, int64_t stride, int top, int beta, int count, double* out,
           int64_t out_step, int64_t out_stride, std::vector<Remainder>* rest) {
  double down[kMaxSlices], up[kMaxSlices];
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
    if (r == 0) continue;
    if (!rest) throw std::logic_error("sliced products: a value is not covered by its slices");
    rest->push_back({int32_t(i), r});
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

// h += x * y exactly: the product is p + e with p = fl(x y), e = fma(x, y, -p) (Ogita, Rump and
// Oishi's TwoProduct). x and y lie within [2^-452, 2^400] (X.1's range, or a value's low bits),
// so e is a multiple of at least 2^-904: no underflow.
int grow_product(double* h, int len, double x, double y) {
  const double p = x * y;
  return grow(h, grow(h, len, p), std::fma(x, y, -p));
}

// Every entry of the [rows, cols] matrix (row stride ld) fits a float: at most 24 significant
// bits in float's range (a storage choice only: wider entries just go long).
bool all_narrow(const double* p, int64_t rows, int64_t ld, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      if (double(float(p[i * ld + j])) != p[i * ld + j]) return false;
  return true;
}

// Writes the expansion h[0 .. len) (increasing magnitude), largest term first: inline when it has
// at most `levels` terms (zero padded), else into `long_terms`.
void emit(const double* h, int len, int64_t flat, double* inline_terms, int levels,
          std::unordered_map<int64_t, std::vector<double>>& long_terms) {
  if (len <= levels) {
    for (int i = 0; i < len; ++i) inline_terms[i] = h[len - 1 - i];
    return;
  }
  std::vector<double>& e = long_terms[flat];
  e.assign(h, h + len);
  std::reverse(e.begin(), e.end());
}

// Values deeper than s * beta bits, for s = 0 .. kMaxSlices.
std::vector<int64_t> deeper_than(const std::vector<int64_t>& depths, int beta) {
  std::vector<int64_t> out(kMaxSlices + 1, 0);
  for (size_t d = 0; d < depths.size(); ++d)
    for (int s = 0; s <= kMaxSlices && int64_t(s) * beta < int64_t(d); ++s)
      out[size_t(s)] += depths[d];
  return out;
}

// plan_slicing's search; `rest`: whether values may lie deeper than their slices.
Slicing plan(const Spans& a, const Spans& b, int64_t n, bool rest) {
  const int log_n = n <= 1 ? 0 : int(std::bit_width(uint64_t(n - 1)));  // ceil(log2 n)
  const int total = 53 - log_n;
  if (total < 2)
    throw std::domain_error("sliced products: inner dimension " + std::to_string(n) +
                            " leaves fewer than 2 bits per slice");
  const auto m = int64_t(a.per_line.size()), k = int64_t(b.per_line.size());
  const int64_t chunks = std::max<int64_t>(1, (m + kChunk - 1) / kChunk);
  // Costs in multiply-adds; a GEMM of one chunk is mean-chunk-rows x n x k of them. Without rows
  // (no tokens) the plan is priced as for one row, so that B is not cut into slices or remainders
  // that nothing would pay for.
  const double gemm = double(std::max<int64_t>(m, 1)) / double(chunks) * double(n) * double(k);
  Slicing best;
  best.gemms_per_chunk = std::numeric_limits<double>::infinity();
  for (int beta_b = 1; beta_b < total; ++beta_b) {
    const int beta_a = total - beta_b;
    int need_b = 1;
    for (int s : b.per_line) need_b = std::max(need_b, slices_for(s, beta_b));
    // rows_at[c]: rows of A whose chunk needs c slices (capped at kMaxSlices + 1)
    std::vector<int64_t> rows_at(kMaxSlices + 2, 0);
    int need_a = 1;
    for (int64_t i0 = 0; i0 < m; i0 += kChunk) {
      int sa = 1;
      for (int64_t i = i0; i < std::min(m, i0 + kChunk); ++i)
        sa = std::max(sa, slices_for(a.per_line[size_t(i)], beta_a));
      need_a = std::max(need_a, sa);
      rows_at[size_t(std::min(sa, kMaxSlices + 1))] += std::min(m, i0 + kChunk) - i0;
    }
    if (m == 0) rows_at[1] = 1;
    if (!rest && (need_a > kMaxSlices || need_b > kMaxSlices)) continue;
    const std::vector<int64_t> deep_a = deeper_than(a.depths, beta_a),
                               deep_b = deeper_than(b.depths, beta_b);
    const int top_a = std::min(need_a, kMaxSlices), top_b = std::min(need_b, kMaxSlices);
    for (int ca = rest ? 1 : top_a; ca <= top_a; ++ca) {
      double row_slices = 0;  // sum over rows of the slices their chunk is cut into
      for (int c = 1; c <= kMaxSlices + 1; ++c)
        row_slices += double(std::min(c, ca)) * double(rows_at[size_t(c)]);
      for (int cb = rest ? 1 : top_b; cb <= top_b; ++cb) {
        const double macs =
            row_slices * double(cb) * double(n) * double(k) +
            kRemainderMacs * (double(deep_a[size_t(ca)]) * double(k) +
                              double(deep_b[size_t(cb)]) * double(std::max<int64_t>(m, 1)));
        const double cost = macs / gemm / double(chunks);
        if (cost < best.gemms_per_chunk)
          best = {beta_a, beta_b, ca, cb, cost, deep_a[size_t(ca)], deep_b[size_t(cb)]};
      }
    }
  }
  if (best.slices_a == 0)
    throw std::domain_error("sliced products: operands span too many binades to slice");
  return best;
}

}  // namespace

void Spans::append(const Spans& more) {
  per_line.insert(per_line.end(), more.per_line.begin(), more.per_line.end());
  if (more.depths.size() > depths.size()) depths.resize(more.depths.size(), 0);
  for (size_t d = 0; d < more.depths.size(); ++d) depths[d] += more.depths[d];
}

Spans row_spans(const double* A, int64_t lda, int64_t m, int64_t n) {
  Spans out;
  out.per_line.resize(size_t(m));
  for (int64_t i = 0; i < m; ++i) {
    const double* row = A + i * lda;
    const Bits b = bits_of(row, n, 1);
    out.per_line[size_t(i)] = b.span;
    for (int64_t l = 0; l < n; ++l)
      if (row[l] != 0) count_depth(out.depths, b.top - trailing_exponent(row[l]));
  }
  return out;
}

// bits_of for every column, read row by row (a column's stride would miss the cache on every
// element of a large B); min and max do not depend on the order.
Spans col_spans(const double* B, int64_t ldb, int64_t n, int64_t k) {
  std::vector<int> top(size_t(k), std::numeric_limits<int>::min()),
      low(size_t(k), std::numeric_limits<int>::max());
  Spans out;
  out.per_line.assign(size_t(k), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const double v = B[i * ldb + j];
      if (v == 0) continue;
      top[size_t(j)] = std::max(top[size_t(j)], top_exponent(v));
      low[size_t(j)] = std::min(low[size_t(j)], trailing_exponent(v));
    }
  for (int64_t j = 0; j < k; ++j)
    if (low[size_t(j)] != std::numeric_limits<int>::max())
      out.per_line[size_t(j)] = top[size_t(j)] - low[size_t(j)];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      if (B[i * ldb + j] != 0)
        count_depth(out.depths, top[size_t(j)] - trailing_exponent(B[i * ldb + j]));
  return out;
}

Slicing plan_slicing(const Spans& a, const Spans& b, int64_t n) {
  return plan(a, b, n, !a.depths.empty() || !b.depths.empty());
}

Slicing plan_slicing(std::span<const int> a_spans, std::span<const int> b_spans, int64_t n) {
  Spans a, b;
  a.per_line.assign(a_spans.begin(), a_spans.end());
  b.per_line.assign(b_spans.begin(), b_spans.end());
  return plan(a, b, n, false);
}

SlicedWeights::SlicedWeights(const double* B, int64_t ldb, int64_t n_, int64_t k_, const Slicing& s)
    : n(n_), k(k_), plan(s) {
  check_exact_range(B, n, ldb, k, "B");
  narrow = all_narrow(B, n, ldb, k);
  slices.assign(size_t(s.slices_b), std::vector<double>(size_t(n * k), 0.0));
  whole.resize(size_t(n * k));
  rest.resize(size_t(k));
  for (int64_t l = 0; l < n; ++l) std::copy_n(B + l * ldb, k, whole.data() + l * k);
  // slice()'s arithmetic on each column, in B's row order (a column's stride would miss the cache
  // on every element): each column's top exponent and span first, then every value cut on its
  // column's grids; a column's remainders still come in increasing row order.
  std::vector<int> top(size_t(k), std::numeric_limits<int>::min()),
      low(size_t(k), std::numeric_limits<int>::max()), count(size_t(k), 0);
  for (int64_t l = 0; l < n; ++l)
    for (int64_t j = 0; j < k; ++j)
      if (const double v = B[l * ldb + j]; v != 0) {
        top[size_t(j)] = std::max(top[size_t(j)], top_exponent(v));
        low[size_t(j)] = std::min(low[size_t(j)], trailing_exponent(v));
      }
  const auto S = size_t(s.slices_b);
  std::vector<double> down(size_t(k) * S), up(size_t(k) * S);  // [k][slices]
  for (int64_t j = 0; j < k; ++j) {
    if (low[size_t(j)] == std::numeric_limits<int>::max()) continue;  // all zero: no slices
    count[size_t(j)] = std::min(slices_for(top[size_t(j)] - low[size_t(j)], s.beta_b), s.slices_b);
    for (int t = 0; t < count[size_t(j)]; ++t) {
      down[size_t(j) * S + size_t(t)] = std::ldexp(1.0, s.beta_b * (t + 1) - top[size_t(j)]);
      up[size_t(j) * S + size_t(t)] = std::ldexp(1.0, top[size_t(j)] - s.beta_b * (t + 1));
    }
  }
  for (int64_t l = 0; l < n; ++l)
    for (int64_t j = 0; j < k; ++j) {
      double r = B[l * ldb + j];
      for (int t = 0; t < count[size_t(j)]; ++t) {
        const double piece =
            std::trunc(r * down[size_t(j) * S + size_t(t)]) * up[size_t(j) * S + size_t(t)];
        slices[size_t(t)][size_t(l * k + j)] = piece;
        r -= piece;
      }
      if (r != 0) rest[size_t(j)].push_back({int32_t(l), r});
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
  rest_.resize(size_t(m));
  // Each chunk of kChunk rows is cut into only the slices its rows need (at most the plan's), once
  // for every tile; a row's slice count does not depend on its chunk, so neither do its terms.
  std::vector<Bits> rows(size_t(std::min(kChunk, m)));
  std::vector<int> counts(rows.size());
  for (int64_t i0 = 0; i0 < m; i0 += kChunk) {
    const int64_t mc = std::min(kChunk, m - i0);
    int sa = 0;
    for (int64_t r = 0; r < mc; ++r) {
      rows[size_t(r)] = bits_of(A + (i0 + r) * lda, n, 1);
      counts[size_t(r)] = std::min(slices_for(rows[size_t(r)].span, p.beta_a), p.slices_a);
      sa = std::max(sa, counts[size_t(r)]);
    }
    const size_t at = a_.size();
    chunks_.push_back({at, sa});
    a_.resize(at + size_t(sa * mc * n), 0.0);
    for (int64_t r = 0; r < mc; ++r)
      slice(A + (i0 + r) * lda, n, 1, rows[size_t(r)].top, p.beta_a, counts[size_t(r)],
            &a_[at + size_t(r * n)], mc * n, 1, &rest_[size_t(i0 + r)]);
  }
}

int64_t SlicedProduct::tiles_for(int64_t k) { return (k + kTile - 1) / kTile; }

// Columns [j0, j0 + kTile) of every row, a chunk of rows at a time: the GEMM terms of the chunk's
// entries are small scratch, summed into their expansions before the next chunk, with the exact
// products of the remainders: row i's (times B's value) and column j's (times the row's sliced
// value, the sum of its slices: each partial sum, largest slice first, is the value cut at that
// slice's grid, a double, so the sum is exact).
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
    auto sliced_value = [&](int64_t r, int64_t l) {
      double v = 0;
      for (int s = 0; s < sa; ++s) v += a_[at + size_t(s * mc * n + r * n + l)];
      return v;
    };
    for (int64_t r = 0; r < mc; ++r) {
      const std::vector<Remainder>& row_rest = rest_[size_t(i0 + r)];
      for (int64_t j = 0; j < kc; ++j) {  // entry (r, j)'s GEMM terms lie mc * kc apart
        const std::vector<Remainder>& col_rest = W_.rest[size_t(j0 + j)];
        h.resize(std::max(h.size(), size_t(used) + 2 * (row_rest.size() + col_rest.size()) + 1));
        const double* terms = &parts[size_t(r * kc + j)];
        int len = 0;
        for (int w = 0; w < used; ++w) len = grow(h.data(), len, terms[w * mc * kc]);
        for (const Remainder& x : row_rest)
          len = grow_product(h.data(), len, x.rest, W_.whole[size_t(x.at * k + j0 + j)]);
        for (const Remainder& y : col_rest)
          len = grow_product(h.data(), len, sliced_value(r, y.at), y.rest);
        const int64_t flat = (i0 + r) * k + j0 + j;
        emit(h.data(), len, flat, &terms_[size_t(flat * levels_)], levels_, long_terms_[size_t(i)]);
      }
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
