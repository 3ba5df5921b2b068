// Exact matrix products of double matrices (proofs/reference.md, step X.1-X.3).
//
// Every entry of C = A * B is returned as an expansion: a short list of doubles whose *exact* sum
// is the exact dot product. Products are made exact by Veltkamp splitting when an operand has more
// than 26 significant bits (X.1); sums are made exact by Rump-Ogita-Oishi extraction onto
// power-of-two grids (X.2). Nothing is rounded: the reference rounds the expansion once, into its
// own precision (X.3), so its two-precision agreement check sees every rounding it makes.
#pragma once
#include <bit>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace qkmla::ref {

// What exact_matmul reads from the whole of B to plan its extraction (X.1-X.2): whether every
// entry is narrow (at most 24 significant bits), and the largest magnitude and lowest set bit of
// the entries and of their Veltkamp halves. Given the summary of a wider B, a product of some of
// its columns gives every entry the terms the wide product gives it (S.5: streamed scores).
struct WholeB {
  bool narrow = true;
  double max_whole = 0, max_split = 0;
  int low_whole = 1 << 20, low_split = 1 << 20;
  // Adds the entries p[i*stride + j], i < rows, j < cols (any part of B, in any orientation).
  void add(const double* p, int64_t rows, int64_t stride, int64_t cols);
};

// Zero-filled arrays for products' inline terms, from a process-wide pool of the arrays of
// products already destroyed (an ExactProduct gives its array back). Products formed whole are
// hundreds of MB, which malloc maps afresh each time: reusing pages already touched saves the
// kernel's page faults and clearing (8.7 % of the default report's CPU time at ee211ea). Arrays
// below kPooledBytes go to malloc as before. drain_term_pool() frees what the pool holds.
std::vector<double> take_terms(size_t n);
void drain_term_pool();
constexpr size_t kPooledBytes = size_t(32) << 20;
constexpr size_t kPooledArrays = 8;  // more are freed: callers that never drain hold at most these

class ExactProduct {
 public:
  static constexpr int kLevels = 4;  // at most this many terms kept inline; rarer entries go long
  ExactProduct() = default;
  ExactProduct(ExactProduct&&) = default;
  ExactProduct& operator=(ExactProduct&&) = default;
  ExactProduct(const ExactProduct&) = default;
  ExactProduct& operator=(const ExactProduct&) = default;
  ~ExactProduct();  // the inline terms' array back to the pool
  int64_t rows = 0, cols = 0;
  std::span<const double> entry(int64_t i, int64_t j) const;
  int64_t long_entries() const { return int64_t(long_terms_.size()); }
  // Most terms any entry has (the zero-padded width of a dense copy of the expansions).
  int max_terms() const;
  // A product from its inline terms [rows, cols, levels] (levels <= kLevels) and the entries with
  // more terms (keyed by row * cols + col).
  static ExactProduct of(int64_t rows, int64_t cols, int levels, std::vector<double> terms,
                         std::unordered_map<int64_t, std::vector<double>> long_terms);

 private:
  friend ExactProduct exact_matmul(const double*, int64_t, int64_t, int64_t, const double*, int64_t,
                                   int64_t, const WholeB*);
  // Marks each long entry by a NaN in its first inline slot (terms are finite): entry() reads the
  // map only there, instead of a lookup per entry (7 % of an fp64 truth's time).
  void mark_long();
  int levels_ = kLevels;       // inline terms per entry
  std::vector<double> terms_;  // [rows, cols, levels_]; a long entry's first slot NaN
  std::unordered_map<int64_t, std::vector<double>> long_terms_;
};

// Throws std::domain_error unless every entry of the [count, width] matrix p (row stride `stride`)
// is finite and zero or of magnitude in [2^-400, 2^400]; `what` names the operand.
void check_exact_range(const double* p, int64_t count, int64_t stride, int64_t width,
                       const char* what);
// Exponent of the lowest set bit of x (x finite, nonzero): x is an odd multiple of 2^result. From
// the bits, inline (no libm call: the sliced products take it for every operand): x is the
// significand field times 2^-1074 when the exponent field is 0 (subnormal), else (significand +
// 2^52) times 2^(field - 1075).
inline int trailing_exponent(double x) {
  const auto bits = std::bit_cast<uint64_t>(x);
  const int field = int((bits >> 52) & 0x7ff);
  const uint64_t sig = bits & ((uint64_t(1) << 52) - 1);
  if (field == 0) return -1074 + __builtin_ctzll(sig);
  return field - 1075 + __builtin_ctzll(sig | (uint64_t(1) << 52));
}
// The smallest e with |x| < 2^e (ilogb(x) + 1) for finite nonzero x, from the bits.
inline int top_exponent(double x) {
  const auto bits = std::bit_cast<uint64_t>(x);
  const int field = int((bits >> 52) & 0x7ff);
  if (field == 0) return -1074 + (64 - __builtin_clzll(bits & ((uint64_t(1) << 52) - 1)));
  return field - 1022;
}

// C[i, j] = sum_l A[i*lda + l] * B[l*ldb + j], i < m, l < n, j < k. All inputs finite and either
// zero or of magnitude in [2^-400, 2^400] (checked: throws std::domain_error), so that no split
// product underflows. `whole`: the summary of a B these k columns are part of (null: this B).
ExactProduct exact_matmul(const double* A, int64_t lda, int64_t m, int64_t n, const double* B,
                          int64_t ldb, int64_t k, const WholeB* whole = nullptr);

}  // namespace qkmla::ref
