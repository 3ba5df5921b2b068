// X.5: exact products by slicing (Ozaki scheme; proofs/reference.md, step X.5).
//
// Each row of A is cut into slices of beta_a bits on grids fixed by the row's top exponent, each
// column of B into slices of beta_b bits on grids fixed by the column's top exponent. One slice of
// a row times one slice of a column is then an integer below 2^(beta_a + beta_b) times one power of
// two, and with beta_a + beta_b + ceil(log2 n) <= 53 every partial sum of n such products is an
// integer below 2^53 times that power: exact in double, in any order, with or without fma. So
// ordinary double GEMMs (slice_gemm.hpp) of slice matrices give exact terms, and entry (i, j) of
// A*B is the exact sum of its slices_a * slices_b terms.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "reference/exact_dot.hpp"

namespace qkmla::ref {

// Bits from the lowest set bit to just above the largest magnitude of each row (row_spans) or
// column (col_spans); 0 for an all-zero row or column.
std::vector<int> row_spans(const double* A, int64_t lda, int64_t m, int64_t n);
std::vector<int> col_spans(const double* B, int64_t ldb, int64_t n, int64_t k);

struct Slicing {
  int beta_a = 0, beta_b = 0;    // bits per slice; beta_a + beta_b = 53 - ceil(log2 n)
  int slices_a = 0;              // most slices any row of A needs (at least 1)
  int slices_b = 0;              // most slices any column of B needs (at least 1)
  double gemms_per_chunk = 0.0;  // mean GEMMs per 256-row chunk of A (the cost the plan minimizes)
  int width() const { return slices_a * slices_b; }
};

// The split of the 53 bits that minimizes the GEMMs for these rows and columns (inner dimension n).
// It depends on every row's span, not on how the rows are later blocked, so blocks of A give the
// same expansions as A whole.
Slicing plan_slicing(std::span<const int> a_spans, std::span<const int> b_spans, int64_t n);

// B [n, k] cut into s.slices_b matrices [n, k] (row-major), formed once and used for every block.
class SlicedWeights {
 public:
  SlicedWeights(const double* B, int64_t ldb, int64_t n, int64_t k, const Slicing& s);
  int64_t n = 0, k = 0;
  Slicing plan;
  std::vector<std::vector<double>> slices;  // [slices_b][n, k]
  bool narrow = true;                       // every entry of B has at most 24 significant bits
};

// A [m, n] times the sliced weights. The plan.width() GEMM terms of each entry (slice s of A's row
// times slice t of B's column) are summed exactly into a nonoverlapping expansion, largest term
// first, as exact_matmul's entries are (at most kLevels inline, longer ones kept aside). All
// entries of A must be finite and zero or in [2^-400, 2^400] (std::domain_error), as for
// exact_matmul.
ExactProduct sliced_matmul(const double* A, int64_t lda, int64_t m, const SlicedWeights& W);

// sliced_matmul a tile of 512 columns at a time, for callers that spread one product over threads:
// tile(i) once for every i < tiles() (distinct tiles may run concurrently; each writes only its
// own columns), then finish(). The constructor slices A (its rows' slices are kept: ~slices_a
// times A's size).
class SlicedProduct {
 public:
  SlicedProduct(const double* A, int64_t lda, int64_t m, const SlicedWeights& W);
  static int64_t tiles_for(int64_t k);  // tiles of a product with k columns
  int64_t tiles() const { return tiles_for(W_.k); }
  void tile(int64_t i);
  ExactProduct finish();

 private:
  struct Chunk {
    size_t at;  // offset of the chunk's slices in a_
    int slices;
  };
  int64_t m_;
  const SlicedWeights& W_;
  std::vector<double> a_;      // per chunk of rows: [slices, chunk rows, n]
  std::vector<Chunk> chunks_;  // [chunks]
  int levels_;                 // inline terms per entry: 2 for narrow operands, else kLevels
  std::vector<double> terms_;  // [m, k, levels_]
  std::vector<std::unordered_map<int64_t, std::vector<double>>> long_terms_;  // [tiles]
};

}  // namespace qkmla::ref
