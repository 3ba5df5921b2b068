// A named dense tensor: row-major values held as doubles, each exactly representable in `dtype`
// (the bits a file stores). One container for every implementation, so all read the same bits.
// A long context's per-token tensors may instead be held compact (`floats`, `data` empty: see
// compact()): float holds every value of a dtype narrower than F64 exactly, so the bits are the
// same; such a tensor is read through rows(), read() or value().
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

  // Moves the values into `floats` (half the memory); std::logic_error for F64, I32 and U8,
  // whose values a float may not hold. Only a long context's kv_c, k_pe and rope tables are
  // compacted (compact_long_context: kv_c [B, T_max, r] is 1 GiB in double at 262144 tokens).
  void compact();
  bool is_compact() const { return data.empty() && !floats.empty(); }
  double value(int64_t i) const {
    return is_compact() ? double(floats[size_t(i)]) : data[size_t(i)];
  }
  // Values [flat, flat + n) as doubles: a pointer into `data`, or, held compact, into `scratch`
  // (exact conversions). The pointer is valid until the tensor or `scratch` changes.
  const double* rows(int64_t flat, int64_t n, std::vector<double>& scratch) const;
  // Values [flat, flat + n) into out, converted to T from double (exact for float and double),
  // either storage.
  template <class T>
  void read(int64_t flat, int64_t n, T* out) const {
    if (is_compact())
      for (int64_t i = 0; i < n; ++i) out[i] = T(double(floats[size_t(flat + i)]));
    else
      for (int64_t i = 0; i < n; ++i) out[i] = T(data[size_t(flat + i)]);
  }
  // A copy held in `data` (a compact tensor expanded; others copied).
  Tensor expanded() const;

  std::vector<float> floats;  // the values when compact (then `data` is empty)
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace qkmla
