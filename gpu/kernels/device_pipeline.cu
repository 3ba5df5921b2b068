// run_on_device: the pipeline (pipeline.hpp) on device 0 through CUDA memory and launches.
#include <atomic>

#include "gpu/kernels/device_util.cuh"
#include "gpu/kernels/pipeline.hpp"

namespace qkmla::gpu {

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why)
      *why = e != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(e) + ")"
                              : "no CUDA device";
    return false;
  }
  return true;
}

int device_sm_count() {
  if (!device_available(nullptr)) return 0;
  cudaDeviceProp p{};
  QK_CUDA(cudaGetDeviceProperties(&p, 0));
  return p.multiProcessorCount;
}

#define QK_STR2(...) #__VA_ARGS__
#define QK_STR(...) QK_STR2(__VA_ARGS__)
std::string compiled_arch_list() { return QK_STR(__CUDA_ARCH_LIST__); }

std::string device_description() {
  if (!device_available(nullptr)) return "";
  cudaDeviceProp p{};
  QK_CUDA(cudaGetDeviceProperties(&p, 0));
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, driver " + std::to_string(drv / 1000) +
         "." + std::to_string(drv % 1000 / 10) + ", runtime " + std::to_string(rt / 1000) + "." +
         std::to_string(rt % 1000 / 10);
}

namespace {
std::atomic<long> g_launches{0};
}  // namespace
long device_launch_count() { return g_launches.load(); }

namespace {

// CUDA memory and launches for run_pipeline (pipeline.hpp).
struct DeviceBackend {
  using Buf = DevBuf;
  EventTimer timer;
  Buf alloc(size_t bytes) { return DevBuf(bytes); }
  template <class T>
  Buf upload(const std::vector<T>& h) {
    return ::qkmla::gpu::upload(h);
  }
  template <class T>
  std::vector<T> download(const Buf& d, size_t n) {
    return ::qkmla::gpu::download<T>(d, n);
  }
  template <class A>
  void launch(void (*kernel)(A), dim3 grid, unsigned threads, const A& args) {
    kernel<<<grid, threads>>>(args);
    QK_CUDA(cudaGetLastError());
    ++g_launches;
  }
  void synchronize() { QK_CUDA(cudaDeviceSynchronize()); }
  void timer_start() { timer.start(); }
  double timer_stop_ms() {
    timer.stop();
    return timer.ms();
  }
  std::string describe() { return device_description(); }
};

}  // namespace

GpuOutputs run_on_device(const GpuCase& c, const RunOptions& o) {
  std::string why;
  if (!device_available(&why)) throw std::runtime_error(why);
  QK_CUDA(cudaSetDevice(0));
  DeviceBackend be;
  return run_pipeline_for(be, c, o);
}

}  // namespace qkmla::gpu
