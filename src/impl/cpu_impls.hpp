// CPU implementations of one precision profile (SPEC §3 rounding points), and their registry.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "impl/mutants.hpp"

namespace qkmla::impl {

// Absorbed-form variants of SPEC §1.2, each a separately named implementation.
enum class Variant {
  Default,        // alpha_q row-scaled after the dot (paper Eq. 12), gains at run time, fp32 alpha_k
  AlphaQFolded,   // alpha_q folded into q_latent (and the unified query rope) before rounding
  QNormedFirst,   // q normalized first: (qc^ (.) gamma_ck) . WK^T, only alpha_k after the dot
  GammaMerged,    // gamma_cq (.) gamma_ck merged into WK offline, rounded once to the weight dtype
  AlphaKBf16,     // alpha_k cached in bf16
};

std::string variant_suffix(Variant v);  // "", ".alpha_q_folded", ...
const std::vector<Variant>& all_variants();
std::vector<Variant> variants_for(Profile p);  // the variants that profile defines (SPEC §3)

// cpu.explicit.<profile>: keys and values materialized per group (full key caching).
Outputs cpu_explicit(const Case& k);
// cpu.absorbed.<profile>[.<variant>]: the latent form.
Outputs cpu_absorbed(const Case& k, Variant v);
// All variants of the case's profile at once: the cache (alpha_k, rope keys) is built once and shared.
std::vector<Outputs> cpu_absorbed_all(const Case& k);
// Forward error bounds (proofs/error_bounds.md): the same implementations run on the error-bound
// type; every output tensor holds, per element, a bound on |computed - exact|.
Outputs cpu_explicit_bounds(const Case& k);
std::vector<Outputs> cpu_absorbed_bounds(const Case& k);

// mutant.<name>.<profile>: the default absorbed implementation with one bug (SPEC §7).
Outputs cpu_mutant(const Case& k, Mutant m);

}  // namespace qkmla::impl
