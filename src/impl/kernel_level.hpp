// Kernel level (conventions §2): a FlashMLA-style decode kernel's inputs, already absorbed and
// rounded, and the same-profile CPU kernel that is their baseline.
#pragma once
#include <optional>

#include "core/case.hpp"
#include "core/design.hpp"
#include "core/outputs.hpp"
#include "core/perturbation.hpp"
#include "core/variant.hpp"

namespace qkmla::impl {

// The kernel-level case of a module-level case: q_latent, alpha_q, q_rope, kv_c, k_rope, alpha_k
// exactly as cpu.absorbed.<profile> forms and rounds them (alpha_q, alpha_k in the accumulate
// type).
Case kernel_case(const Case& module_case);

// cpu.kernel.<profile>: the latent core (attention_core.hpp) on the kernel inputs: logits of
// core/attention_math.hpp with s = alpha_q alpha_k (1 in norm none), softmax and p.c in Acc,
// latent_out rounded to the stored dtype, lse in Acc.
// A design (core/design.hpp) may move the p and latent_out rounding points (default conventions
// §3's). A perturbation (a convention a diagnosis tries) changes the latent core only: lse form,
// scale, split average, visibility.
// Variant::AlphaQFolded: the wrapper folds alpha_q into the given query in Acc (q_latent, and the
// unified rope part) and the kernel scales by alpha_k alone, as a Triton-style wrapper does; the
// other variants are module-level choices and run as Default.
Outputs cpu_kernel(const Case& kernel_case, const std::optional<Design>& d = std::nullopt,
                   const Perturbation& p = {}, Variant v = Variant::Default);

}  // namespace qkmla::impl
