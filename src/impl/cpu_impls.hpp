// CPU implementations of one precision profile (conventions §3 rounding points). They return
// unnamed Outputs: the harness registry (src/harness/registry.hpp) names them with their
// implementation ids.
#pragma once
#include <optional>
#include <vector>

#include "core/case.hpp"
#include "core/design.hpp"
#include "core/outputs.hpp"
#include "core/perturbation.hpp"
#include "core/variant.hpp"

namespace qkmla::impl {

// The absorbed variants a profile implements (conventions §3; gram_alpha_k is the reference's
// only).
std::vector<Variant> variants_for(Profile p, NormMode norm);

// cpu.explicit.<profile>: keys and values materialized per group (full key caching), rounding
// where the design says (default: conventions §3's rounding points).
Outputs cpu_explicit(const Case& k, const std::optional<Design>& d = std::nullopt);

// One absorbed implementation: a variant of conventions §1.2, perturbed (a mutant) or not, rounding
// where its design says (default: conventions §3's rounding points; alpha_k_bf16 rounds alpha_k to
// bf16).
struct AbsorbedSpec {
  Variant v = Variant::Default;
  Perturbation p;
  std::optional<Design> design;
};
Design design_of(const AbsorbedSpec& s, Profile p);
// Several absorbed implementations on one case, in the order asked; the correct cache (alpha_k,
// rope keys) is built once per sequence and shared by every unperturbed one.
std::vector<Outputs> cpu_absorbed(const Case& k, const std::vector<AbsorbedSpec>& specs);

// Forward error bounds (proofs/error_bounds.md): the same implementations run on the error-bound
// type; every output tensor holds, per element, a bound on |computed - exact|.
Outputs cpu_explicit_bounds(const Case& k, const std::optional<Design>& d = std::nullopt);
std::vector<Outputs> cpu_absorbed_bounds(const Case& k, const std::vector<AbsorbedSpec>& specs);

}  // namespace qkmla::impl
