// A named dense tensor: row-major values held as doubles, each exactly representable in `dtype`
// (the bits a file stores). One container for every implementation, so all read the same bits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace qkmla {

struct Tensor {
  DType dtype = DType::F64;
  std::vector<int64_t> shape;
  std::vector<double> data;

  Tensor() = default;
  Tensor(DType d, std::vector<int64_t> s, double fill = 0.0);

  int64_t numel() const;
  double& operator[](int64_t i) { return data[size_t(i)]; }
  double operator[](int64_t i) const { return data[size_t(i)]; }
  // Row-major flat index of a multi-index (no bounds checks: callers iterate known shapes).
  int64_t index(std::initializer_list<int64_t> idx) const;
  double at(std::initializer_list<int64_t> idx) const { return data[size_t(index(idx))]; }
  // The address of an element, or of where a zero-width row (NoPE: d_r = 0) would start: defined
  // for an empty tensor too, where &data[i] would not be.
  const double* ptr(std::initializer_list<int64_t> idx) const { return data.data() + index(idx); }
  double& at(std::initializer_list<int64_t> idx) { return data[size_t(index(idx))]; }
  // Unravels a flat index into its multi-index.
  std::vector<int64_t> unravel(int64_t flat) const;
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace qkmla
