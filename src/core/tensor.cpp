#include "core/tensor.hpp"

#include <stdexcept>

namespace qkmla {

Tensor::Tensor(DType d, std::vector<int64_t> s, double fill) : dtype(d), shape(std::move(s)) {
  data.assign(size_t(numel()), fill);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t Tensor::index(std::initializer_list<int64_t> idx) const {
  int64_t flat = 0;
  size_t k = 0;
  for (int64_t i : idx) flat = flat * shape[k++] + i;
  return flat;
}

std::vector<int64_t> Tensor::unravel(int64_t flat) const {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  return idx;
}

void Tensor::compact() {
  if (dtype == DType::F64 || dtype == DType::I32 || dtype == DType::U8)
    throw std::logic_error("Tensor::compact: " + dtype_name(dtype) + " values may not fit a float");
  if (is_compact() || data.empty()) return;
  floats.assign(data.begin(), data.end());  // exact: every value is representable in dtype
  std::vector<double>().swap(data);
}

const double* Tensor::rows(int64_t flat, int64_t n, std::vector<double>& scratch) const {
  if (!is_compact()) return data.data() + flat;
  scratch.resize(size_t(n));
  read(flat, n, scratch.data());
  return scratch.data();
}

Tensor Tensor::expanded() const {
  if (!is_compact()) return *this;
  Tensor t;
  t.dtype = dtype, t.shape = shape;
  t.data.assign(floats.begin(), floats.end());
  return t;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace qkmla
