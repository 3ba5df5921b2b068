// report.contexts.*: the error-against-context sweep (report/contexts.hpp) and its CLI; and
// cli.reference.*, the long-context reference command.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"
#include "core/presets.hpp"
#include "report/contexts.hpp"

using namespace qkmla;

TEST_CASE("report.contexts.one_column_per_context_one_line_per_implementation") {
  ReportOptions o;
  o.cfg = config_for(find_preset("tiny"), 1);
  o.cfg.seed = 7;
  o.profiles = {Profile::BF16, Profile::FP8};
  std::vector<double> seen;
  const ContextSweep s = run_context_sweep(
      o, {8, 40}, [&](double done, double total) { seen.push_back(done / total); });
  REQUIRE(s.at.size() == 2);
  // Progress is token-weighted and ends at 1: 8 / 96, 16 / 96, 56 / 96, 96 / 96.
  REQUIRE(seen.size() == 4);
  CHECK(seen.front() == doctest::Approx(8.0 / 96));
  CHECK(seen.back() == doctest::Approx(1.0));
  for (size_t i = 0; i < 2; ++i) {
    CHECK(s.at[i].cfg.seqlens.at(0) == (i ? 40 : 8));
    CHECK(s.at[i].references.size() == 2);  // both profiles, one at a time, merged
  }
  // Every line of a chart has a point at each context; x is the context (log axis).
  const auto charts = context_charts(s);
  REQUIRE(charts.size() == 4);  // {bf16, fp8} x {rel_l2, max_ulp}
  CHECK(charts[0].first == "bf16-rel_l2");
  CHECK(charts[3].first == "fp8-max_ulp");
  for (const auto& [name, plot] : charts) {
    CAPTURE(name);
    CHECK(plot.log_x);
    CHECK(plot.series.size() >= 5);
    for (const PlotSeries& line : plot.series) {
      CAPTURE(line.name);
      CHECK(line.name.find(".bf16") == std::string::npos);  // one line across contexts
      REQUIRE(line.points.size() == 2);
      CHECK(line.points[0].first == 8);
      CHECK(line.points[1].first == 40);
    }
  }
  // The table: the same metrics as each context's own report.
  const std::string t = render_context_table(s, "test", false);
  CHECK(t.find("rel_l2 @8") != std::string::npos);
  CHECK(t.find("max_ulp @40") != std::string::npos);
  CHECK(t.find("-- profile fp8 --") != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(render_context_json(s, "test"));
  CHECK(j["at"][1]["context"] == 40);
  for (const auto& row : j["at"][1]["rows"])
    if (row["impl"] == "cpu.explicit.bf16" && row["tensor"] == "out")
      for (const Row& r : s.at[1].rows)
        if (to_string(r.impl) == "cpu.explicit.bf16" && r.tensor == "out")
          CHECK(row["rel_l2"].get<double>() == r.m.rel_l2);
}

TEST_CASE("cli.report.contexts") {
  const auto dir = std::filesystem::temp_directory_path() / "qkmla-contexts-test";
  std::filesystem::create_directories(dir);
  // A name with a space and a single quote reaches gnuplot as it is (a shell-quoting bug had
  // made gnuplot fail on it).
  const std::string plot = (dir / "ctx it's.svg").string();
  std::string quoted = "'";
  for (char c : plot) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const test::Run r =
      test::run("report --preset tiny --contexts 24,6 --profile fp16 --plot " + quoted + "'");
  CAPTURE(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("contexts [6,24]") != std::string::npos);  // sorted
  CHECK(r.out.find("rel_l2 @6") != std::string::npos);
  for (const char* f : {"ctx it's-fp16-rel_l2.svg", "ctx it's-fp16-max_ulp.svg"})
    CHECK(std::filesystem::file_size(dir / f) > 1000);
  const test::Run missing =
      test::run("report --preset tiny --profile fp16 --plot /nonexistent-qkmla-dir/x.svg");
  CHECK(missing.code == 2);
  CHECK(missing.out.find("cannot write beside it") != std::string::npos);
  // Formats the sweep does not print, and a context that is not a positive count: exit 2.
  CHECK(test::run("report --preset tiny --contexts 8 --format html").code == 2);
  CHECK(test::run("report --preset tiny --contexts 8,0").code == 2);
  std::filesystem::remove_all(dir);
}

// qkmla reference: the truth alone with what it cost. Streamed (every block) and whole products
// give the same agreeing bits, since they are the same bits (proofs/reference.md S.1).
TEST_CASE("cli.reference.streamed_and_whole_agree") {
  const std::string args = "reference --preset tiny --seqlens 300,0,77 --sq 2 --norm unified";
  const test::Run whole = test::run(args);
  const test::Run streamed = test::run_raw("QKMLA_WHOLE_PRODUCTS_MIB=0 " QKMLA_BINARY " " + args);
  CAPTURE(whole.out);
  CAPTURE(streamed.out);
  REQUIRE(whole.code == 0);
  REQUIRE(streamed.code == 0);
  CHECK(whole.out.find("products           whole") != std::string::npos);
  CHECK(streamed.out.find("256-token blocks (streamed: yes") != std::string::npos);
  auto bits = [](const std::string& out) {
    const size_t at = out.find("agreeing bits");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  CHECK_FALSE(bits(whole.out).empty());
  CHECK(bits(whole.out) == bits(streamed.out));
  for (const char* field : {"peak RSS", "exact MACs", "fp64 FMA rate", "at commit"})
    CHECK(whole.out.find(field) != std::string::npos);
}

// gpu.model's line names its split-KV plan at each context (plan.hpp: pages of 64 tokens, splits
// sized so that (sequence, split, row block) items number about 2 x 132 SMs without a device).
// paper-decode, S_q 1: 16 rows, one row block. 4096 tokens: 64 pages, 1 page per split, 64
// splits; 262144 tokens: 4096 pages, ceil(4096 / 264) = 16 pages per split, 256 splits. (An H200,
// the only device these kernels are lent, has 132 SMs too.)
TEST_CASE("report.contexts.gpu_model_legend_names_its_split_plan") {
  ContextSweep s;
  s.contexts = {4096, 262144};
  for (int n : s.contexts) {
    Report r;
    r.cfg = config_for(find_preset("paper-decode"), n);
    Row row;
    row.impl = parse_impl_id("gpu.model.bf16"), row.profile = "bf16", row.tensor = "out";
    row.m.rel_l2 = 1e-3, row.m.max_ulp = 2;
    r.rows.push_back(row);
    s.at.push_back(r);
  }
  const auto charts = context_charts(s);
  REQUIRE(!charts.empty());
  REQUIRE(charts[0].second.series.size() == 1);
  CHECK(charts[0].second.series[0].name == "gpu.model (splits 64, 256)");
}
