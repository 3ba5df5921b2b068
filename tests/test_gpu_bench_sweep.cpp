// gpu.bench.*: `qkmla bench --sweep`'s definition and JSON-lines output, with a fake timer in
// place of the device (gpu/bench/bench_sweep.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "gpu/bench/bench_sweep.hpp"

using namespace qkmla::gpu;

TEST_CASE("gpu.bench.sweep_is_batch_x_context_x_heads") {
  const std::vector<SweepPoint> s = default_sweep();
  REQUIRE(s.size() == 24);
  std::set<std::tuple<int, int, int>> seen;
  for (const SweepPoint& p : s) {
    CHECK(p.groups == p.heads);
    seen.insert({p.batch, p.context, p.heads});
  }
  CHECK(seen.size() == 24);
  for (int b : {1, 4, 16, 64})
    for (int c : {4096, 16384, 65536})
      for (int h : {16, 128}) CHECK(seen.count({b, c, h}) == 1);
}

TEST_CASE("gpu.bench.rows_stream_as_json_lines_with_a_copy_baseline") {
  std::ostringstream out;
  int calls = 0;
  BenchBackend fake;
  fake.device = "fake \"H200\"";
  fake.copy_gbs = [] { return 4300.0; };
  fake.row = [&](const BenchOptions& o, int ctx) {
    // Streaming: every earlier row is already written when the next one is measured.
    const std::string so_far = out.str();
    CHECK(std::count(so_far.begin(), so_far.end(), '\n') == calls + 1);
    if (++calls == 5) throw std::runtime_error("CUDA: an injected failure");
    BenchRow r;
    r.batch = o.batch, r.heads = o.heads, r.groups = o.groups, r.context = ctx;
    r.ms_norm = 0.01 * o.batch, r.ms_plain = 0.0099 * o.batch;  // the fake timer
    r.gbs_norm = 2150.0;
    return r;
  };
  BenchOptions base;
  const int failed = run_sweep(default_sweep(), base, fake, out);
  CHECK(failed == 1);
  CHECK(calls == 24);
  std::istringstream in(out.str());
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));  // each line parses
  REQUIRE(rows.size() == 25);
  CHECK(rows[0]["copy_baseline"]["gbs"] == 4300.0);
  CHECK(rows[0]["copy_baseline"]["device"] == "fake \"H200\"");
  const std::vector<SweepPoint> s = default_sweep();
  for (size_t i = 1; i < rows.size(); ++i) {
    CAPTURE(i);
    CHECK(rows[i]["batch"] == s[i - 1].batch);
    CHECK(rows[i]["context"] == s[i - 1].context);
    CHECK(rows[i]["heads"] == s[i - 1].heads);
    if (i == 5) {
      CHECK(rows[i]["error"] == "CUDA: an injected failure");
      continue;
    }
    CHECK(rows[i]["ms_qknorm"].get<double>() == doctest::Approx(0.01 * s[i - 1].batch));
    CHECK(rows[i]["of_copy"].get<double>() == doctest::Approx(2150.0 / 4300.0));
    CHECK(rows[i]["of_datasheet"].get<double>() == doctest::Approx(2150.0 / 4800.0));
  }
}

TEST_CASE("gpu.bench.a_failed_copy_baseline_is_reported_and_rows_still_run") {
  std::ostringstream out, echo;
  BenchBackend fake;
  fake.copy_gbs = []() -> double { throw std::runtime_error("no copy"); };
  fake.row = [](const BenchOptions& o, int ctx) {
    BenchRow r;
    r.batch = o.batch, r.context = ctx, r.gbs_norm = 1000;
    return r;
  };
  CHECK(run_sweep({{1, 4096, 16, 16}}, BenchOptions{}, fake, out, &echo) == 0);
  CHECK(out.str() == echo.str());
  std::istringstream in(out.str());
  std::string a, b;
  std::getline(in, a), std::getline(in, b);
  CHECK(nlohmann::json::parse(a)["copy_baseline"]["error"] == "no copy");
  CHECK(nlohmann::json::parse(b)["of_copy"].is_null());  // no baseline: no fraction of it
}
