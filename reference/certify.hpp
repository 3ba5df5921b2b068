// qkmla certify: explicit and absorbed forms compared in exact rational arithmetic
// (Boost.Multiprecision over GMP) on a case whose inputs are exact binary floats
// (proofs/absorption.md). The absorbed side consults the caller's Perturbation through the hooks of
// core/perturbation.hpp, the same code the gate's mutants run, so "refuted" is about the shipped
// mutant itself.
#pragma once
#include <cstdint>
#include <string>

#include "core/case.hpp"
#include "core/perturbation.hpp"

namespace qkmla::ref {

struct CertifyResult {
  int64_t content_scores = 0;    // (a) sum_j q_j gq_j gk_j k0c_j == q_latent . c          (D.2)
  int64_t key_statistics = 0;    // (b) |c WK_g|^2 == c (WK_g WK_g^T) c^T, and alpha_k       (D.5)
  int64_t query_statistics = 0;  // (b') alpha_q of both forms                               (D.3)
  int64_t logits = 0;  // (c) explicit logit == absorbed logit, S^q, S^k exact inputs (D.3, D.4)
  int64_t value_paths = 0;  // (d) latent_out . WV == sum_t p v for exact rational p    (D.6)
  int64_t masks = 0;        // (e) the same visible tokens                              (D.7)
  int64_t lse_rows = 0;     // (f) the reported lse is the natural log of the row's sum  (D.7)
  int64_t sink_rows = 0;    // (g) the sink's factor on out, and lse left without it     (K.1)
  bool refuted = false;     // a nonzero difference was found
  std::string first;        // which check, where, and both values
};

// Runs every check on every (b, i, t, h). Sums, products and ratios are exact rationals. The
// statistics 1/S (square roots) and lse (a logarithm) are evaluated by the hooks at 512 bits from
// exact inputs; two of them differ only when they differ by more than 2^-400 relative, far above
// that evaluation's error (a few correctly rounded operations, under 2^-505), and each enters
// the exact checks as the nearest double of its value (any positive S makes D.3-D.4 identities).
CertifyResult certify(const Case& k, const Perturbation& p = {});

}  // namespace qkmla::ref
