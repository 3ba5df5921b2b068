// The fiber scheduler of emulator.hpp. One block at a time, in passes: every runnable thread runs,
// in the pass's order, until it blocks (at __syncthreads or a warp operation) or exits, and hands
// over to the next one directly; then whole warps waiting in a warp operation complete it, and when
// every thread waits at the barrier, the barrier opens. Anything else is a fault.
#include "gpu/emulator/emulator.hpp"

#include <ucontext.h>

#include <algorithm>
#include <cstring>
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

// One block's threads, and its __shared__ contents while another block runs (interleaving).
struct Block {
  Dim3 bid;
  std::vector<Fiber> fibers;
  std::vector<unsigned> order;                    // this pass's thread order
  size_t pos = 0;                                 // the running thread's position in it
  std::vector<const void*> seen;                  // shared regions this block has reached
  std::vector<std::vector<unsigned char>> saved;  // their contents, parallel to `seen`
  Block(Dim3 b, unsigned threads);
  ~Block();
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
};

struct Launch {
  Dim3 grid, block;
  Block* cur = nullptr;  // the running block
  const std::function<void()>* body = nullptr;
  Fiber* current = nullptr;
  std::vector<std::pair<void*, size_t>> shared;  // every region registered in this launch
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

// A block's fibers borrow the pool's stacks and give them back, also when the launch throws.
Block::Block(Dim3 b, unsigned threads) : bid(b), fibers(threads) {
  for (Fiber& x : fibers)
    if (!g_stack_pool.empty()) x.stack = std::move(g_stack_pool.back()), g_stack_pool.pop_back();
}
Block::~Block() {
  for (Fiber& x : fibers)
    if (x.stack) g_stack_pool.push_back(std::move(x.stack));
}

Launch& active() {
  if (!g_launch) throw KernelFault("emulator: a CUDA built-in was used outside a kernel launch");
  return *g_launch;
}

std::string where(const Launch& L, const Fiber& f) {
  const Dim3& b = L.cur->bid;
  return "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) +
         ") thread (" + std::to_string(f.tid.x) + "," + std::to_string(f.tid.y) + "," +
         std::to_string(f.tid.z) + ")";
}

// The next thread of this pass that can run in the running block; null when none.
Fiber* next_in_pass(Launch& L) {
  Block& K = *L.cur;
  while (++K.pos < K.order.size()) {
    Fiber& g = K.fibers[K.order[K.pos]];
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
  L.cur->pos = size_t(-1);
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
  std::vector<Fiber>& fibers = L.cur->fibers;
  bool any = false;
  for (size_t w = 0; w * kWarp < fibers.size(); ++w) {
    Fiber* lanes = &fibers[w * kWarp];
    const size_t n = std::min<size_t>(kWarp, fibers.size() - w * kWarp);
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
  std::vector<Fiber>& fibers = L.cur->fibers;
  for (const Fiber& f : fibers)
    if (f.state == State::AtWarpOp)
      throw KernelFault("emulator: " + where(L, f) +
                        " waits in a warp shuffle or __syncwarp that a lane of its warp never " +
                        "reaches (it exited or waits at __syncthreads)");
  // No thread runs, none waits in a warp operation and not all exited: some wait at the barrier.
  const auto waiting = std::find_if(fibers.begin(), fibers.end(),
                                    [](const Fiber& f) { return f.state == State::AtBarrier; });
  for (const Fiber& f : fibers)
    if (f.state == State::Exited)
      throw KernelFault("emulator: " + where(L, f) + " exited while " + where(L, *waiting) +
                        " waits at __syncthreads (divergent barrier)");
  for (Fiber& f : fibers) f.state = State::Runnable;
}

// Switches the live __shared__ contents from block `from` (saved) to block `to` (restored).
void switch_shared(Launch& L, Block* from, Block* to) {
  if (from == to) return;
  if (from)
    for (size_t i = 0; i < from->seen.size(); ++i) {
      const auto r = std::find_if(L.shared.begin(), L.shared.end(),
                                  [&](const auto& x) { return x.first == from->seen[i]; });
      const auto* p = static_cast<const unsigned char*>(r->first);
      from->saved[i].assign(p, p + r->second);
    }
  if (to)
    for (size_t i = 0; i < to->seen.size(); ++i)
      std::memcpy(const_cast<void*>(to->seen[i]), to->saved[i].data(), to->saved[i].size());
  L.cur = to;
}

void start_block(Launch& L, Block& K, const LaunchOptions& o) {
  Block* was = L.cur;
  L.cur = &K;
  for (unsigned i = 0; i < K.fibers.size(); ++i) start_fiber(L, K.fibers[i], i);
  K.order.resize(K.fibers.size());
  std::iota(K.order.begin(), K.order.end(), 0u);
  if (o.order == Order::Reverse) std::reverse(K.order.begin(), K.order.end());
  L.cur = was;
}

// One pass of the running block, then its warp operations or barrier. Returns whether it is done.
bool step_block(Launch& L, const LaunchOptions& o, std::mt19937_64& rng) {
  Block& K = *L.cur;
  if (o.order == Order::Shuffled) std::shuffle(K.order.begin(), K.order.end(), rng);
  run_pass(L);  // every runnable thread runs, in order, until it blocks or exits
  if (L.error) std::rethrow_exception(L.error);
  if (std::all_of(K.fibers.begin(), K.fibers.end(),
                  [](const Fiber& f) { return f.state == State::Exited; }))
    return true;
  if (!complete_warp_ops(L)) open_barrier_or_fault(L);
  return false;
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
  std::mt19937_64 rng(o.seed);
  const unsigned blocks = grid.count(), live_max = std::max(1u, o.interleave);
  std::vector<std::unique_ptr<Block>> live;  // blocks started and not finished
  unsigned next = 0, turn = 0;
  g_launch = &L;
  try {
    while (next < blocks || !live.empty()) {
      while (live.size() < live_max && next < blocks) {  // blocks start in x, y, z order
        const unsigned b = next++;
        live.push_back(std::make_unique<Block>(
            Dim3(b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y)), block.count()));
        start_block(L, *live.back(), o);
      }
      // The block that runs the next pass: in turn, or a random one when shuffled.
      const size_t k =
          o.order == Order::Shuffled ? size_t(rng() % live.size()) : turn++ % live.size();
      switch_shared(L, L.cur, live[k].get());
      if (step_block(L, o, rng)) {
        switch_shared(L, L.cur, nullptr);
        live.erase(live.begin() + long(k));
      }
    }
  } catch (...) {
    g_launch = nullptr;
    throw;
  }
  g_launch = nullptr;
}

void shared_region(void* p, size_t bytes) {
  Launch& L = active();
  if (!L.cur) throw KernelFault("emulator: __shared__ memory registered outside a block");
  Block& K = *L.cur;
  if (std::find(K.seen.begin(), K.seen.end(), p) != K.seen.end()) return;
  if (std::find_if(L.shared.begin(), L.shared.end(), [&](const auto& x) { return x.first == p; }) ==
      L.shared.end())
    L.shared.emplace_back(p, bytes);
  std::memset(p, 0xff, bytes);  // poison: fp32 NaN, int -1, until the block writes it
  K.seen.push_back(p);
  K.saved.emplace_back();
}

const Dim3& thread_index() {
  Launch& L = active();
  if (!L.current) throw KernelFault("emulator: threadIdx read outside a thread");
  return L.current->tid;
}
const Dim3& block_index() {
  Launch& L = active();
  if (!L.cur) throw KernelFault("emulator: blockIdx read outside a block");
  return L.cur->bid;
}
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
  if (o.interleave > 1) {
    LaunchOptions one = o;
    one.interleave = 1;
    std::string s = describe(one);
    return s.substr(0, s.size() - 1) + ", " + std::to_string(o.interleave) + " blocks interleaved)";
  }
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
