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
  // The state n calls of normal() would leave (the engine jumped ahead by its draws, the spare
  // drawn where one is left), without computing the values.
  void skip_normals(uint64_t n);

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// out[i] = scale * rng.normal() for i < n, in order: the same values and the same final state of
// rng as the serial loop, with the range cut into `threads` pieces, each drawn on its own thread
// from a copy of rng jumped ahead to it (skip_normals).
void fill_normals(double* out, int64_t n, Rng& rng, double scale, int threads);

}  // namespace qkmla
