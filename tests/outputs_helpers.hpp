// Bit-for-bit comparison of two runs' outputs (the reference's stages that must not move a bit).
#pragma once
#include <doctest/doctest.h>

#include <cstddef>

#include "core/outputs.hpp"

namespace qkmla::test {

// Every element of every tensor, hi and lo, bit for bit (NaN equal to NaN).
inline void check_identical(const Outputs& a, const Outputs& b) {
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    CAPTURE(name);
    REQUIRE(b.tensors.count(name));
    const Tensor& u = b.tensors.at(name);
    REQUIRE(t.data.size() == u.data.size());
    size_t differ = 0;
    for (size_t i = 0; i < t.data.size(); ++i) {
      const bool same =
          t.data[i] == u.data[i] || (t.data[i] != t.data[i] && u.data[i] != u.data[i]);
      const bool same_lo = !a.lo.count(name) || a.lo.at(name).data[i] == b.lo.at(name).data[i] ||
                           a.lo.at(name).data[i] != a.lo.at(name).data[i];
      differ += !(same && same_lo);
    }
    CHECK(differ == 0);
  }
}

}  // namespace qkmla::test
