// Kernel level (SPEC §2): a FlashMLA-style decode kernel's inputs, already absorbed and rounded,
// and the same-profile CPU kernel that is their baseline.
#pragma once
#include "core/case.hpp"
#include "core/outputs.hpp"

namespace qkmla::impl {

// The kernel-level case of a module-level case: q_latent, alpha_q, q_rope, kv_c, k_rope, alpha_k
// exactly as cpu.absorbed.<profile> forms and rounds them (alpha_q, alpha_k in the accumulate type).
Case kernel_case(const Case& module_case);

// cpu.kernel.<profile>: logits sigma*(alpha_q*alpha_k*(q_latent.c) + q_rope.k_rope) (blockwise)
// or sigma*alpha_q*alpha_k*(q_latent.c + q_rope.k_rope) (unified) in Acc, softmax in Acc,
// latent_out rounded to the stored dtype, lse in Acc.
Outputs cpu_kernel(const Case& kernel_case);

}  // namespace qkmla::impl
