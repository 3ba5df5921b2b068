// A kernel-level case in a real kernel's own interface (docs/layouts.md): FlashMLA's
// flash_mla_with_kvcache and FlashInfer's MLA paged attention. The paged inputs are written beside
// the dense ones (names prefixed "flashmla." / "flashinfer."), and a kernel's outputs, as it
// returns them, are converted back to conventions §2 before an audit judges them.
#pragma once
#include <map>
#include <string>

#include "core/case.hpp"
#include "harness/audit.hpp"

namespace qkmla {

enum class Layout { Dense, FlashMla, FlashInfer };

Layout parse_layout(const std::string& s);  // ConfigError("layout", ...)
std::string layout_name(Layout l);

// The paged inputs of a kernel-level case: pages of `page_size` tokens in a shuffled order drawn
// from the case's seed, one spare page, every unfilled slot NaN, index tensors I32. ConfigError
// for a module-level case, a page size below 1, or FlashMLA with the fp8 profile.
std::map<std::string, Tensor> paged_inputs(const Case& kernel_case, Layout l, int page_size);

// `given` as the kernel returns it -> latent_out [B, S_q, H, r] and lse [B, S_q, H], values as
// given (the audit's --lse-base and --empty-lse say their base and empty-row value; FlashMLA's
// empty rows are +inf). InputError naming `file` and the tensor when a name or shape is not the
// layout's.
std::map<std::string, Tensor> outputs_from_layout(const MlaConfig& c, Layout l,
                                                  std::map<std::string, Tensor> given,
                                                  const std::string& file);

// The audit of outputs returned in layout `l`: run_audit on outputs_from_layout's conversion, and
// on FAIL each misreading of the layout an integration commonly makes is tried too (FlashMLA:
// softmax_lse written in qkmla's [B, S_q, H] order instead of [B, H, S_q]); one under which the
// lse would pass is added to the diagnosis, named.
AuditResult audit_in_layout(const CaseFile& cf, const std::string& case_path, Layout l,
                            const std::map<std::string, Tensor>& given,
                            const std::string& outputs_path, const AuditOptions& o);

}  // namespace qkmla
