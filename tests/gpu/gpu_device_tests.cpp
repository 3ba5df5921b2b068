// GPU tests (ctest label `gpu`): the kernels against their CPU model, bit for bit, and a bench
// smoke run. Without a CUDA device: prints why and returns 77 (ctest SKIP_RETURN_CODE).
//   gpu_device_tests bits   every profile x split boundaries x S_q x norms x forms x plans
//   gpu_device_tests bits-small   tiny shapes, bf16 and fp8 only: for compute-sanitizer
//   gpu_device_tests bench  a short `run_bench` (two contexts)
//   gpu_device_tests sanitize   a few tiny runs for compute-sanitizer; prints "ran N kernel
//     launches" (gpu/device_check.sh fails a sanitizer step that lacks it: a vacuous pass)
//   gpu_device_tests preflight  the device, the compiled architectures and one tiny run vs the
//     model (exit 0 only when a kernel ran and matched)
// Without a device (any machine, test gpu.emulated.bits):
//   gpu_device_tests bits-emulated [forward|reverse|shuffled|interleaved]   the same matrix with
//   the real
//     shapes shortened, the kernels run by the CPU emulator (gpu/emulator/emulator.hpp) in that
//     thread order
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#define DOCTEST_CONFIG_DISABLE  // helpers.hpp only; this runner is not a doctest binary
#include "gpu/emulator/emulated.hpp"
#include "gpu/qkmla_gpu.hpp"
#include "helpers.hpp"
#include "impl/gpu_impl.hpp"

using namespace qkmla;

