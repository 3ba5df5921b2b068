// ref.explicit and ref.absorbed (conventions §1.1, §1.2) in Boost.Multiprecision over MPFR.
// Both evaluate at the precision of the enclosing PrecisionScope; every stage cites its step in
// proofs/reference.md.
#pragma once
#include <utility>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "core/perturbation.hpp"
#include "core/variant.hpp"
#include "reference/dots.hpp"

namespace qkmla::ref {

// Outputs: out, lse, alpha_q, alpha_k and (if asked) latent_out, with `lo` remainders. `threads`
// share the query rows (the same bits for any count); all of them run at the caller's precision.
Outputs ref_explicit(const Case& k, const Dots& d, bool with_latent_out, int threads = 1);
// ref.explicit at `bits` and its check at `check_bits` (no latent_out), taking turns block by block
// so that streamed products are formed once for both (proofs/reference.md, S.4); the same bits as
// two ref_explicit calls. Sets the precision itself (the caller must not hold a PrecisionScope that
// other threads rely on).
std::pair<Outputs, Outputs> ref_explicit_pair(const Case& k, const Dots& d, bool with_latent_out,
                                              int bits, int check_bits, int threads);
// Outputs: out, lse, alpha_q, alpha_k, latent_out, q_latent (norm none: no alpha_q, alpha_k). A
// variant of conventions §1.2 (the shared vocabulary of core/variant.hpp; alpha_k_bf16 is a profile
// option and means nothing here) and a perturbation (a mutant, for convergence studies).
Outputs ref_absorbed(const Case& k, const Dots& d, Variant v = Variant::Default,
                     const Perturbation& p = {}, int threads = 1);
// Kernel-level case (conventions §2): latent_out and lse from the rounded kernel inputs.
Outputs ref_kernel(const Case& kernel_case);

}  // namespace qkmla::ref
