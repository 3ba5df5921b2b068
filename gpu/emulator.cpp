// The fiber scheduler of emulator.hpp. One block at a time: every live thread runs until it blocks
// (at __syncthreads or a shuffle) or exits; then whole warps waiting in a shuffle exchange their
// values, and when every thread waits at the barrier, the barrier opens. Anything else is a fault.
#include "emulator.hpp"

#include <ucontext.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define QK_ASAN_FIBERS 1
#endif

namespace qkmla::gpu::emu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;  // per thread; the kernels' frames are a few KB
constexpr unsigned kWarp = 32;

enum class State { Runnable, AtBarrier, AtWarpOp, Exited };
enum class WarpOp { Shuffle, Sync };

struct Fiber {
  ucontext_t ctx{};
  std::unique_ptr<char[]> stack;
  Dim3 tid;
  State state = State::Runnable;
  WarpOp op = WarpOp::Shuffle;
  unsigned mask = 0;
  int lane_mask = 0;
  float value = 0, result = 0;
#ifdef QK_ASAN_FIBERS
  void* fake_stack = nullptr;
#endif
};

struct Launch {
  Dim3 grid, block, bid;
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  ucontext_t scheduler{};
  std::exception_ptr error;
#ifdef QK_ASAN_FIBERS
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
#endif
};

thread_local Launch* g_launch = nullptr;

Launch& active() {
  if (!g_launch) throw KernelFault("emulator: a CUDA built-in was used outside a kernel launch");
  return *g_launch;
}

std::string where(const Launch& L, const Fiber& f) {
  return "block (" + std::to_string(L.bid.x) + "," + std::to_string(L.bid.y) + "," +
         std::to_string(L.bid.z) + ") thread (" + std::to_string(f.tid.x) + "," +
         std::to_string(f.tid.y) + "," + std::to_string(f.tid.z) + ")";
}

// Fiber -> scheduler; returns when the scheduler resumes this fiber.
void yield_to_scheduler(Launch& L, Fiber& f) {
#ifdef QK_ASAN_FIBERS
  __sanitizer_start_switch_fiber(&f.fake_stack, L.sched_bottom, L.sched_size);
#endif
  swapcontext(&f.ctx, &L.scheduler);
#ifdef QK_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

void fiber_entry() {
  Launch& L = *g_launch;
  Fiber& f = *L.current;
#ifdef QK_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(nullptr, &L.sched_bottom, &L.sched_size);
#endif
  try {
    (*L.body)();
  } catch (...) {
    if (!L.error) L.error = std::current_exception();
  }
  f.state = State::Exited;
#ifdef QK_ASAN_FIBERS
  __sanitizer_start_switch_fiber(nullptr, L.sched_bottom, L.sched_size);
#endif
  // Returning resumes uc_link, the scheduler.
}

// Scheduler -> fiber, until it blocks or exits.
void resume(Launch& L, Fiber& f) {
  L.current = &f;
#ifdef QK_ASAN_FIBERS
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack.get(), kStackBytes);
#endif
  swapcontext(&L.scheduler, &f.ctx);
#ifdef QK_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  L.current = nullptr;
}

void start_fiber(Launch& L, Fiber& f, unsigned linear) {
  if (!f.stack) f.stack = std::make_unique<char[]>(kStackBytes);
  f.tid = {linear % L.block.x, linear / L.block.x % L.block.y, linear / (L.block.x * L.block.y)};
  f.state = State::Runnable;
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.get();
  f.ctx.uc_stack.ss_size = kStackBytes;
  f.ctx.uc_link = &L.scheduler;
  makecontext(&f.ctx, fiber_entry, 0);
}

// Completes the warp operation (a shuffle's exchange, a __syncwarp) of every warp whose 32 lanes
// all wait in one. Returns whether any did.
bool resolve_shuffles(Launch& L) {
  bool any = false;
  for (size_t w = 0; w * kWarp < L.fibers.size(); ++w) {
    Fiber* lanes = &L.fibers[w * kWarp];
    const size_t n = std::min<size_t>(kWarp, L.fibers.size() - w * kWarp);
    const size_t waiting = size_t(
        std::count_if(lanes, lanes + n, [](const Fiber& f) { return f.state == State::AtWarpOp; }));
    if (waiting == 0 || waiting < n) continue;
    for (size_t l = 0; l < n; ++l) {
      if (n < kWarp || lanes[l].mask != 0xffffffffu)
        throw KernelFault("emulator: " + where(L, lanes[l]) +
                          ": warp operations need all 32 lanes (mask 0xffffffff, whole warps)");
      if (lanes[l].op != lanes[0].op)
        throw KernelFault("emulator: " + where(L, lanes[l]) +
                          ": lanes of one warp wait in different warp operations");
      if (lanes[l].lane_mask != lanes[0].lane_mask)
        throw KernelFault("emulator: " + where(L, lanes[l]) +
                          ": lanes of one warp shuffle with different offsets");
    }
    for (size_t l = 0; l < n; ++l) {
      lanes[l].result = lanes[l ^ size_t(lanes[l].lane_mask & 31)].value;
      lanes[l].state = State::Runnable;
    }
    any = true;
  }
  return any;
}

