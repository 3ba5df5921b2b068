// ref.explicit and ref.absorbed (conventions §1.1, §1.2) in Boost.Multiprecision over MPFR.
// Both evaluate at the precision of the enclosing PrecisionScope; every stage cites its step in
// proofs/reference.md.
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "core/perturbation.hpp"
#include "core/variant.hpp"
#include "reference/dots.hpp"

namespace qkmla::ref {

// alpha_k[t, g] of every sequence at the precision P of the run that formed it (multiprecision
// values, so opaque here: reference/explicit_rows.hpp). ref.explicit's E.2 and ref.absorbed's A.3
// form this value the same way (the exact key's exact sum of squares rounded once, then 1/S: X.7),
// so a caller that ran ref.explicit at P may hand them to ref.absorbed at P, which then forms no
// key (proofs/reference.md, A.3).
struct AlphaKByToken;
struct AlphaKByTokenFree {
  void operator()(AlphaKByToken* a) const;
};
using KeptAlphaK = std::unique_ptr<AlphaKByToken, AlphaKByTokenFree>;
KeptAlphaK new_kept_alpha_k();

// S.6: the exact sums of a ref.explicit run at P that do not depend on its precision (each key's
// sum of squares; plain MLA's content sums), rounded once more at its check run's precision
// `check_bits` (opaque here: reference/explicit_rows.hpp). The check run takes them instead of
// summing again: the values it would form, since both runs sum the same exact terms.
struct KeySums;
struct KeySumsFree {
  void operator()(KeySums* s) const;
};
using KeptKeySums = std::unique_ptr<KeySums, KeySumsFree>;
KeptKeySums new_key_sums(int check_bits);

// What a ref.explicit run hands on or takes (each may be null).
struct ExplicitLinks {
  AlphaKByToken* keep = nullptr;  // filled with the run's alpha_k (for ref.absorbed at P)
  KeySums* give = nullptr;        // a P run: filled with its key sums (S.6)
  KeySums* take = nullptr;        // a check run: the P run's key sums, filled before (S.6)
};

// Outputs: out, lse, alpha_q, alpha_k and (if asked) latent_out, with `lo` remainders. `threads`
// share the query rows (the same bits for any count); all of them run at the caller's precision.
Outputs ref_explicit(const Case& k, const Dots& d, bool with_latent_out, int threads = 1,
                     const ExplicitLinks& links = {});
// ref.explicit at `bits` and its check at `check_bits` (no latent_out), taking turns block by block
// so that streamed products are formed once for both (proofs/reference.md, S.4) and the check takes
// the P run's key sums (S.6); the same bits as two ref_explicit calls. Sets the precision itself
// (the caller must not hold a PrecisionScope that other threads rely on).
std::pair<Outputs, Outputs> ref_explicit_pair(const Case& k, const Dots& d, bool with_latent_out,
                                              int bits, int check_bits, int threads,
                                              AlphaKByToken* keep = nullptr);  // the P run's
// Outputs: out, lse, alpha_q, alpha_k, latent_out, q_latent (norm none: no alpha_q, alpha_k). A
// variant of conventions §1.2 (the shared vocabulary of core/variant.hpp; alpha_k_bf16 is a profile
// option and means nothing here) and a perturbation (a mutant, for convergence studies).
// `alpha_k` (may be null): ref.explicit's at this precision, taken for A.3 where the key
// statistic is A.3's own (no perturbation, not the Gram variant).
Outputs ref_absorbed(const Case& k, const Dots& d, Variant v = Variant::Default,
                     const Perturbation& p = {}, int threads = 1,
                     const AlphaKByToken* alpha_k = nullptr);
// Kernel-level case (conventions §2): latent_out and lse from the rounded kernel inputs.
Outputs ref_kernel(const Case& kernel_case);

}  // namespace qkmla::ref
