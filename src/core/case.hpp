// A case: one config and the named input tensors every implementation reads (SPEC §2).
#pragma once
#include <map>
#include <string>

#include "core/config.hpp"
#include "core/tensor.hpp"

namespace qkmla {

struct Case {
  MlaConfig cfg;
  std::map<std::string, Tensor> tensors;

  const Tensor& get(const std::string& name) const;  // ConfigError naming the tensor if absent
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  int64_t t_max() const { return get("kv_c").shape[1]; }
  int64_t p_max() const { return get("rope_cos").shape[0]; }
  bool causal_visible(int b, int i, int64_t t) const;  // is cached token t visible to query i?
  int64_t pos(int b, int i) const { return cfg.seqlens[size_t(b)] - cfg.s_q + i; }
};

// The input tensor names and shapes a module-level case must carry for its config.
std::map<std::string, std::vector<int64_t>> expected_input_shapes(const MlaConfig& c,
                                                                  int64_t t_max, int64_t p_max);

// Checks names, shapes, dtypes, seqlens agreement, table size and NaN-free valid inputs.
// Throws ConfigError whose field names the tensor.
void validate_case(const Case& k);

}  // namespace qkmla
