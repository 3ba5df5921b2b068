// A parametrised bit-exact model of one tensor-core MMA instruction's fp32 accumulation, and a
// fitter that finds the parameters from the raw tiles gpu/kernels/probe_mma.cu writes
// (gpu/model/mma_tiles.hpp).
//
// Model of one output element d = c + sum_k a_k b_k (k = 0..15), as tensor cores are described
// (Fasi et al. 2021; Li et al. 2024): every product a_k b_k is exact; the terms are summed in
// groups of `group` consecutive k; at each group the terms (its products, and the running
// accumulator: the fp32 c at the first group when c_first, else c joins after the last group) are
// aligned to the largest term's exponent E, keeping `align_bits` bits below 2^E (the bits shifted
// out truncated toward zero, or rounded to nearest even when align_round), summed exactly, and the
// sum is rounded to fp32 (to nearest even when final_round, else toward zero). Zeros take no part
// in E. With nominal_exponent, a product's exponent is the sum of its inputs' exponents, ea + eb,
// as if every product's significand were in [1, 2) (a product in [2, 4) then reaches one bit above
// E); otherwise it is the exact product's. Not modelled: inf/NaN, overflow, the sign of a zero
// result (matches compare zeros equal).
//
// Fitted on an H200 (sm_90, driver 580, CUDA 13.0; reports/device-h200-2026-12-04.md): mma.sync
// bf16 and fp16 m16n8k16 and wgmma bf16 m64n8k16 alike are {group 16, c first, align 25 bits
// truncated, final toward zero, nominal exponent}: every one of 98,304 probe elements.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/model/mma_tiles.hpp"

namespace qkmla::gpu::mma {

struct MmaParams {
  int group = 16;                 // products per fused step: 1, 2, 4, 8 or 16
  bool c_first = true;            // c aligned with the first group's products (else added last)
  int align_bits = 24;            // bits kept below the largest term's leading bit (20..40)
  bool align_round = false;       // shifted-out bits: nearest-even (true) or truncated (false)
  bool final_round = true;        // group sum to fp32: nearest-even (true) or toward zero (false)
  bool nominal_exponent = false;  // products aligned by ea + eb (true) or their exact exponent
  bool operator==(const MmaParams& o) const {
    return group == o.group && c_first == o.c_first && align_bits == o.align_bits &&
           align_round == o.align_round && final_round == o.final_round &&
           nominal_exponent == o.nominal_exponent;
  }
  std::string str() const;
};

// What the H200 probe of 2026-12-04 identified (above); a probe on fresh tiles checks it.
inline MmaParams hopper_fitted() { return {16, true, 25, false, false, true}; }

// One output element: K products a[k] * b[k] (values of bf16/fp16 inputs) plus c.
float mma_dot(const MmaParams& p, const float* a, const float* b, int K, float c);

// Fills t.d with the model's results for t's inputs.
void mma_tile(const MmaParams& p, Tile& t);

// One output element of a tile, ready for the fitter.
struct MmaRecord {
  float a[kK], b[kK], c, d;
};
std::vector<MmaRecord> records(const Tile& t);

// The probe file (gpu/model/mma_tiles.hpp): read (throws on a short or malformed file) and written.
std::vector<Tile> read_probe(const std::string& path);
void write_probe(const std::string& path, const std::vector<Tile>& tiles);

// Every parameter set of the grid (group x c_first x align_bits 20..40 x both roundings x both
// exponent rules).
std::vector<MmaParams> parameter_grid();

struct FitResult {
  MmaParams best;
  long mismatches = 0, records = 0;  // the best set's mismatching elements, of all
  std::vector<MmaParams> exact;      // every set that matches every record (unique: identified)
};
// Tries every set of `grid` on the records; a set stops counting once it is worse than the best.
FitResult fit(const std::vector<MmaRecord>& recs, const std::vector<MmaParams>& grid);

}  // namespace qkmla::gpu::mma
