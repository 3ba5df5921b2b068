// What one implementation produced for one case: named output tensors (conventions §2) and its
// time.
#pragma once
#include <map>
#include <string>

#include "core/case.hpp"
#include "core/impl_id.hpp"
#include "core/tensor.hpp"

namespace qkmla {

struct Outputs {
  ImplId id;  // printed by to_string: "ref.explicit", "cpu.absorbed.bf16"
  std::map<std::string, Tensor> tensors;  // "out", "lse", "alpha_q", "alpha_k", "latent_out"
  // Multiprecision results only: the remainder x - double(x) of each value, so that two
  // reference runs can be compared to ~106 bits.
  std::map<std::string, Tensor> lo;
  // Only when asked (convergence studies): every further exact remainder, so that a value of any
  // precision is the exact sum tensors + lo + deep[0] + deep[1] + ...
  std::map<std::string, std::vector<Tensor>> deep;
  double seconds = 0.0;
};

// Output tensors with their conventions §2 shapes, filled with `fill` (alpha_k rows past T_b stay
// NaN).
Tensor make_output(const Case& k, const std::string& name, DType d, double fill);

}  // namespace qkmla
