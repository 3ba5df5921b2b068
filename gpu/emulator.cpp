// The fiber scheduler of emulator.hpp. One block at a time, in passes: every runnable thread runs,
// in the pass's order, until it blocks (at __syncthreads or a warp operation) or exits, and hands
// over to the next one directly; then whole warps waiting in a warp operation complete it, and when
// every thread waits at the barrier, the barrier opens. Anything else is a fault.
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
  std::vector<unsigned> order;  // this pass's thread order
  size_t pos = 0;               // the running thread's position in it
  ucontext_t scheduler{};
  std::exception_ptr error;
#ifdef QK_ASAN_FIBERS
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
#endif
};

thread_local Launch* g_launch = nullptr;

// Fiber stacks kept between launches of this thread (a pipeline run makes five launches of up to
// 256 threads; allocating 256 KB stacks anew for each one cost page faults, not work).
thread_local std::vector<std::unique_ptr<char[]>> g_stack_pool;

// Lends the pool's stacks to a launch's fibers and takes them back, also when the launch throws.
struct StackLoan {
  std::vector<Fiber>& fibers;
  explicit StackLoan(std::vector<Fiber>& f) : fibers(f) {
    for (Fiber& x : fibers)
      if (!g_stack_pool.empty()) x.stack = std::move(g_stack_pool.back()), g_stack_pool.pop_back();
  }
  ~StackLoan() {
    for (Fiber& x : fibers)
      if (x.stack) g_stack_pool.push_back(std::move(x.stack));
  }
};

Launch& active() {
  if (!g_launch) throw KernelFault("emulator: a CUDA built-in was used outside a kernel launch");
  return *g_launch;
}

std::string where(const Launch& L, const Fiber& f) {
  return "block (" + std::to_string(L.bid.x) + "," + std::to_string(L.bid.y) + "," +
         std::to_string(L.bid.z) + ") thread (" + std::to_string(f.tid.x) + "," +
         std::to_string(f.tid.y) + "," + std::to_string(f.tid.z) + ")";
}

// The next thread of this pass that can run, after position L.pos of L.order; null when none.
Fiber* next_in_pass(Launch& L) {
  while (++L.pos < L.order.size()) {
    Fiber& g = L.fibers[L.order[L.pos]];
    if (g.state == State::Runnable) return &g;
  }
  return nullptr;
}

// Where a fiber goes when it blocks or exits: straight to the pass's next runnable thread (one
// context switch per thread and pass), or back to the scheduler when the pass is over. `from` is
// null for an exiting fiber (its stack is not resumed again).
void pass_on(Launch& L, Fiber* from) {
  Fiber* next = next_in_pass(L);
  ucontext_t* to = next ? &next->ctx : &L.scheduler;
  L.current = next;
#ifdef QK_ASAN_FIBERS
  __sanitizer_start_switch_fiber(from ? &from->fake_stack : nullptr,
                                 next ? next->stack.get() : L.sched_bottom,
                                 next ? kStackBytes : L.sched_size);
#endif
  if (!from) {
    setcontext(to);
    return;  // not reached
  }
  swapcontext(&from->ctx, to);
#ifdef QK_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(from->fake_stack, nullptr, nullptr);
#endif
}

// A blocking fiber: returns when a later pass reaches it again.
void block_here(Launch& L, Fiber& f) { pass_on(L, &f); }

void fiber_entry() {
  Launch& L = *g_launch;
  Fiber& f = *L.current;
#ifdef QK_ASAN_FIBERS
  // The launch's first fiber is always entered from the scheduler: that gives its stack.
  const void* from_bottom = nullptr;
  size_t from_size = 0;
  __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
  if (!L.sched_bottom) L.sched_bottom = from_bottom, L.sched_size = from_size;
#endif
  try {
    (*L.body)();
  } catch (...) {
    if (!L.error) L.error = std::current_exception();
  }
  f.state = State::Exited;
  pass_on(L, nullptr);
}

// Scheduler -> the pass's first runnable fiber; returns when the pass is over.
void run_pass(Launch& L) {
  L.pos = size_t(-1);
  Fiber* first = next_in_pass(L);
  if (!first) return;
  L.current = first;
#ifdef QK_ASAN_FIBERS
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, first->stack.get(), kStackBytes);
#endif
  swapcontext(&L.scheduler, &first->ctx);
#ifdef QK_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  L.current = nullptr;
}

void start_fiber(Launch& L, Fiber& f, unsigned linear) {
  if (!f.stack) f.stack = std::make_unique_for_overwrite<char[]>(kStackBytes);  // not zeroed
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
bool complete_warp_ops(Launch& L) {
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
  L.order.resize(n);
  std::iota(L.order.begin(), L.order.end(), 0u);
  if (o.order == Order::Reverse) std::reverse(L.order.begin(), L.order.end());
  for (;;) {
    if (o.order == Order::Shuffled) std::shuffle(L.order.begin(), L.order.end(), rng);
    run_pass(L);  // every runnable thread runs, in order, until it blocks or exits
    if (L.error) std::rethrow_exception(L.error);
    if (std::all_of(L.fibers.begin(), L.fibers.end(),
                    [](const Fiber& f) { return f.state == State::Exited; }))
      return;
    if (!complete_warp_ops(L)) open_barrier_or_fault(L);
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
  const StackLoan loan(L.fibers);
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
  block_here(L, f);
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
  block_here(L, f);
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
