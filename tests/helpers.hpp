// Shared test helpers: seeds (printed, overridable with QKMLA_TEST_SEED) and small cases.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/generator.hpp"
#include "core/presets.hpp"
#include "harness/registry.hpp"

namespace qkmla::test {

// The seed of a randomized test: QKMLA_TEST_SEED if set, else `fallback`. Printed on failure.
inline uint64_t seed(uint64_t fallback) {
  const char* env = std::getenv("QKMLA_TEST_SEED");
  return env ? std::strtoull(env, nullptr, 10) : fallback;
}

inline MlaConfig tiny_config(Profile p, std::vector<int> seqlens, int s_q = 1,
                             NormMode norm = NormMode::Blockwise, uint64_t seed = 1,
                             const std::string& preset = "tiny") {
  MlaConfig c = config_for(find_preset(preset), 1);
  c.profile = p;
  c.seqlens = std::move(seqlens);
  c.batch = int(c.seqlens.size());
  c.s_q = s_q;
  c.norm = norm;
  c.seed = seed;
  return c;
}

// The registered CPU implementations of a case (cpu.explicit, then every cpu.absorbed variant),
// named, from the one registry.
inline std::vector<ImplId> cpu_ids(const MlaConfig& c) {
  std::vector<ImplId> ids;
  for (const ImplId& id : registered_ids(c, kReport))
    if (id.family == Family::Cpu) ids.push_back(id);
  return ids;
}

inline bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace qkmla::test