// Called when no thread can run: opens the barrier, or names the fault.
void open_barrier_or_fault(Launch& L) {
  for (const Fiber& f : L.fibers)
    if (f.state == State::AtWarpOp)
      throw KernelFault("emulator: " + where(L, f) +
                        " waits in a warp shuffle or __syncwarp that a lane of its warp never " +
                        "reaches (it exited or waits at __syncthreads)");
  // No thread runs, none waits in a warp operation and not all exited: some wait at the barrier.
  const auto waiting = std::find_if(L.fibers.begin(), L.fibers.end(),
                                    [](const Fiber& f) { return f.state == State::AtBarrier; });
  for (const Fiber& f : L.fibers)
    if (f.state == State::Exited)
      throw KernelFault("emulator: " + where(L, f) + " exited while " + where(L, *waiting) +
                        " waits at __syncthreads (divergent barrier)");
  for (Fiber& f : L.fibers) f.state = State::Runnable;
}

void run_block(Launch& L, const LaunchOptions& o, std::mt19937_64& rng) {
  const unsigned n = L.block.count();
  for (unsigned i = 0; i < n; ++i) start_fiber(L, L.fibers[i], i);
  std::vector<unsigned> order(n);
  std::iota(order.begin(), order.end(), 0u);
  if (o.order == Order::Reverse) std::reverse(order.begin(), order.end());
  for (;;) {
    if (o.order == Order::Shuffled) std::shuffle(order.begin(), order.end(), rng);
    for (unsigned i : order)
      if (L.fibers[i].state == State::Runnable) resume(L, L.fibers[i]);
    if (L.error) std::rethrow_exception(L.error);
    if (std::all_of(L.fibers.begin(), L.fibers.end(),
                    [](const Fiber& f) { return f.state == State::Exited; }))
      return;
    if (!resolve_shuffles(L)) open_barrier_or_fault(L);
  }
}

}  // namespace

void launch(Dim3 grid, Dim3 block, const std::function<void()>& thread_body,
            const LaunchOptions& o) {
  if (g_launch) throw KernelFault("emulator: a launch from inside a kernel is not supported");
  if (block.count() == 0 || block.count() > 1024)
    throw KernelFault("emulator: a block needs 1 to 1024 threads, not " +
                      std::to_string(block.count()));
  if (grid.count() == 0) throw KernelFault("emulator: a grid with a zero dimension");
  Launch L;
  L.grid = grid;
  L.block = block;
  L.body = &thread_body;
  L.fibers.resize(block.count());
  std::mt19937_64 rng(o.seed);
  g_launch = &L;
  try {
    for (L.bid.z = 0; L.bid.z < grid.z; ++L.bid.z)
      for (L.bid.y = 0; L.bid.y < grid.y; ++L.bid.y)
        for (L.bid.x = 0; L.bid.x < grid.x; ++L.bid.x) run_block(L, o, rng);
  } catch (...) {
    g_launch = nullptr;
    throw;
  }
  g_launch = nullptr;
}

const Dim3& thread_index() {
  Launch& L = active();
  if (!L.current) throw KernelFault("emulator: threadIdx read outside a thread");
  return L.current->tid;
}
const Dim3& block_index() { return active().bid; }
const Dim3& block_dim() { return active().block; }
const Dim3& grid_dim() { return active().grid; }

void syncthreads() {
  Launch& L = active();
  Fiber& f = *L.current;
  f.state = State::AtBarrier;
  yield_to_scheduler(L, f);
}

namespace {
float warp_op(WarpOp op, unsigned mask, float v, int lane_mask) {
  Launch& L = active();
  Fiber& f = *L.current;
  f.op = op;
  f.mask = mask;
  f.lane_mask = lane_mask;
  f.value = v;
  f.state = State::AtWarpOp;
  yield_to_scheduler(L, f);
  return f.result;
}
}  // namespace

float shfl_xor(unsigned mask, float v, int lane_mask) {
  return warp_op(WarpOp::Shuffle, mask, v, lane_mask);
}
void syncwarp(unsigned mask) { (void)warp_op(WarpOp::Sync, mask, 0.0f, 0); }

std::string describe(const LaunchOptions& o) {
  switch (o.order) {
    case Order::Reverse:
      return "cpu emulator (fibers, reverse thread order)";
    case Order::Shuffled:
      return "cpu emulator (fibers, thread order shuffled, seed " + std::to_string(o.seed) + ")";
    default:
      return "cpu emulator (fibers, forward thread order)";
  }
}

}  // namespace qkmla::gpu::emu
