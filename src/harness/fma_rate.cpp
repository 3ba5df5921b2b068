#include "harness/fma_rate.hpp"

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

namespace qkmla {

namespace {

// 64 independent chains: enough to fill the FMA pipelines of any current core (latency 4 x 2
// units x 8 lanes). The multiplier keeps every value finite and normal.
double chains(double seconds, double* sink) {
  constexpr int kChains = 64, kInner = 4096;
  alignas(64) double acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = 1.0 + i * 1e-3;
  const double a = 0.999999, b = 1e-6;
  double n = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    for (int r = 0; r < kInner; ++r)
      for (int i = 0; i < kChains; ++i) acc[i] = std::fma(acc[i], a, b);
    n += double(kChains) * kInner;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  double s = 0;
  for (double x : acc) s += x;
  *sink = s;
  return n / elapsed;
}

}  // namespace

double measured_fma_rate(int threads, double seconds) {
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<double> rate(static_cast<size_t>(threads)), sink(rate.size());
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { rate[size_t(t)] = chains(seconds / 3, &sink[size_t(t)]); });
    for (std::thread& t : pool) t.join();
    double total = 0;
    for (double r : rate) total += r;
    best = std::max(best, total);
  }
  return best;
}

}  // namespace qkmla
