#include "core/rng.hpp"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

namespace qkmla {

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
  const double u2 = uniform();
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * M_PI * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

void Rng::skip_normals(uint64_t n) {
  if (n == 0) return;
  if (has_spare_) {
    has_spare_ = false;
    --n;
  }
  engine_.discard(2 * (n / 2));  // two uniforms per pair of normals
  if (n % 2) normal();           // the first of a pair; its spare is next
}

void fill_normals(double* out, int64_t n, Rng& rng, double scale, int threads) {
  const int pieces = int(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::vector<Rng> from(size_t(pieces), rng);  // from[p]: the state at normal n * p / pieces
  for (int p = 1; p < pieces; ++p) {
    from[size_t(p)] = from[size_t(p - 1)];
    from[size_t(p)].skip_normals(uint64_t(n * p / pieces - n * (p - 1) / pieces));
  }
  std::vector<std::thread> pool;
  auto draw = [&](int p) {
    for (int64_t i = n * p / pieces; i < n * (p + 1) / pieces; ++i)
      out[i] = scale * from[size_t(p)].normal();
  };
  for (int p = 1; p < pieces; ++p) pool.emplace_back(draw, p);
  draw(0);
  for (std::thread& t : pool) t.join();
  rng = from.back();
}

}  // namespace qkmla
