// Diagnosis of a failed audit: the case evaluated again under alternative conventions, the
// mistakes MLA kernels actually make (lse base, softmax scale placement and precision, rope layout
// and position, eps, the RMS mean, missing or doubled gains, alpha_k on the unified rope part,
// causality, fp8 scales, the split-KV combine, and conventions §7's mutants), each in fp64
// arithmetic on the same bits. A convention the outputs match far better than the case's own is
// named, with both distances: "out matches the reference under rope_style=half: rel_l2 3.1e-7 (0.42
// under the case's conventions)".
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"

namespace qkmla {

struct TensorMatch {
  std::string tensor;
  double rel_l2 = 0;       // the output against the reference under the convention
  double rel_l2_case = 0;  // the output against the case's reference
};

struct Match {
  std::string convention;  // e.g. "rope_style=swapped"
  std::string what;        // one line: the mistake it stands for
  std::vector<TensorMatch> tensors;
  double score = 0;         // the smallest rel_l2 / rel_l2_case over the tensors (smaller: better)
  bool would_pass = false;  // every tensor's rel_l2 under the convention within its allowance
};

// The names of every convention diagnose() tries (for documentation and tests).
std::vector<std::string> convention_names();

// Matches, best first (at most `most`): conventions under which one given tensor is at least 10x
// closer than to the case's own reference and none is farther than 2x (noise). `would_pass` says
// whether every tensor would also pass the audit's allowance (`allowed`, rel_l2 per tensor) under
// the convention. `given` holds the judged outputs (lse already converted as the audit was asked),
// `refs` the case's ref.* tensors.
std::vector<Match> diagnose(const Case& k, const std::map<std::string, Tensor>& given,
                            const std::map<std::string, Tensor>& refs,
                            const std::map<std::string, double>& allowed, size_t most = 3);

}  // namespace qkmla
