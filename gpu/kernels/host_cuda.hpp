// CUDA's built-in names for compiling kernels.cuh as host C++ (no CUDA toolkit needed): threads,
// barriers and shuffles go to the fiber emulator (emulator.hpp). Included by kernels.cuh only when
// nvcc is not the compiler. __shared__ becomes a function-local `static thread_local`: one copy per
// kernel instantiation, shared by the fibers of the running block. QK_SHARED(name), written after
// each __shared__ declaration, registers it with the emulator: poisoned (0xff bytes: fp32 NaN)
// when a block first reaches it, and saved and restored when interleaved blocks take turns.
#pragma once
#include <cmath>
#include <cstddef>

#include "gpu/emulator/emulator.hpp"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define QK_SHARED(x) ::qkmla::gpu::emu::shared_region(&(x), sizeof(x))

#define threadIdx (::qkmla::gpu::emu::thread_index())
#define blockIdx (::qkmla::gpu::emu::block_index())
#define blockDim (::qkmla::gpu::emu::block_dim())
#define gridDim (::qkmla::gpu::emu::grid_dim())

inline void __syncthreads() { ::qkmla::gpu::emu::syncthreads(); }
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  return ::qkmla::gpu::emu::shfl_xor(mask, v, lane_mask);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::qkmla::gpu::emu::syncwarp(mask); }
// CUDA's integer min of device code.
inline int min(int a, int b) { return b < a ? b : a; }

using dim3 = ::qkmla::gpu::emu::Dim3;
