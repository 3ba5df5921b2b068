#include "harness/bitwise.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

namespace qkmla {

namespace {
bool same_bits(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  const float fa = float(a), fb = float(b);
  return std::memcmp(&fa, &fb, sizeof fa) == 0;
}
}  // namespace

std::string bitwise_summary(const Outputs& a, const Outputs& b) {
  int64_t total = 0, differ = 0;
  std::string first;
  for (const auto& [name, ta] : a.tensors) {
    if (!b.tensors.count(name)) continue;
    const Tensor& tb = b.tensors.at(name);
    for (int64_t i = 0; i < ta.numel() && i < tb.numel(); ++i, ++total)
      if (!same_bits(ta[i], tb[i]) && differ++ == 0)
        first = fmt::format(" (first: {} flat {}: {:.9g} vs {:.9g})", name, i, ta[i], tb[i]);
  }
  if (differ == 0)
    return fmt::format("{} vs {}: bit-identical on all {} elements", to_string(a.id),
                       to_string(b.id), total);
  return fmt::format("{} vs {}: {} of {} elements differ{}", to_string(a.id), to_string(b.id),
                     differ, total, first);
}

}  // namespace qkmla
