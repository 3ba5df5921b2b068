// Runs independent tasks on a fixed number of threads. Each task writes only its own results,
// so the outcome does not depend on the thread count or on scheduling.
#pragma once
#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qkmla {

// Called on each worker thread as it ends. Layers above register what a thread must release: the
// reference registers MPFR's per-thread constant caches, which would otherwise leak (LeakSanitizer
// finds them in the sanitizer build).
inline std::vector<void (*)()>& thread_exit_hooks() {
  static std::vector<void (*)()> hooks;
  return hooks;
}

inline void run_parallel(const std::vector<std::function<void()>>& tasks, int threads) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (size_t i = next++; i < tasks.size(); i = next++) {
      try {
        tasks[i]();
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back([&] {
      worker();
      for (void (*hook)() : thread_exit_hooks()) hook();
    });
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);  // the first failure, after every thread stopped
}

}  // namespace qkmla
