// A CPU emulator of CUDA's execution model for the kernels of kernels.cuh, compiled as host C++
// (host_cuda.hpp maps CUDA's built-in names onto it). Every thread of a block runs on its own fiber
// (POSIX ucontext) with its own stack, so per-thread locals, __shared__ arrays, __syncthreads and
// warp shuffles behave as on a device; blocks run one after another or interleaved, and
// registered __shared__ memory is poisoned at every block start.
//
// What it checks (each a KernelFault naming the block, thread and place):
//  - __syncthreads reached by some threads of a block while another has exited or waits in a
//    shuffle (a divergent barrier: undefined behaviour on a device, often a hang);
//  - a full-mask __shfl_xor_sync or __syncwarp that not all 32 lanes of the warp reach, or with
//    lanes that disagree on the operation, the mask or the offset;
//  - an exception thrown by a thread (the launch stops and rethrows it).
// Threads run in a chosen order between synchronisation points (forward, reverse, or shuffled by a
// seed): a kernel whose results depend on that order has a data race the barriers do not order.
//
// What it cannot show: timing, memory coalescing, bank conflicts, and anything specific to the
// hardware (warp scheduling beyond the order choices above, async copies, tensor cores).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace qkmla::gpu::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // as dim3
  unsigned count() const { return x * y * z; }
};

enum class Order { Forward, Reverse, Shuffled };

struct LaunchOptions {
  Order order = Order::Forward;
  uint64_t seed = 0;  // Shuffled: a new permutation at every synchronisation point
  // Blocks in flight at once (1: one after another). Above 1, live blocks take turns, one pass
  // (up to a barrier or warp operation) at a time: in turn, or at random when Shuffled. Needs
  // every __shared__ variable registered (QK_SHARED), since each block's copy is swapped in.
  unsigned interleave = 1;
};

struct KernelFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs `thread_body` once for every thread of every block of `grid`, blocks in x, y, z order.
// Blocks of at most 1024 threads; shuffles need whole warps (threads a multiple of 32).
void launch(Dim3 grid, Dim3 block, const std::function<void()>& thread_body,
            const LaunchOptions& o = {});

// The calling thread's indices; valid only inside launch's thread_body.
const Dim3& thread_index();
const Dim3& block_index();
const Dim3& block_dim();
const Dim3& grid_dim();

void syncthreads();
// Registers a __shared__ variable (host_cuda.hpp's QK_SHARED): the first time a block reaches it,
// its bytes are poisoned with 0xff (fp32 NaN, int -1), so a read before any write shows.
void shared_region(void* p, size_t bytes);
float shfl_xor(unsigned mask, float v, int lane_mask);
void syncwarp(unsigned mask);

std::string describe(const LaunchOptions& o);

}  // namespace qkmla::gpu::emu
