// ref.explicit and ref.absorbed (SPEC §1.1, §1.2) in Boost.Multiprecision over MPFR.
// Both evaluate at the precision of the enclosing PrecisionScope; every stage cites its step in
// proofs/reference.md.
#pragma once
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "exact_dot.hpp"

namespace qkmla::ref {

// X.1-X.2: the exact products every multiprecision stage starts from, per batch entry b:
// k0c[b] = kv_c[b, :T_b] * w_uk  [T_b, G*d_c],  v[b] = kv_c[b, :T_b] * w_uv  [T_b, G*d_v].
struct Dots {
  std::vector<ExactProduct> k0c, v;
  double seconds = 0.0;
};
Dots exact_dots(const Case& k);

// Outputs: out, lse, alpha_q, alpha_k and (if asked) latent_out, with `lo` remainders.
Outputs ref_explicit(const Case& k, const Dots& d, bool with_latent_out);
// The SPEC §1.2 variants (and two mutants) of the absorbed form, evaluated at the reference's
// precision for convergence studies (qkmla converge). Default: the form of A.1-A.6.
struct AbsorbedOptions {
  bool alpha_q_folded = false;  // alpha_q folded into q_latent (and, unified, the query rope)
  bool q_normed_first = false;  // (qc^ (.) gamma_k) . WK^T: only alpha_k after the dot
  bool gamma_merged = false;    // WK (.) gamma_q gamma_k formed once (rounded to P) before use
  bool gram_alpha_k = false;    // alpha_k from c (WK_g WK_g^T) c^T / d_c + eps
  bool no_gamma_k = false;      // mutant: gamma_k not absorbed
  bool eps_outside_sqrt = false;  // mutant: 1 / (sqrt(mean z^2) + eps)
};

// Outputs: out, lse, alpha_q, alpha_k, latent_out, q_latent.
Outputs ref_absorbed(const Case& k, const Dots& d, const AbsorbedOptions& opt = {});
// Kernel-level case (SPEC §2): latent_out and lse from the rounded kernel inputs.
Outputs ref_kernel(const Case& kernel_case);

}  // namespace qkmla::ref
