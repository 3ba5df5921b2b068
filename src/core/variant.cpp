#include "core/variant.hpp"

namespace qkmla {

namespace {
const std::pair<Variant, const char*> kNames[] = {
    {Variant::Default, ""},
    {Variant::AlphaQFolded, "alpha_q_folded"},
    {Variant::QNormedFirst, "q_normed_first"},
    {Variant::GammaMerged, "gamma_merged"},
    {Variant::GramAlphaK, "gram_alpha_k"},
    {Variant::AlphaKBf16, "alpha_k_bf16"},
};
}  // namespace

const std::vector<Variant>& all_variants() {
  static const std::vector<Variant> v = [] {
    std::vector<Variant> out;
    for (const auto& [x, name] : kNames) out.push_back(x);
    return out;
  }();
  return v;
}

std::string variant_name(Variant v) {
  for (const auto& [x, name] : kNames)
    if (x == v) return name;
  return "";
}

bool parse_variant(const std::string& name, Variant& out) {
  for (const auto& [x, n] : kNames)
    if (!name.empty() && name == n) {
      out = x;
      return true;
    }
  return false;
}

}  // namespace qkmla
