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

// How the values of each row (row_spans) or column (col_spans) lie below that line's top exponent
// E (every |x| < 2^E): a value whose lowest set bit is 2^L lies E - L bits deep, and s slices of
// beta bits hold it whole iff that depth is at most s * beta.
struct Spans {
  std::vector<int> per_line;    // [lines]: the deepest value's depth (the line's span); 0 all zero
  std::vector<int64_t> depths;  // [depth]: how many nonzero values lie that deep, over all lines
  void append(const Spans& more);  // the lines of `more` after these (a later block of rows)
};
Spans row_spans(const double* A, int64_t lda, int64_t m, int64_t n);
Spans col_spans(const double* B, int64_t ldb, int64_t n, int64_t k);

struct Slicing {
  int beta_a = 0, beta_b = 0;  // bits per slice; beta_a + beta_b = 53 - ceil(log2 n)
  int slices_a = 0;            // most slices a row of A is cut into (at least 1)
  int slices_b = 0;            // most slices a column of B is cut into (at least 1)
  double gemms_per_chunk =
      0.0;  // the plan's cost per 256-row chunk of A, in GEMMs (remainders too)
  int64_t remainder_a = 0, remainder_b = 0;  // values whose lowest bits lie below those slices
  int width() const { return slices_a * slices_b; }
};

// The split of the 53 bits and the number of slices that minimize the cost for these rows and
// columns (inner dimension n): GEMMs of slices, plus the remainders, the bits of the rare values
// that lie deeper than the slices reach, multiplied exactly one by one (X.5). It depends on every
// row's and column's values, not on how the rows are later blocked, so blocks of A give the same
// expansions as A whole. Without depth histograms (spans only) every value is sliced whole.
Slicing plan_slicing(const Spans& a, const Spans& b, int64_t n);
// Callers slice where the plan costs at most this many GEMMs per chunk and extract (X.1-X.2)
// otherwise: beyond it, operands spanning very many binades, extraction is cheaper.
constexpr double kMaxSlicedGemms = 12.0;
Slicing plan_slicing(std::span<const int> a_spans, std::span<const int> b_spans, int64_t n);

// One value's bits below its slices: x = (its slices) + rest, exactly.
struct Remainder {
  int32_t at;   // the inner index l
  double rest;  // nonzero
};

// B [n, k] cut into at most s.slices_b matrices [n, k] (row-major), formed once and used for every
// block, and what the slices leave of each column.
class SlicedWeights {
 public:
  SlicedWeights(const double* B, int64_t ldb, int64_t n, int64_t k, const Slicing& s);
  int64_t n = 0, k = 0;
  Slicing plan;
  std::vector<std::vector<double>> slices;   // [slices_b][n, k]
  std::vector<double> whole;                 // [n, k]: B itself, for the rows' remainders
  std::vector<std::vector<Remainder>> rest;  // [k]: column j's remainders (mostly none)
  bool narrow = true;                        // every entry of B has at most 24 significant bits
};

// A [m, n] times the sliced weights. The plan.width() GEMM terms of each entry (slice s of A's row
// times slice t of B's column) and the exact products of the remainders (two doubles each: A's row
// remainders times B, A's sliced values times B's column remainders) are summed exactly into a
// nonoverlapping expansion, largest term first, as exact_matmul's entries are (at most kLevels
// inline, longer ones kept aside). All entries of A must be finite and zero or in [2^-400, 2^400]
// (std::domain_error), as for exact_matmul.
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
  std::vector<double> a_;                     // per chunk of rows: [slices, chunk rows, n]
  std::vector<Chunk> chunks_;                 // [chunks]
  std::vector<std::vector<Remainder>> rest_;  // [m]: row i's remainders (mostly none)
  int levels_;                 // inline terms per entry: 2 for narrow operands, else kLevels
  std::vector<double> terms_;  // [m, k, levels_]
  std::vector<std::unordered_map<int64_t, std::vector<double>>> long_terms_;  // [tiles]
};

}  // namespace qkmla::ref
