// A golden case (conventions §9): the inputs, the config, the reference outputs (fp64 images of the
// multiprecision truth) and what the same-profile baseline scores against them, so an audit can
// judge without recomputing anything.
#pragma once
#include <map>
#include <string>

#include "core/case.hpp"
#include "harness/truth.hpp"

namespace qkmla {

struct Golden {
  Case k;                                       // module or kernel level, as written
  std::map<std::string, Tensor> refs;           // "ref.out", ...
  std::map<std::string, std::string> metadata;  // qkmla.baseline, qkmla.reference, qkmla.made_by
  Truth truth;
  std::string baseline_impl;
};

// The golden case of `module_case` at `level`; the reference at `ref_bits` and its check. The
// caller refuses it when !truth.ok().
Golden make_golden(const Case& module_case, Level level, int ref_bits, const std::string& made_by);

}  // namespace qkmla
