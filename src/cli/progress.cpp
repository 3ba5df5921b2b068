#include "cli/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <string>

namespace qkmla::cli {

namespace {
std::string clock(double s) { return fmt::format("{}m{:02d}s", int(s) / 60, int(s) % 60); }
}  // namespace

std::function<void(double, double)> progress_bar() {
  if (!isatty(2)) return {};
  const auto start = std::chrono::steady_clock::now();
  return [start](double done, double total) {
    const double el =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double f = total > 0 ? std::min(1.0, done / total) : 1.0;
    const int width = 30, filled = int(f * width + 0.5);
    std::cerr << fmt::format("\r[qkmla] [{}{}] {:3.0f} % elapsed {}, remaining ~{}",
                             std::string(size_t(filled), '#'),
                             std::string(size_t(width - filled), '.'), 100 * f, clock(el),
                             f > 0 ? clock(el / f - el) : "?")
              << (f >= 1.0 ? "\n" : "") << std::flush;
  };
}

ProgressWatch::ProgressWatch(std::function<double()> done, double total) {
  auto bar = progress_bar();
  if (!bar) return;
  thread_ = std::thread([this, done, total, bar] {
    while (!stop_) {
      bar(done(), total);
      for (int i = 0; i < 5 && !stop_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    bar(total, total);
  });
}

ProgressWatch::~ProgressWatch() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace qkmla::cli
