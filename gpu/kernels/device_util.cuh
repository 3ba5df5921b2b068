// Device memory and error handling for the launchers (CUDA only).
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/kernels/kernels.cuh"

namespace qkmla::gpu {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
#define QK_CUDA(call) ::qkmla::gpu::cuda_check((call), #call)

// An owned device buffer.
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) : bytes_(bytes) {
    if (bytes) QK_CUDA(cudaMalloc(&p_, bytes));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Elapsed device time between start() and stop() on the default stream (CUDA events).
class EventTimer {
 public:
  EventTimer() {
    QK_CUDA(cudaEventCreate(&e0_));
    QK_CUDA(cudaEventCreate(&e1_));
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  ~EventTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }
  void start() { QK_CUDA(cudaEventRecord(e0_)); }
  void stop() { QK_CUDA(cudaEventRecord(e1_)); }
  float ms() {  // waits for the stop event
    QK_CUDA(cudaEventSynchronize(e1_));
    float t = 0;
    QK_CUDA(cudaEventElapsedTime(&t, e0_, e1_));
    return t;
  }

 private:
  cudaEvent_t e0_{}, e1_{};
};

template <class T>
DevBuf upload(const std::vector<T>& h) {
  DevBuf d(h.size() * sizeof(T));
  if (!h.empty()) QK_CUDA(cudaMemcpy(d.get(), h.data(), d.bytes(), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> download(const DevBuf& d, size_t n) {
  std::vector<T> h(n);
  if (n) QK_CUDA(cudaMemcpy(h.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace qkmla::gpu
