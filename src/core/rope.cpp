#include "core/rope.hpp"

#include <cmath>

namespace qkmla {

void make_rope_tables(int64_t p_max, int d_r, double base, Tensor& cos, Tensor& sin) {
  const int half = d_r / 2;
  cos = Tensor(DType::F32, {p_max, half});
  sin = Tensor(DType::F32, {p_max, half});
  for (int64_t p = 0; p < p_max; ++p)
    for (int j = 0; j < half; ++j) {
      const double angle = double(p) * std::pow(base, -2.0 * j / d_r);
      cos[p * half + j] = round_to(DType::F32, std::cos(angle));
      sin[p * half + j] = round_to(DType::F32, std::sin(angle));
    }
}

}  // namespace qkmla
