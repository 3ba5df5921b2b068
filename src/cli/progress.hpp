// The progress bar of long runs: "[qkmla] [#####.....] 37 % elapsed 1m02s, remaining ~1m45s" on
// stderr, redrawn in place; nothing when stderr is not a terminal (logs and CI stay clean).
#pragma once
#include <atomic>
#include <functional>
#include <thread>

namespace qkmla::cli {

// progress(done, total): draws the bar (a final newline once done >= total). Empty off a terminal.
std::function<void(double, double)> progress_bar();

// Redraws `bar` from `done()` every half second on its own thread until destroyed.
class ProgressWatch {
 public:
  ProgressWatch(std::function<double()> done, double total);
  ~ProgressWatch();
  ProgressWatch(const ProgressWatch&) = delete;
  ProgressWatch& operator=(const ProgressWatch&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace qkmla::cli
