// The device pipeline with the kernels compiled as host C++ and run by the fiber emulator
// (gpu/emulator/emulator.hpp): the kernels' own code, its launch shapes and arguments, on any
// machine. Slow (every thread a fiber): tiny and short cases only. Its own library
// (qkmla_gpu_emulator), linked by the tests, not shipped in libqkmla.
#pragma once
#include "gpu/emulator/emulator.hpp"
#include "gpu/qkmla_gpu.hpp"

namespace qkmla::gpu {

// Throws emu::KernelFault on a divergent barrier or an incomplete warp shuffle.
GpuOutputs run_emulated(const GpuCase& c, const RunOptions& o, const emu::LaunchOptions& e = {});

}  // namespace qkmla::gpu
