// qkmla certify: explicit and absorbed forms compared in exact rational arithmetic
// (Boost.Multiprecision over GMP) on a case whose inputs are exact binary floats (proofs/absorption.md).
#pragma once
#include <cstdint>
#include <string>

#include "core/case.hpp"
#include "impl/mutants.hpp"

namespace qkmla::ref {

struct CertifyResult {
  int64_t content_scores = 0;  // (a) sum_j q_j gq_j gk_j k0c_j == q_latent . c          (D.2)
  int64_t key_statistics = 0;  // (b) |c WK_g|^2 == c (WK_g WK_g^T) c^T                 (D.5)
  int64_t logits = 0;          // (c) explicit logit == absorbed logit, S^q, S^k exact inputs (D.3, D.4)
  int64_t value_paths = 0;     // (d) latent_out . WV == sum_t p v for exact rational p (D.6)
  int64_t masks = 0;           // (e) the same visible tokens                              (D.7)
  bool refuted = false;        // a nonzero exact difference was found
  std::string first;           // which check, where, and both values
};

// Runs every check on every (b, i, t, h); with a mutant, the absorbed side has that bug.
CertifyResult certify(const Case& k, impl::Mutant m = impl::Mutant::None);

// Mutants whose effect is only rounding (identical in exact arithmetic).
bool rounding_only(impl::Mutant m);

}  // namespace qkmla::ref
