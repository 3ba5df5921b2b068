#include "core/tensor.hpp"

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

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace qkmla
