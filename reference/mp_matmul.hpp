// Dot products of multiprecision vectors with double data, evaluated exactly (step X.4): each
// Mp value is split exactly into doubles (to_parts), X.5's sliced GEMMs (or exact_matmul's
// extraction where slicing costs more) form every product sum without rounding, and the
// expansions are summed exactly (X.6): one rounding per result.
#pragma once
#include <vector>

#include "reference/exact_dot.hpp"
#include "reference/exact_sum.hpp"
#include "reference/ref_common.hpp"

namespace qkmla::ref {

// y[i][j] = sum_l x[i][l] * D[l*ld + j] for j < cols, with x [rows][n] multiprecision and D
// doubles [n, ld] (finite, zero or of magnitude in [2^-400, 2^400]). Rows of x may be empty
// (treated as zero). `whole`: the summary of a wider D these columns are part of (exact_dot.hpp),
// so that each y[i][j] has the bits the wide product gives it (null: this D).
std::vector<MpVec> mp_times_doubles(const std::vector<MpVec>& x, int64_t n, const double* D,
                                    int64_t ld, int64_t cols, const WholeB* whole = nullptr);
// sums[i * cols + j] += sum_l x[i][l] * D[l*ld + j], exactly: products formed a block at a time
// add up to the whole product's exact values, rounded once by the caller (A.5's p . c).
void add_mp_times_doubles(const std::vector<MpVec>& x, int64_t n, const double* D, int64_t ld,
                          int64_t cols, std::vector<ExactSum>& sums, const WholeB* whole = nullptr);

}  // namespace qkmla::ref
