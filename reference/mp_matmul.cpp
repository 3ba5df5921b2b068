#include "reference/mp_matmul.hpp"

#include <climits>

namespace qkmla::ref {

namespace {
// Sum over parts of the expansions C[i*parts + p, j].
Mp gather(const ExactProduct& C, int64_t i, int64_t j, int parts) {
  Mp acc = 0;
  for (int p = 0; p < parts; ++p) add_expansion(acc, C.entry(i * parts + p, j));
  return acc;
}
}  // namespace

std::vector<MpVec> mp_times_doubles(const std::vector<MpVec>& x, int64_t n, const double* D,
                                    int64_t ld, int64_t cols, const WholeB* whole) {
  const int parts = parts_for(PrecisionScope::current_bits());
  const int64_t rows = int64_t(x.size());
  // Each row is scaled by a power of two (exact) so that its largest entry is near 1; entries
  // below 2^-300 of that go through plain multiprecision products instead, so that no part
  // leaves exact_matmul's range.
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
      if (mpfr_get_exp(scaled.backend().data()) < -300) {
        small.emplace_back(i, l);
        continue;
      }
      to_parts(scaled, tmp.data(), parts);
      for (int p = 0; p < parts; ++p) X[size_t((i * parts + p) * n + l)] = tmp[size_t(p)];
    }
  }
  const ExactProduct C = exact_matmul(X.data(), n, rows * parts, n, D, ld, cols, whole);
  std::vector<MpVec> y(static_cast<size_t>(rows), MpVec(static_cast<size_t>(cols)));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      Mp& out = y[size_t(i)][size_t(j)];
      out = gather(C, i, j, parts);
      mpfr_mul_2si(out.backend().data(), out.backend().data(), shift[size_t(i)], MPFR_RNDN);
    }
  Mp prod;
  for (const auto& [i, l] : small)
    for (int64_t j = 0; j < cols; ++j) {
      mul_d(prod.backend().data(), x[size_t(i)][size_t(l)].backend().data(), D[l * ld + j]);
      mpfr_add(y[size_t(i)][size_t(j)].backend().data(), y[size_t(i)][size_t(j)].backend().data(),
               prod.backend().data(), MPFR_RNDN);
    }
  return y;
}

}  // namespace qkmla::ref
