// Implementation ids (conventions §4) as structured values with one print/parse pair. Every id a
// report, gate, golden case, audit or converge run shows is printed here; nothing else takes ids
// apart.
//
//   ref.<form>[.<variant>]                 ref.explicit, ref.absorbed.gram_alpha_k, ref.kernel
//   cpu.<form>[.<profile>][.<variant>]     cpu.explicit.bf16, cpu.absorbed.fp8.alpha_k_bf16
//   gpu.model[.explicit][.<profile>]       the kernels' CPU model
//   gpu.<form>[.<profile>]                 the kernels on a device
//   mutant.<name>[.<profile>]              conventions §7
//   audit.<label>                          a third party's outputs
//   quant.<profile>                        the fp8 quantization error (reference vs reference)
// The profile is optional so that a pattern without one ("cpu.absorbed") means every profile.
#pragma once
#include <optional>
#include <string>

#include "core/config.hpp"
#include "core/design.hpp"
#include "core/variant.hpp"

namespace qkmla {

enum class Family { Ref, Cpu, GpuModel, Gpu, Mutant, Audit, Quant };

struct ImplId {
  Family family = Family::Cpu;
  Form form = Form::Absorbed;
  Variant variant = Variant::Default;
  std::string name;  // the mutant's name, or the audit label
  std::optional<Profile> profile;

  ImplId with_profile(std::optional<Profile> p) const {
    ImplId x = *this;
    x.profile = p;
    return x;
  }
  // The id within its profile's own lines: cpu.absorbed.bf16.gamma_merged ->
  // cpu.absorbed.gamma_merged
  ImplId without_profile() const { return with_profile(std::nullopt); }
  bool operator==(const ImplId& o) const {
    return family == o.family && form == o.form && variant == o.variant && name == o.name &&
           profile == o.profile;
  }
};

std::string to_string(const ImplId& id);
// ref.<form>
inline ImplId ref_id(Form f) {
  ImplId id;
  id.family = Family::Ref, id.form = f;
  return id;
}
// Ordered as printed (ids as map keys).
inline bool operator<(const ImplId& a, const ImplId& b) { return to_string(a) < to_string(b); }
// Shorter still, for a summary's columns: a CPU implementation without family and profile
// (absorbed.gamma_merged); any other id without its profile.
std::string brief(const ImplId& id);
// Throws ConfigError("impl", ...) naming the id and what is wrong with it.
ImplId parse_impl_id(const std::string& text);

// A pattern is an id (without a profile: any profile), or a prefix of printed ids ending in '*'.
bool id_matches(const std::string& pattern, const ImplId& id);

}  // namespace qkmla
