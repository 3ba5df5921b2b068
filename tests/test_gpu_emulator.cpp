// gpu.emulator.*: the fiber emulator that runs the CUDA kernels on the CPU
// (gpu/emulator/emulator.hpp), and gpu.emulated.*: the kernels' pipeline run by it against the CPU
// model.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "gpu/emulator/emulated.hpp"
#include "gpu/kernels/kernels.cuh"  // compiled here as host C++: warp_tree is the kernels' own butterfly
#include "gpu/qkmla_gpu.hpp"
#include "helpers.hpp"
#include "impl/gpu_impl.hpp"

using namespace qkmla;
using namespace qkmla::gpu;

namespace {

const emu::LaunchOptions kForward{}, kReverse{emu::Order::Reverse, 0},
    kShuffled{emu::Order::Shuffled, 7};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("gpu.emulator.every_thread_of_every_block_runs_once_with_its_indices") {
  const dim3 grid(3, 2, 2), block(64, 2);
  std::vector<int> seen(grid.count() * block.count(), 0);
  for (const auto& o : {kForward, kReverse, kShuffled}) {
    std::fill(seen.begin(), seen.end(), 0);
    emu::launch(
        grid, block,
        [&] {
          CHECK(blockDim.x == 64u);
          CHECK(gridDim.z == 2u);
          const unsigned b = blockIdx.x + grid.x * (blockIdx.y + grid.y * blockIdx.z);
          ++seen[b * block.count() + threadIdx.x + block.x * threadIdx.y];
        },
        o);
    CHECK(std::count(seen.begin(), seen.end(), 1) == long(seen.size()));
  }
}

TEST_CASE("gpu.emulator.warp_tree_equals_tree32_in_every_lane") {
  // kernels.cuh's claim: the xor butterfly leaves tree32's sum (math.hpp, what the model uses) in
  // every lane, bit for bit, whatever the order the threads run in.
  std::mt19937_64 g(20261202);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  for (int trial = 0; trial < 20; ++trial) {
    float v[64];
    for (float& x : v) x = u(g) * std::ldexp(1.0f, int(g() % 40) - 20);
    float want[2];
    for (int w = 0; w < 2; ++w) {
      float lanes[32];
      std::copy(v + 32 * w, v + 32 * w + 32, lanes);
      want[w] = tree32(lanes);
    }
    std::vector<float> got(64);
    emu::launch(
        dim3(1), dim3(64), [&] { got[threadIdx.x] = warp_tree(v[threadIdx.x]); },
        trial % 2 ? kShuffled : kForward);
    for (unsigned t = 0; t < 64; ++t) REQUIRE(f2u(got[t]) == f2u(want[t / 32]));
  }
}

TEST_CASE("gpu.emulator.barrier_orders_shared_memory_and_a_race_shows_as_order_dependence") {
  auto neighbours = [](bool with_barrier, const emu::LaunchOptions& o) {
    std::vector<int> out(128);
    emu::launch(
        dim3(2), dim3(128),
        [&] {
          __shared__ int s[128];
          const int t = int(threadIdx.x);
          s[t] = t + 1000 * int(blockIdx.x);
          if (with_barrier) __syncthreads();
          const int read = s[(t + 1) % 128];
          if (with_barrier) __syncthreads();  // no thread overwrites s before all have read it
          if (blockIdx.x == 1) out[size_t(t)] = read;
        },
        o);
    return out;
  };
  for (const auto& o : {kForward, kReverse, kShuffled}) {
    const auto v = neighbours(true, o);
    for (int t = 0; t < 128; ++t) REQUIRE(v[size_t(t)] == (t + 1) % 128 + 1000);
  }
  // Without the barriers each thread runs to its end at once: in forward order thread t reads
  // t+1's slot before t+1 wrote it (the previous block's value); in reverse order after.
  CHECK(neighbours(false, kForward) != neighbours(false, kReverse));
}

TEST_CASE("gpu.emulator.divergent_barrier_and_partial_warp_shuffle_are_faults") {
  CHECK_THROWS_WITH_AS(emu::launch(dim3(1), dim3(64),
                                   [] {
                                     if (threadIdx.x == 5) return;
                                     __syncthreads();
                                   }),
                       doctest::Contains("divergent barrier"), emu::KernelFault);
  CHECK_THROWS_WITH_AS(emu::launch(dim3(1), dim3(64),
                                   [] {
                                     if (threadIdx.x < 16)
                                       (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
                                   }),
                       doctest::Contains("never reaches"), emu::KernelFault);
  CHECK_THROWS_WITH_AS(emu::launch(dim3(1), dim3(64),
                                   [] {  // lane 0 exits, lanes 1-31 wait
                                     if (threadIdx.x > 0) __syncwarp();
                                   }),
                       doctest::Contains("never reaches"), emu::KernelFault);
  CHECK_THROWS_WITH_AS(emu::launch(dim3(1), dim3(32),
                                   [] {
                                     if (threadIdx.x == 0)
                                       __syncwarp();
                                     else
                                       (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
                                   }),
                       doctest::Contains("different warp operations"), emu::KernelFault);
  CHECK_THROWS_WITH_AS(
      emu::launch(dim3(1), dim3(32),
                  [] { (void)__shfl_xor_sync(0xffffffffu, 1.0f, threadIdx.x < 8 ? 1 : 2); }),
      doctest::Contains("different offsets"), emu::KernelFault);
  CHECK_THROWS_WITH_AS(emu::launch(dim3(2), dim3(32),
                                   [] {
                                     if (blockIdx.x == 1 && threadIdx.x == 3)
                                       throw std::runtime_error("boom");
                                     __syncthreads();
                                   }),
                       "boom", std::runtime_error);
  // After a fault the emulator is usable again, and CUDA names outside a launch are refused.
  int ran = 0;
  emu::launch(dim3(1), dim3(32), [&] { ++ran; });
  CHECK(ran == 32);
  CHECK_THROWS_AS((void)threadIdx.x, emu::KernelFault);
}

TEST_CASE("gpu.emulated.kernels_equal_model_and_the_comparison_can_fail") {
  // One short case per form through the kernels' own code (the fuller matrix is the ctest
  // gpu.emulated.bits); then a different split plan, which must show in the bits.
  for (bool ex : {false, true}) {
    MlaConfig c = test::tiny_config(Profile::BF16, {130, 0, 7}, 2, NormMode::Blockwise, 11);
    c.set_default_scale();
    const GpuCase gc = impl::to_gpu_case(generate_case(c));
    RunOptions o;
    o.explicit_form = ex;
    o.pages_per_split = 1;
    const GpuOutputs e = run_emulated(gc, o, kShuffled), m = run_model(gc, o);
    CAPTURE(ex);
    CHECK(e.device.find("emulator") != std::string::npos);
    CHECK(same_bits(e.out, m.out));
    CHECK(same_bits(e.lse, m.lse));
    CHECK(same_bits(e.latent_out, m.latent_out));
    CHECK(same_bits(e.alpha_q, m.alpha_q));
    o.pages_per_split = 3;  // one split instead of three: another combine, other last bits
    const GpuOutputs one = run_model(gc, o);
    CHECK_FALSE((same_bits(one.out, e.out) && same_bits(one.lse, e.lse)));
  }
}

TEST_CASE("gpu.emulator.shared_memory_read_before_write_is_caught_by_its_poison") {
  // Without the poison, block 1 would read block 0's leftovers (plausible values): a kernel bug
  // that a zeroed or persisting emulated __shared__ hid.
  for (unsigned inter : {1u, 3u})
    for (const auto& o : {kForward, kReverse, kShuffled}) {
      emu::LaunchOptions e = o;
      e.interleave = inter;
      std::vector<float> got(4 * 64, 0.0f), good(4 * 64, 0.0f);
      emu::launch(
          dim3(4), dim3(64),
          [&] {
            __shared__ float s[64];
            QK_SHARED(s);
            const unsigned t = threadIdx.x, b = blockIdx.x;
            got[b * 64 + t] = s[t];  // the bug: read before any write in this block
            __syncthreads();
            s[t] = float(t);
            __syncthreads();
            good[b * 64 + t] = s[63 - t];
          },
          e);
      for (unsigned i = 0; i < got.size(); ++i) {
        REQUIRE(f2u(got[i]) == 0xffffffffu);  // poisoned: NaN, in every block
        REQUIRE(good[i] == float(63 - i % 64));
      }
    }
}

TEST_CASE("gpu.emulator.interleaved_blocks_take_turns_and_keep_their_own_shared_memory") {
  std::vector<int> events, out(6 * 32, -1);
  emu::LaunchOptions e = kShuffled;
  e.interleave = 3;
  emu::launch(
      dim3(6), dim3(32),
      [&] {
        __shared__ int s[32];
        QK_SHARED(s);
        const int t = int(threadIdx.x), b = int(blockIdx.x);
        s[t] = 100 * b + t;
        if (t == 0) events.push_back(b);
        __syncthreads();
        if (t == 0) events.push_back(b);
        out[b * 32 + t] = s[31 - t];
      },
      e);
  for (int i = 0; i < 6 * 32; ++i) CHECK(out[i] == 100 * (i / 32) + 31 - i % 32);
  // Interleaved: between some block's two events, another block ran (one after another, each
  // block's two events would be adjacent).
  bool interleaved = false;
  for (size_t i = 0; i + 1 < events.size(); i += 2) interleaved |= events[i] != events[i + 1];
  CHECK(events.size() == 12);
  CHECK(interleaved);
  CHECK(emu::describe(e).find("3 blocks interleaved") != std::string::npos);
}
