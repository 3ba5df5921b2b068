// The absorbed-form variants of conventions §1.2: equivalent in exact arithmetic, different in
// rounding. One vocabulary for the reference (ref.absorbed.<variant>), the CPU profiles
// (cpu.absorbed.<profile>.<variant>) and every report.
#pragma once
#include <string>
#include <vector>

namespace qkmla {

enum class Variant {
  Default,       // alpha_q row-scaled after the dot (paper Eq. 12), gains at run time, alpha_k from
                 // the transient key, cached in the accumulate type
  AlphaQFolded,  // alpha_q folded into q_latent (and the unified query rope) before the dot
  QNormedFirst,  // the query normalized first: (qc^ (.) gamma_ck) . WK^T, only alpha_k after it
  GammaMerged,   // gamma_cq (.) gamma_ck merged into WK offline, rounded once to the weight dtype
  GramAlphaK,    // alpha_k from the Gram form c (WK_g WK_g^T) c^T / d_c + eps
  AlphaKBf16,    // alpha_k cached in bf16 (lossy: an option of the bf16-stored profiles)
};

const std::vector<Variant>& all_variants();
std::string variant_name(Variant v);  // "" for Default, else "alpha_q_folded", ...
bool parse_variant(const std::string& name, Variant& out);  // false if `name` is no variant

}  // namespace qkmla
