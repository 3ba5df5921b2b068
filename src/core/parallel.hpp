// Runs independent tasks on a fixed number of threads. Each task writes only its own results,
// so the outcome does not depend on the thread count or on scheduling.
#pragma once
#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <system_error>
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

// Tasks with no order among them that may run in any phase of run_parallel calls that share this
// queue, on threads the phase would otherwise leave idle: a worker that finds no task of its phase
// left takes fillers while another worker still runs a task of that phase or a filler (a worker
// that stopped at its phase's end would wait idle for the other's filler). What the phases leave
// of them runs in run_rest(). They must not depend on any phase's state (e.g. MPFR's global
// default precision, which phases of the reference set).
class Fillers {
 public:
  explicit Fillers(std::vector<std::function<void()>> tasks) : tasks_(std::move(tasks)) {}
  Fillers(const Fillers&) = delete;
  Fillers& operator=(const Fillers&) = delete;
  // Runs the next filler and returns true, or returns false when none is left.
  bool run_one() {
    const size_t i = next_++;
    if (i >= tasks_.size()) return false;
    tasks_[i]();
    return true;
  }
  void run_rest(int threads);

 private:
  std::vector<std::function<void()>> tasks_;
  std::atomic<size_t> next_{0};
};

// `fillers` (may be null): run on threads that would otherwise wait for the phase's last task.
inline void run_parallel(const std::vector<std::function<void()>>& tasks, int threads,
                         Fillers* fillers = nullptr) {
  std::atomic<size_t> next{0};
  std::atomic<int> busy{0};     // workers running (or about to take) a task of this phase
  std::atomic<int> filling{0};  // workers running a filler
  std::exception_ptr error;
  std::mutex error_mutex;
  auto guarded = [&](const std::function<bool()>& f) {
    try {
      return f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      return true;
    }
  };
  auto worker = [&] {
    ++busy;
    for (size_t i = next++; i < tasks.size(); i = next++)
      guarded([&] {
        tasks[i]();
        return true;
      });
    --busy;
    while (fillers && (busy > 0 || filling > 0)) {
      ++filling;
      const bool ran = guarded([&] { return fillers->run_one(); });
      --filling;
      if (!ran) break;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    try {
      pool.emplace_back([&] {
        worker();
        for (void (*hook)() : thread_exit_hooks()) hook();
      });
    } catch (const std::system_error&) {  // no more threads to be had: the same results on fewer
      break;
    }
  }
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);  // the first failure, after every thread stopped
}

inline void Fillers::run_rest(int threads) {
  std::vector<std::function<void()>> rest;
  for (int t = 0; t < threads; ++t)
    rest.push_back([this] {
      while (run_one()) {
      }
    });
  run_parallel(rest, threads);
}

}  // namespace qkmla
