// cli.*: the qkmla binary end to end: output, JSON shape, exit codes on bad flags.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Run {
  int code;
  std::string out;
};

Run run(const std::string& args) {
  const std::string cmd = std::string(QKMLA_BINARY) + " " + args + " 2>&1";
  Run r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace

TEST_CASE("cli.report.tiny_lists_every_profile") {
  const Run r = run("report --preset tiny --seqlens 0,9 --sq 2");
  CAPTURE(r.out);
  CHECK(r.code == 0);
  for (const char* p : {"fp64", "fp32", "bf16", "fp16"}) {
    CHECK(r.out.find(std::string("-- profile ") + p + " --") != std::string::npos);
    CHECK(r.out.find(std::string("cpu.absorbed.") + p) != std::string::npos);
    CHECK(r.out.find(std::string("cpu.explicit.") + p) != std::string::npos);
  }
  CHECK(r.out.find("at commit") != std::string::npos);
}

TEST_CASE("cli.report.json_shape") {
  const Run r = run("report --preset tiny --seqlen 12 --profiles bf16,fp32 --format json --seed 5");
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["case"]["preset"] == "tiny");
  CHECK(j["case"]["seed"] == 5);
  CHECK(j["reference"]["bits"].get<int>() >= 113);
  CHECK(j["reference"]["agreeing_bits"].get<double>() >= 73);
  REQUIRE(j["rows"].size() > 10);
  for (const auto& row : j["rows"]) {
    for (const char* key : {"impl", "profile", "tensor", "max_abs", "max_ulp", "rel_l2", "cos_diff",
                            "baseline_ratio", "nonfinite_mismatch", "worst", "seconds"})
      CHECK(row.contains(key));
    CHECK(row["worst"].contains("index"));
  }
  CHECK(j["rows"][0]["impl"] == "ref.absorbed");
}

TEST_CASE("cli.bad_usage_exits_2") {
  for (const char* args : {"report --bogus", "report --profiles fp7", "report --preset nope",
                           "report --seqlen 1 --sq 2", "report --seqlens 4,5 --batch 3",
                           "report --format xml", "report --eps -1", "frobnicate", ""}) {
    CAPTURE(args);
    const Run r = run(std::string(args) + " --preset tiny");
    CHECK(r.code == 2);
    CHECK(r.out.find("qkmla") != std::string::npos);
  }
  const Run r = run("report --preset tiny --eps 0");
  CHECK(r.code == 2);
  CHECK(r.out.find("eps") != std::string::npos);
}

TEST_CASE("cli.presets_lists_dims") {
  const Run r = run("presets");
  CHECK(r.code == 0);
  CHECK(r.out.find("paper-decode") != std::string::npos);
  CHECK(r.out.find("kimi-k2") != std::string::npos);
}
