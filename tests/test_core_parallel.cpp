// core.parallel.*: run_parallel's filler queue (the report's CPU implementations run on threads a
// reference phase would leave idle) and the report's independence of the thread count.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "core/parallel.hpp"
#include "helpers.hpp"
#include "report/report.hpp"

using namespace qkmla;

namespace {

// Waits until `flag` reaches `want` or 20 s pass; returns whether it did.
bool wait_for(const std::atomic<int>& flag, int want) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (flag.load() < want) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("core.parallel.fillers_run_once_each_on_threads_a_phase_leaves_idle") {
  constexpr int kFillers = 8;
  std::atomic<int> runs[kFillers] = {};
  std::atomic<int> done{0};
  auto make_fillers = [&] {
    std::vector<std::function<void()>> f;
    for (int i = 0; i < kFillers; ++i) f.push_back([&, i] { ++runs[i], ++done; });
    return f;
  };
  SUBCASE("two threads: the idle one runs fillers while the phase's one long task waits for them") {
    Fillers fillers(make_fillers());
    bool saw_three = false;
    run_parallel({[&] { saw_three = wait_for(done, 3); }}, 2, &fillers);
    CHECK(saw_three);  // fillers ran during the phase, not after it
    fillers.run_rest(2);
    CHECK(done == kFillers);
  }
  SUBCASE("one thread: no filler runs inside a phase, all of them in run_rest") {
    Fillers fillers(make_fillers());
    run_parallel({[] {}, [] {}}, 1, &fillers);
    CHECK(done == 0);
    fillers.run_rest(3);
    CHECK(done == kFillers);
  }
  for (const auto& r : runs) CHECK(r == 1);  // exactly once each, whoever ran it
}

// A worker whose phase ended keeps taking fillers while another worker is still in one, instead
// of waiting idle for it: the long filler here returns only once the others have run.
TEST_CASE("core.parallel.a_phase_ends_with_no_thread_idle_behind_a_filler") {
  std::atomic<int> long_started{0}, others{0};
  bool saw_others = false;
  Fillers fillers({[&] {
                     ++long_started;
                     saw_others = wait_for(others, 2);
                   },
                   [&] { ++others; }, [&] { ++others; }});
  // the phase's one task ends only after the other worker has taken the long filler
  run_parallel({[&] { wait_for(long_started, 1); }}, 2, &fillers);
  CHECK(saw_others);  // the task's worker ran the other two fillers during the phase
  CHECK(others == 2);
}

TEST_CASE("core.parallel.a_failing_filler_fails_the_phase_after_every_thread_stopped") {
  std::atomic<int> done{0};
  Fillers fillers({[] { throw std::runtime_error("filler failed"); }, [&] { ++done; }});
  CHECK_THROWS_WITH(run_parallel({[&] { wait_for(done, 1); }}, 2, &fillers), "filler failed");
  CHECK(done == 1);  // the filler after the failing one still ran while the phase task waited
}

namespace {

// Every row of b bit-identical to a's (metrics and ratio), and the agreeing bits.
void check_same_report(const Report& a, const Report& b) {
  REQUIRE(b.rows.size() == a.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    const Row &x = a.rows[i], &y = b.rows[i];
    CAPTURE(to_string(x.impl));
    CAPTURE(x.tensor);
    CHECK(to_string(x.impl) == to_string(y.impl));
    CHECK(std::memcmp(&x.m.rel_l2, &y.m.rel_l2, sizeof(double)) == 0);
    CHECK(std::memcmp(&x.m.max_abs, &y.m.max_abs, sizeof(double)) == 0);
    CHECK(std::memcmp(&x.m.max_ulp, &y.m.max_ulp, sizeof(double)) == 0);
    CHECK(std::memcmp(&x.baseline_ratio, &y.baseline_ratio, sizeof(double)) == 0);
  }
  for (size_t p = 0; p < a.references.size(); ++p)
    CHECK(a.references[p].agreeing_bits == b.references[p].agreeing_bits);
}

}  // namespace

TEST_CASE("report.thread_count_changes_no_value") {
  // Fillers move the CPU implementations between the reference's phases: every value must be the
  // same whichever phase (and thread) ran them. Seed printed on failure.
  const uint64_t seed = test::seed(61);
  CAPTURE(seed);
  auto report_with = [&](int threads) {
    ReportOptions o;
    o.cfg = test::tiny_config(Profile::BF16, {0, 9, 33}, 2, NormMode::Blockwise, seed);
    o.cfg.set_default_scale();
    o.profiles = {Profile::FP64, Profile::FP32, Profile::BF16, Profile::FP16, Profile::FP8};
    o.threads = threads;
    return run_report(o);
  };
  const Report one = report_with(1), two = report_with(2), three = report_with(3);
  REQUIRE(one.rows.size() > 40);
  check_same_report(one, two);
  check_same_report(one, three);
}

TEST_CASE("report.compact_latent_changes_no_value") {
  // The report's implementations, the CPU model and the reference all read a compact cache
  // (compact_latent_values = 0 compacts every float cache, k_pe and the rope tables): every value
  // must be the same.
  const uint64_t seed = test::seed(62);
  CAPTURE(seed);
  auto report_with = [&](int64_t compact_from) {
    ReportOptions o;
    o.cfg = test::tiny_config(Profile::BF16, {0, 9, 33}, 2, NormMode::Unified, seed);
    o.cfg.set_default_scale();
    o.profiles = {Profile::FP32, Profile::BF16, Profile::FP16};
    o.compact_latent_values = compact_from;
    return run_report(o);
  };
  const Report whole = report_with(int64_t(1) << 40), compact = report_with(0);
  REQUIRE(whole.rows.size() > 20);
  check_same_report(whole, compact);
}
