#include "reference/mp_matmul.hpp"

#include <climits>

#include "reference/exact_sum.hpp"
#include "reference/sliced_product.hpp"

namespace qkmla::ref {

namespace {

// X [m, n] times D [n, cols] exactly: by X.5's sliced GEMMs where their plan costs at most
// kMaxSlicedGemms per chunk, by X.1-X.2's extraction otherwise. The callers sum the entries'
// terms exactly (X.6), so either way gives the same sums.
ExactProduct exact_product(const double* X, int64_t m, int64_t n, const double* D, int64_t ld,
                           int64_t cols, const WholeB* whole) {
  if (m > 0 && n > 0 && cols > 0) {
    try {
      const Slicing plan = plan_slicing(row_spans(X, n, m, n), col_spans(D, ld, n, cols), n);
      if (plan.gemms_per_chunk <= kMaxSlicedGemms)
        return sliced_matmul(X, n, m, SlicedWeights(D, ld, n, cols, plan));
    } catch (const std::domain_error&) {  // too wide to slice: extraction checks the range itself
    }
  }
  return exact_matmul(X, n, m, n, D, ld, cols, whole);
}

}  // namespace

void add_mp_times_doubles(const std::vector<MpVec>& x, int64_t n, const double* D, int64_t ld,
                          int64_t cols, std::vector<ExactSum>& sums, const WholeB* whole) {
  const int bits = PrecisionScope::current_bits(), parts = parts_for(bits);
  const long low = bits - 390;  // the smallest exponent of an entry split into parts
  const int64_t rows = int64_t(x.size());
  // Each row is scaled by a power of two (exact) so that its largest entry is near 1; entries
  // below 2^(bits - 390) of that are multiplied into the sums directly instead: a part of an entry
  // below 2^E is at least 2^(E - bits), so no part leaves exact_matmul's range [2^-400, 2^400].
  std::vector<long> shift(static_cast<size_t>(rows), 0);
  std::vector<double> X(static_cast<size_t>(rows * parts * n), 0.0);  // [rows*parts, n]
  std::vector<std::pair<int64_t, int64_t>> small;                     // (row, l)
  std::vector<double> tmp(static_cast<size_t>(parts), 0.0);
  Mp scaled;
  for (int64_t i = 0; i < rows; ++i) {
    const MpVec& xi = x[size_t(i)];
    long emax = LONG_MIN;
    for (const Mp& v : xi)
      if (!mpfr_zero_p(v.backend().data()))
        emax = std::max(emax, long(mpfr_get_exp(v.backend().data())));
    if (emax == LONG_MIN) continue;
    shift[size_t(i)] = emax;
    for (int64_t l = 0; l < int64_t(xi.size()); ++l) {
      mpfr_mul_2si(scaled.backend().data(), xi[size_t(l)].backend().data(), -emax,
                   MPFR_RNDN);  // exact
      if (mpfr_zero_p(scaled.backend().data())) continue;
      if (mpfr_get_exp(scaled.backend().data()) < low) {
        small.emplace_back(i, l);
        continue;
      }
      to_parts(scaled, tmp.data(), parts);
      for (int p = 0; p < parts; ++p) X[size_t((i * parts + p) * n + l)] = tmp[size_t(p)];
    }
  }
  const ExactProduct C = exact_product(X.data(), rows * parts, n, D, ld, cols, whole);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      ExactSum& acc = sums[size_t(i * cols + j)];
      for (int p = 0; p < parts; ++p)
        for (double t : C.entry(i * parts + p, j)) acc.add(t, shift[size_t(i)]);
    }
  for (const auto& [i, l] : small)
    for (int64_t j = 0; j < cols; ++j)
      sums[size_t(i * cols + j)].add_product(x[size_t(i)][size_t(l)].backend().data(),
                                             D[l * ld + j]);
}

std::vector<MpVec> mp_times_doubles(const std::vector<MpVec>& x, int64_t n, const double* D,
                                    int64_t ld, int64_t cols, const WholeB* whole) {
  std::vector<ExactSum> sums(x.size() * size_t(cols));
  add_mp_times_doubles(x, n, D, ld, cols, sums, whole);
  std::vector<MpVec> y(x.size(), MpVec(static_cast<size_t>(cols)));
  for (size_t i = 0; i < x.size(); ++i)
    for (int64_t j = 0; j < cols; ++j)
      sums[i * size_t(cols) + size_t(j)].round(y[i][size_t(j)].backend().data());
  return y;
}

}  // namespace qkmla::ref
