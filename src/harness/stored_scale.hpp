// The softmax scale stored in the model dtype (conventions §5, item "stored scale"): a module that
// multiplies its bf16/fp16 activations by a Python float scale casts the scale to their dtype first
// (MLX: `array(scale, q.dtype())` in mlx.fast's SDPA; JAX's weak-typed scalars), so it computes
// attention at sigma_D = round_D(sigma), not sigma. That is a different, exactly defined problem
// (a temperature change of up to u_D: +0.134 % for DeepSeek's 192^-0.5 in bf16), not a rounding
// noise, so it is judged against its own truth: the reference at sigma_D.
#pragma once
#include <map>
#include <optional>
#include <string>

#include "io/case_io.hpp"

namespace qkmla {

// The case at sigma_D with its references recomputed at the case's reference precision (module
// level, stored dtype narrower than the accumulate type, sigma_D != sigma); nullopt where no such
// case exists or its reference does not reach the required agreeing bits.
std::optional<CaseFile> stored_scale_case(const CaseFile& cf);

// sigma_D where such a case exists (the conditions above), else nullopt.
std::optional<double> stored_scale_of(const MlaConfig& c);

// What the stored scale changes, cheaply: per output (out, latent_out, lse), the accumulate-type
// compute at sigma_D minus the same at sigma (one forward run each; its rounding cancels to well
// below the change). An audit uses it to skip the second truth where the outputs are nowhere near
// the reference plus this change.
std::map<std::string, Tensor> stored_scale_shift(const Case& k, double sigma_d);

}  // namespace qkmla
