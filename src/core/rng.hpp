// The generator's PRNG: std::mt19937_64 (its output sequence is fixed by the C++ standard) with
// our own uniform and normal transforms, since std:: distributions differ between libraries.
#pragma once
#include <cstdint>
#include <random>

namespace qkmla {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform() { return double(engine_() >> 11) * 0x1.0p-53; }  // [0, 1), 53 bits
  double normal();                                                  // Box-Muller, N(0, 1)
  uint64_t below(uint64_t n) { return engine_() % n; }

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace qkmla
