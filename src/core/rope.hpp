// RoPE: tables and the pair layout of conventions §1.1 (column j of the tables serves pair j).
#pragma once
#include <cstdint>

#include "core/config.hpp"
#include "core/tensor.hpp"

namespace qkmla {

// Element indices (a, b) of rotation pair j in a d_r-vector.
inline void rope_pair(RopeStyle style, int d_r, int j, int& a, int& b) {
  if (style == RopeStyle::Interleaved) {
    a = 2 * j;
    b = 2 * j + 1;
  } else {
    a = j;
    b = j + d_r / 2;
  }
}

// Rotates z [d_r] in place by the table row of position p: (a, b) -> (a c - b s, a s + b c).
// T is the arithmetic type (double, float or a multiprecision type).
template <class T>
void rope_rotate(T* z, int d_r, RopeStyle style, const Tensor& cos, const Tensor& sin, int64_t p) {
  const int64_t half = d_r / 2;
  for (int j = 0; j < half; ++j) {
    int ia, ib;
    rope_pair(style, d_r, j, ia, ib);
    const T c = T(cos.value(p * half + j)), s = T(sin.value(p * half + j));
    const T a = z[ia], b = z[ib];
    z[ia] = a * c - b * s;
    z[ib] = a * s + b * c;
  }
}

// fp32 tables [p_max, d_r/2] for angles p * base^(-2j/d_r), computed in double and rounded once.
void make_rope_tables(int64_t p_max, int d_r, double base, Tensor& cos, Tensor& sin);

}  // namespace qkmla