namespace {

struct Diff {
  size_t total = 0, differ = 0;
  std::string first;
};

void diff(const char* name, const std::vector<float>& dev, const std::vector<float>& mod, Diff& d) {
  if (dev.size() != mod.size()) {
    d.differ += std::max(dev.size(), mod.size());
    d.first = std::string(name) + ": sizes differ";
    return;
  }
  for (size_t i = 0; i < dev.size(); ++i, ++d.total) {
    const bool same =
        (std::isnan(dev[i]) && std::isnan(mod[i])) || std::memcmp(&dev[i], &mod[i], 4) == 0;
    if (!same && d.differ++ == 0)
      d.first = std::string(name) + "[" + std::to_string(i) + "] device " + std::to_string(dev[i]) +
                " model " + std::to_string(mod[i]);
  }
}

MlaConfig config(const std::string& preset, Profile p, std::vector<int> seqlens, int sq,
                 NormMode norm, uint64_t seed) {
  MlaConfig c = test::tiny_config(p, std::move(seqlens), sq, norm, seed, preset);
  c.set_default_scale();
  return c;
}

enum class Mode { Full, Small, Emulated, EmulatedSmall, Sanitize, Preflight };

// Small: tiny shapes, two profiles, no real shapes: seconds even under compute-sanitizer.
// Emulated: the full matrix with the real shapes' sequences shortened (every thread is a fiber).
int bits(Mode mode, const gpu::emu::LaunchOptions& emu = {}) {
  const bool small = mode == Mode::Small || mode == Mode::EmulatedSmall,
             emulated = mode == Mode::Emulated || mode == Mode::EmulatedSmall;
  int failures = 0, runs = 0;
  const int sms = emulated ? 132 : gpu::device_sm_count();
  struct Shape {
    std::string preset;
    std::vector<int> seqlens;
  };
  const std::vector<Shape> shapes =
      mode == Mode::Sanitize ? std::vector<Shape>{{"tiny", {65, 0, 5}}}
      : mode == Mode::Preflight
          ? std::vector<Shape>{{"tiny", {1, 0}}}
          : std::vector<Shape>{{"tiny", {0}},  // T_max = 0: no append launch at all
                               {"tiny", {1, 0}},
                               {"tiny", {63, 64}},
                               {"tiny", {65, 0, 5}},
                               {"tiny", {3 * 64 + 5}},
                               {"paper-decode", emulated ? std::vector<int>{200, 0, 130}
                                                         : std::vector<int>{4096, 0, 130}},
                               {"paper-g8", {emulated ? 150 : 1000}}};
  const bool tiny_set = mode == Mode::Sanitize || mode == Mode::Preflight;
  const std::vector<Profile> profiles =
      mode == Mode::Preflight ? std::vector<Profile>{Profile::BF16}
      : small || tiny_set
          ? std::vector<Profile>{Profile::BF16, Profile::FP8}
          : std::vector<Profile>{Profile::FP32, Profile::BF16, Profile::FP16, Profile::FP8};
  for (Profile p : profiles)
    for (const Shape& sh : shapes)
      for (int sq : {1, 2, 4})
        for (NormMode norm : {NormMode::Blockwise, NormMode::Unified})
          for (bool ex : {false, true})
            for (int pps : {0, 1, 3}) {
              bool ok = true;
              for (int T : sh.seqlens) ok = ok && (T == 0 || T >= sq);
              if (!ok || (ex && norm == NormMode::Unified)) continue;
              // Sanitize: S_q 1 and 4, blockwise, both forms, one and several splits (8 runs).
              if (tiny_set && (sq == 2 || norm == NormMode::Unified || pps == 3)) continue;
              if (mode == Mode::Preflight && (sq != 1 || ex || pps != 0)) continue;
              // The emulated small set keeps the real shapes in bf16: r = 512 is the one shape
              // whose decode threads own two value columns.
              const bool real_kept = mode == Mode::EmulatedSmall && p == Profile::BF16;
              if (small && ((sh.preset != "tiny" && !real_kept) || sq == 2 || pps == 3)) continue;
              // Real shapes: the default plan, blockwise, S_q 1 and 4 (4: several row blocks);
              // keeps it short.
              if (sh.preset != "tiny" && (pps != 0 || norm == NormMode::Unified || sq == 2))
                continue;
              const Case k =
                  generate_case(config(sh.preset, p, sh.seqlens, sq, norm, uint64_t(runs + 1)));
              const gpu::GpuCase gc = impl::to_gpu_case(k);
              gpu::RunOptions o;
              o.explicit_form = ex;
              o.pages_per_split = pps;
              o.sm_count = sms;
              const gpu::GpuOutputs d = emulated ? gpu::run_emulated(gc, o, emu)
                                                 : gpu::run_on_device(gc, o),
                                    m = gpu::run_model(gc, o);
              Diff df;
              diff("out", d.out, m.out, df);
              diff("lse", d.lse, m.lse, df);
              diff("latent_out", d.latent_out, m.latent_out, df);
              diff("alpha_q", d.alpha_q, m.alpha_q, df);
              diff("alpha_k", d.alpha_k, m.alpha_k, df);
              ++runs;
              std::printf(
                  "%-6s %-13s seqlens %-14s S_q %d %-9s %-8s pps %d splits %3d: %s\n",
                  to_string(p).c_str(), sh.preset.c_str(),
                  [&] {
                    std::string s;
                    for (int T : sh.seqlens) s += (s.empty() ? "" : ",") + std::to_string(T);
                    return s;
                  }()
                      .c_str(),
                  sq, to_string(norm).c_str(), ex ? "explicit" : "absorbed", d.pages_per_split,
                  d.max_splits,
                  df.differ == 0
                      ? ("bit-identical (" + std::to_string(df.total) + " elements)").c_str()
                      : (std::to_string(df.differ) + " of " + std::to_string(df.total) +
                         " differ; first " + df.first)
                            .c_str());
              if (df.differ) ++failures;
            }
  std::printf("gpu.kernels_match_model: %d of %d runs differ\n", failures, runs);
  if (!emulated) {
    std::printf("ran %ld kernel launches in %d runs\n", gpu::device_launch_count(), runs);
    if (gpu::device_launch_count() == 0) return 1;
  }
  return failures ? 1 : 0;
}

int bench() {
  gpu::BenchOptions o;
  o.contexts = {4096, 65536};
  o.reps = 10;
  o.warmup = 3;
  std::string device;
  const auto rows = gpu::run_bench(o, &device);
  for (const auto& r : rows)
    std::printf(
        "bench %s context %d: qk-norm %.4f ms, plain %.4f ms, overhead %+.2f %%, %.0f GB/s\n",
        device.c_str(), r.context, r.ms_norm, r.ms_plain, r.overhead_pct, r.gbs_norm);
  return rows.size() == 2 && rows[0].ms_norm > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a file: a run killed by a time limit keeps every finished line.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc > 1 && std::string(argv[1]) == "stall") {  // tests/gpu/device_scripts.sh: a hung step
    std::printf("stall: this line was printed before the hang\n");
    std::cout << "stall: so was this one" << std::endl;
    std::printf("stall: and this one, not flushed by hand\n");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (argc > 1 && std::string(argv[1]).rfind("bits-emulated", 0) == 0) {
    gpu::emu::LaunchOptions e;
    const std::string order = argc > 2 ? argv[2] : "forward";
    e.order = order == "reverse"                              ? gpu::emu::Order::Reverse
              : order == "shuffled" || order == "interleaved" ? gpu::emu::Order::Shuffled
                                                              : gpu::emu::Order::Forward;
    if (order == "interleaved") e.interleave = 3;  // three blocks in flight, taking turns
    e.seed = 20261202;
    std::cout << "device: " << gpu::emu::describe(e) << "\n";
    try {
      return bits(
          std::string(argv[1]) == "bits-emulated-small" ? Mode::EmulatedSmall : Mode::Emulated, e);
    } catch (const std::exception& ex) {
      std::cout << "FAIL: " << ex.what() << "\n";
      return 1;
    }
  }
  std::string why;
  if (!gpu::device_available(&why)) {
    std::cout << "SKIP: " << why << "\n";
    return 77;
  }
  std::cout << "device: " << gpu::device_description() << "\n";
  const std::string what = argc > 1 ? argv[1] : "bits";
  try {
    if (what == "bits") return bits(Mode::Full);
    if (what == "bits-small") return bits(Mode::Small);
    if (what == "bench") return bench();
    if (what == "sanitize") return bits(Mode::Sanitize);
    if (what == "preflight") {
      std::cout << "compiled for: " << gpu::compiled_arch_list() << "\n";
      return bits(Mode::Preflight);
    }
  } catch (const std::exception& e) {
    std::cout << "FAIL: " << e.what() << "\n";
    return 1;
  }
  std::cerr
      << "usage: gpu_device_tests bits|bits-small|sanitize|preflight|bench|stall|bits-emulated "
         "[forward|reverse|shuffled]\n";
  return 2;
}
