// The device half of the API when no CUDA toolkit was found at configure time: every device entry
// point says so; the CPU model (model.cpp) is always built.
#include <stdexcept>

#include "gpu/bench/bench_sweep.hpp"
#include "gpu/qkmla_gpu.hpp"

namespace qkmla::gpu {

namespace {
const char* kWhy =
    "no CUDA device: this build has no CUDA toolkit (nvcc was not found when configuring)";
}

bool device_available(std::string* why) {
  if (why) *why = kWhy;
  return false;
}
int device_sm_count() { return 0; }
long device_launch_count() { return 0; }
std::string device_description() { return ""; }
std::string compiled_arch_list() { return ""; }
GpuOutputs run_on_device(const GpuCase&, const RunOptions&) { throw std::runtime_error(kWhy); }
std::vector<BenchRow> run_bench(const BenchOptions&, std::string*) {
  throw std::runtime_error(kWhy);
}
BenchRow run_bench_row(const BenchOptions&, int) { throw std::runtime_error(kWhy); }
double measure_copy_gbs(size_t, int) { throw std::runtime_error(kWhy); }
BenchBackend device_bench_backend() { throw std::runtime_error(kWhy); }

}  // namespace qkmla::gpu
