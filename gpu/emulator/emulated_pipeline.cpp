// run_emulated: the device pipeline (pipeline.hpp) with the kernels of kernels.cuh compiled as host
// C++ and run by the fiber emulator (emulator.hpp). Host buffers have their exact sizes (so the
// address sanitizer sees any out-of-bounds access) and start filled with 0xff bytes, a NaN in every
// float format and -1 as an int, as cudaMalloc's memory is not initialised either.
#include <chrono>
#include <cstring>
#include <memory>

#include "gpu/emulator/emulated.hpp"
#include "gpu/kernels/kernels.cuh"
#include "gpu/kernels/pipeline.hpp"

namespace qkmla::gpu {

namespace {

class HostBuf {
 public:
  explicit HostBuf(size_t bytes) : bytes_(bytes) {
    if (bytes) {
      p_ = std::make_unique_for_overwrite<unsigned char[]>(bytes);
      std::memset(p_.get(), 0xff, bytes);
    }
  }
  template <class T = void>
  T* get() const {
    return reinterpret_cast<T*>(p_.get());
  }
  size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<unsigned char[]> p_;  // null for 0 bytes, as cudaMalloc is skipped there
  size_t bytes_ = 0;
};

struct HostBackend {
  using Buf = HostBuf;
  emu::LaunchOptions options;
  std::chrono::steady_clock::time_point t0;

  Buf alloc(size_t bytes) { return HostBuf(bytes); }
  template <class T>
  Buf upload(const std::vector<T>& h) {
    HostBuf b(h.size() * sizeof(T));
    if (!h.empty()) std::memcpy(b.get(), h.data(), b.bytes());
    return b;
  }
  template <class T>
  std::vector<T> download(const Buf& d, size_t n) {
    if (n * sizeof(T) > d.bytes())
      throw std::logic_error("emulated pipeline: download past the end of a buffer");
    std::vector<T> h(n);
    if (n) std::memcpy(h.data(), d.get(), n * sizeof(T));
    return h;
  }
  template <class A>
  void launch(void (*kernel)(A), dim3 grid, unsigned threads, const A& args) {
    emu::launch(
        grid, dim3(threads), [&] { kernel(args); }, options);
  }
  void synchronize() {}
  void timer_start() { t0 = std::chrono::steady_clock::now(); }
  double timer_stop_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  std::string describe() { return emu::describe(options); }
};

}  // namespace

GpuOutputs run_emulated(const GpuCase& c, const RunOptions& o, const emu::LaunchOptions& e) {
  HostBackend be;
  be.options = e;
  return run_pipeline_for(be, c, o);
}

}  // namespace qkmla::gpu
