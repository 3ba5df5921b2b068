// cli.*: the qkmla binary end to end: output, JSON shape, exit codes on bad flags.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli_run.hpp"
#include "core/presets.hpp"
#include "gpu/qkmla_gpu.hpp"
#include "harness/resources.hpp"
#include "impl/gpu_impl.hpp"
#include "impl/kernel_level.hpp"
#include "io/case_io.hpp"
#include "io/safetensors.hpp"
#include "render/table.hpp"
#include "report/bench_view.hpp"

namespace {

using qkmla::test::Run;
using qkmla::test::run;
using qkmla::test::run_raw;

}  // namespace

TEST_CASE("cli.report.tiny_lists_every_profile") {
  const Run r = run("report --preset tiny --seqlens 0,9 --sq 2");
  CAPTURE(r.out);
  CHECK(r.code == 0);
  for (const char* p : {"fp64", "fp32", "bf16", "fp16", "fp8"}) {
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
                           "report --format xml", "report --eps -1", "frobnicate", "",
                           // std::stoll's out_of_range inside CLI11 (found by fuzz_text): it
                           // aborted the process before
                           "report --no-causal=99999999999999999999"}) {
    CAPTURE(args);
    const Run r = run(std::string(args) + " --preset tiny");
    CHECK(r.code == 2);
    CHECK(r.out.find("qkmla") != std::string::npos);
  }
  const Run r = run("report --preset tiny --eps 0");
  CHECK(r.code == 2);
  CHECK(r.out.find("eps") != std::string::npos);
  // Each message names the flag and what it takes (CLI11's PositiveNumber had printed "0 not in
  // range 0.000000 to 1797693..."); a repeated profile would have printed its rows twice; a
  // thread count beyond what the system gives had aborted the process (std::terminate).
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"report --sq 0", "--sq: Value 0 not in range 1 to"},
           {"report --heads 0", "--heads: Value 0 not in range 1 to"},
           {"report --seqlen -1", "--seqlen: Value -1 not in range 0 to"},
           {"report --contexts 0", "--contexts: Value 0 not in range 1 to"},
           {"report --profiles fp64,bf16,fp64", "--profiles: fp64 is given twice"},
           {"mutants --profiles bf16,bf16", "--profiles: bf16 is given twice"},
           {"reference --threads 100000", "--threads: Value 100000 not in range 1 to 64"},
           {"report --seed -1", "--seed: Value -1 is not a whole number"},
           // a full disk fails at close, not at open: it had exited 0 with the report lost
           {"report --profiles bf16 -o /dev/full", "--output /dev/full: cannot be written"}}) {
    CAPTURE(args);
    const Run bad = run(args + " --preset tiny");
    CHECK(bad.code == 2);
    CHECK(bad.out.find(says) != std::string::npos);
  }
  const Run junit = run("gate --junit /dev/full --shard 1/900");
  CHECK(junit.code == 2);
  CHECK(junit.out.find("--junit /dev/full: cannot be written") != std::string::npos);
}

TEST_CASE("cli.presets_lists_dims") {
  const Run r = run("presets");
  CHECK(r.code == 0);
  CHECK(r.out.find("paper-decode") != std::string::npos);
  CHECK(r.out.find("kimi-k2") != std::string::npos);
  const Run j = run("presets --format json");  // valid JSON, one object per preset
  const auto a = nlohmann::json::parse(j.out);
  REQUIRE(a.is_array());
  CHECK(a.size() == qkmla::presets().size());
  CHECK(a[0]["latent_rank"] == qkmla::presets()[0].latent_rank);
}

TEST_CASE("cli.output.wrap_lines_keeps_100_columns_and_every_word") {
  const std::string longer = "  reference for bf16: " + std::string(30, 'x') + " agrees " +
                             std::string(90, 'y') + " " + std::string(120, 'z') + " end";
  const std::string w = qkmla::wrap_lines("short line\n" + longer + "\n");
  std::vector<std::string> lines;
  for (size_t at = 0, e; at < w.size(); at = e + 1) {
    e = w.find('\n', at);
    lines.push_back(w.substr(at, e - at));
  }
  REQUIRE(lines.size() == 5);  // the final newline kept, no empty line added
  CHECK(lines[0] == "short line");
  CHECK(lines[1] == "  reference for bf16: " + std::string(30, 'x') + " agrees");
  CHECK(lines[2] == "    " + std::string(90, 'y'));   // continuation: indent + 2
  CHECK(lines[3] == "    " + std::string(120, 'z'));  // a word longer than the width stays whole
  CHECK(lines[4] == "    end");
  CHECK(w.back() == '\n');
  for (size_t i = 0; i < lines.size(); ++i)
    if (i != 3) CHECK(lines[i].size() <= 100);
}

namespace {

std::vector<unsigned char> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void spit(const std::string& p, const std::vector<unsigned char>& b) {
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// A golden case and a copy of its reference as "outputs" (which must pass).
struct Golden {
  // One folder per process: ctest runs the test cases in parallel processes.
  std::string dir = "/tmp/qkmla_cli_golden_" + std::to_string(getpid());
  std::string gcase = dir + "/case.safetensors", outs = dir + "/outs.safetensors";
  Golden() {
    std::filesystem::create_directories(dir);
    REQUIRE(run("golden --preset tiny --profile fp32 --seqlens 0,9,21 --sq 2 -o " + gcase).code ==
            0);
    qkmla::SafetensorsFile f = qkmla::read_safetensors(gcase);
    qkmla::SafetensorsFile o;
    for (const char* t : {"out", "lse"}) {
      o.tensors[t] = f.tensors.at(std::string("ref.") + t);
      o.tensors[t].dtype = qkmla::DType::F32;
      for (double& v : o.tensors[t].data) v = double(float(v));
    }
    qkmla::write_safetensors(outs, o);
  }
};

}  // namespace

TEST_CASE("cli.golden_audit.pass_and_fail") {
  Golden g;
  Run r = run("audit " + g.gcase + " " + g.outs + " --junit " + g.dir + "/audit.xml");
  CAPTURE(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("verdict: PASS") != std::string::npos);
  CHECK(r.out.find("rel_l2 per head") != std::string::npos);
  qkmla::SafetensorsFile o = qkmla::read_safetensors(g.outs);
  o.tensors["out"].at({1, 0, 2, 3}) += 0.01;  // one wrong element in head 2 of sequence 1
  o.tensors.erase("lse");
  qkmla::write_safetensors(g.dir + "/bad.safetensors", o);
  r = run("audit " + g.gcase + " " + g.dir + "/bad.safetensors --format json");
  CHECK(r.code == 1);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["verdict"] == "FAIL");
  CHECK(j["missing"][0] == "lse");
  CHECK(j["tensors"][0]["worst"][0]["index"] == nlohmann::json({1, 0, 2, 3}));
}

// Exit codes of incomplete outputs and of a declared design from the --budgets file: alpha_k alone
// had passed with exit 0; a [design] table is as strict as --design.
TEST_CASE("cli.audit.nothing_judged_and_design_table") {
  Golden g;
  qkmla::SafetensorsFile f = qkmla::read_safetensors(g.gcase);
  qkmla::SafetensorsFile only;
  only.tensors["alpha_k"] = f.tensors.at("ref.alpha_k");
  qkmla::write_safetensors(g.dir + "/alpha.safetensors", only);
  Run r = run("audit " + g.gcase + " " + g.dir + "/alpha.safetensors");
  CAPTURE(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("nothing judged: the file holds only alpha_k") != std::string::npos);
  // A bf16 case's reference rounded to bf16: a legitimate design explains it (PASS), a declared
  // all-fp32 design in the --budgets file's [design] table does not (FAIL, both named).
  const std::string bf = g.dir + "/bf16.safetensors";
  REQUIRE(run("golden --preset tiny --profile bf16 --seqlens 0,9,21 --sq 2 -o " + bf).code == 0);
  qkmla::SafetensorsFile b = qkmla::read_safetensors(bf), o;
  o.tensors["out"] = b.tensors.at("ref.out");
  o.tensors["out"].dtype = qkmla::DType::BF16;
  for (double& v : o.tensors["out"].data) v = qkmla::round_to(qkmla::DType::BF16, v);
  qkmla::write_safetensors(g.dir + "/bf16_out.safetensors", o);
  CHECK(run("audit " + bf + " " + g.dir + "/bf16_out.safetensors").code == 0);
  std::ofstream(g.dir + "/design.toml") << "[design]\nq_latent = \"fp32\"\nrope = \"fp32\"\n"
                                           "latent_out = \"fp32\"\nout = \"fp32\"\n";
  r = run("audit " + bf + " " + g.dir + "/bf16_out.safetensors --no-diagnose --budgets " + g.dir +
          "/design.toml");
  CHECK(r.code == 1);
  CHECK(r.out.find("declared design (strict):") != std::string::npos);
  CHECK(r.out.find("form=absorbed,q=fp32,rope=fp32") != std::string::npos);
  CHECK(r.out.find("without the declaration:") != std::string::npos);
  std::ofstream(g.dir + "/bad_design.toml") << "[design]\nq_latent = \"fp9\"\n";
  r = run("audit " + g.gcase + " " + g.outs + " --budgets " + g.dir + "/bad_design.toml");
  CHECK(r.code == 2);
  CHECK(r.out.find("bad_design.toml") != std::string::npos);
}

TEST_CASE("cli.audit.lse_conventions") {
  Golden g;
  qkmla::SafetensorsFile o = qkmla::read_safetensors(g.outs);
  for (double& v : o.tensors["lse"].data)
    v = std::isinf(v) ? INFINITY : double(float(v / std::log(2.0)));
  qkmla::write_safetensors(g.dir + "/base2.safetensors", o);
  CHECK(run("audit " + g.gcase + " " + g.dir + "/base2.safetensors").code ==
        1);  // read as base e: wrong
  CHECK(run("audit " + g.gcase + " " + g.dir + "/base2.safetensors --lse-base 2").code ==
        1);  // +inf rows
  CHECK(run("audit " + g.gcase + " " + g.dir + "/base2.safetensors --lse-base 2 --empty-lse=+inf")
            .code == 0);
}

TEST_CASE("cli.malformed_inputs_exit_2") {
  Golden g;
  const std::vector<unsigned char> good = slurp(g.gcase);
  uint64_t hlen;
  std::memcpy(&hlen, good.data(), 8);
  const std::string header(good.begin() + 8, good.begin() + 8 + std::ptrdiff_t(hlen));
  auto with_header = [&](std::string h) {  // same data, edited header (re-padded)
    h.append((8 - h.size() % 8) % 8, ' ');
    std::vector<unsigned char> b(8);
    const uint64_t n = h.size();
    std::memcpy(b.data(), &n, 8);
    b.insert(b.end(), h.begin(), h.end());
    b.insert(b.end(), good.begin() + 8 + std::ptrdiff_t(hlen), good.end());
    return b;
  };
  auto replace = [&](std::string from, std::string to) {
    std::string h = header;
    const size_t at = h.find(from);
    REQUIRE(at != std::string::npos);
    return with_header(h.replace(at, from.size(), to));
  };
  struct Bad {
    const char* what;
    std::vector<unsigned char> bytes;
    const char* message;
  };
  std::vector<unsigned char> truncated(good.begin(),
                                       good.begin() + std::ptrdiff_t(good.size() / 2));
  std::vector<unsigned char> past = good;
  const uint64_t huge = good.size() + 100;
  std::memcpy(past.data(), &huge, 8);
  // header tensors are sorted by name: "gamma_ck" then "gamma_cq" follow each other.
  nlohmann::json h = nlohmann::json::parse(header);
  const auto off = h["gamma_ck"]["data_offsets"];
  nlohmann::json overlap = h;
  overlap["gamma_cq"]["data_offsets"] = {off[0].get<uint64_t>() + 4, off[1].get<uint64_t>() + 4};
  nlohmann::json wrong_dtype = h;
  wrong_dtype["w_uk"]["dtype"] = "F7";
  nlohmann::json size = h;
  size["w_uk"]["shape"] = {32, 33};
  nlohmann::json missing = h;
  missing.erase("w_uv");
  nlohmann::json shape = h;  // consistent bytes, but not the config's shape
  shape["w_uk"]["shape"] = {64, 16};
  std::vector<Bad> cases = {
      {"truncated", truncated, "outside the data section"},
      {"header past end", past, "runs past the end"},
      {"overlap", with_header(overlap.dump()), "overlaps"},
      {"unknown dtype", with_header(wrong_dtype.dump()), "unsupported dtype 'F7'"},
      {"size mismatch", with_header(size.dump()), "needs"},
      {"missing tensor", with_header(missing.dump()), "w_uv: missing tensor"},
      {"shape vs config", with_header(shape.dump()), "w_uk: shape [64, 16] does not match"},
      {"config mismatch", replace("\\\"heads\\\":4", "\\\"heads\\\":8"), "does not match"},
      {"unknown config key", replace("\\\"causal\\\"", "\\\"casual\\\""),
       "casual: unknown config key"},
  };
  // NaN inside a read input: q_nope's first value.
  std::vector<unsigned char> nan_bytes = good;
  const uint64_t q0 = h["q_nope"]["data_offsets"][0].get<uint64_t>();
  const float nanf = NAN;
  std::memcpy(nan_bytes.data() + 8 + hlen + q0, &nanf, 4);
  cases.push_back({"NaN in inputs", nan_bytes, "q_nope: non-finite value"});
  for (const Bad& b : cases) {
    CAPTURE(b.what);
    const std::string p = g.dir + "/malformed.safetensors";
    spit(p, b.bytes);
    const Run r = run("audit " + p + " " + g.outs);
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("malformed.safetensors") != std::string::npos);
    CHECK(r.out.find(b.message) != std::string::npos);
  }
  // Outputs of the wrong shape name the outputs file and the tensor.
  qkmla::SafetensorsFile o;
  o.tensors["out"] = qkmla::Tensor(qkmla::DType::F32, {3, 2, 4, 15});
  qkmla::write_safetensors(g.dir + "/shape.safetensors", o);
  const Run r = run("audit " + g.gcase + " " + g.dir + "/shape.safetensors");
  CHECK(r.code == 2);
  CHECK(r.out.find("out: shape [3, 2, 4, 15] does not match") != std::string::npos);
  // An lse [B, H, S_q] (FlashMLA's softmax_lse) without --layout flashmla: the message says so.
  qkmla::SafetensorsFile t;
  t.tensors["lse"] = qkmla::Tensor(qkmla::DType::F32, {3, 4, 2});
  qkmla::write_safetensors(g.dir + "/lse_t.safetensors", t);
  const Run rt = run("audit " + g.gcase + " " + g.dir + "/lse_t.safetensors");
  CAPTURE(rt.out);
  CHECK(rt.code == 2);
  CHECK(rt.out.find("lse: shape [3, 4, 2] does not match") != std::string::npos);
  CHECK(rt.out.find("--layout flashmla") != std::string::npos);
}

TEST_CASE("cli.gate.junit_validates_and_shards_merge") {
  const std::string dir = "/tmp/qkmla_cli_gate_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/g.toml")
      << "[[entry]]\npresets = [\"tiny\"]\nprofiles = [\"bf16\", \"fp64\"]\nseqlens = [5, 12]\nsq "
         "= 2\n"
         "impls = [\"cpu.absorbed\", \"cpu.absorbed.gamma_merged\"]\n[[entry]]\nname = "
         "\"m\"\npresets = [\"tiny\"]\nscenarios = [\"normal\", \"tiny_keys\"]\nprofiles = "
         "[\"fp64\", \"fp32\"]\n"
         "seqlens = [5, 12]\nsq = 2\nimpls = [\"mutant.*\"]\nexpect = \"fail\"\n";
  Run whole = run("gate --config " + dir + "/g.toml --junit " + dir + "/whole.xml");
  CAPTURE(whole.out);
  CHECK(whole.code == 0);
  const std::string last = whole.out.substr(whole.out.rfind('\n', whole.out.size() - 2) + 1);
  CHECK(last.find(" passed, 0 failed") != std::string::npos);
  for (int k = 1; k <= 2; ++k)
    CHECK(run("gate --config " + dir + "/g.toml --shard " + std::to_string(k) +
              "/2 --format json -o " + dir + "/s" + std::to_string(k) + ".json")
              .code == 0);
  Run merged =
      run("gate --merge " + dir + "/s1.json " + dir + "/s2.json --junit " + dir + "/merged.xml");
  CHECK(merged.code == 0);
  CHECK(merged.out.substr(merged.out.rfind('\n', merged.out.size() - 2) + 1) == last);
  // Well-formed, and the counts in the attributes match the testcases (Python's XML parser).
  for (const char* x : {"whole.xml", "merged.xml"}) {
    const Run py = run_raw(
        "python3 -c \"import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); "
        "n = len(r.findall('.//testcase')); f = len(r.findall('.//failure')); "
        "assert int(r.get('tests')) == n and int(r.get('failures')) == f, (n, f); "
        "assert all(int(s.get('tests')) == len(s.findall('testcase')) for s in r); print('ok', n, "
        "f)\" " +
        dir + "/" + x);
    CAPTURE(py.out);
    CHECK(py.code == 0);
    CHECK(py.out.rfind("ok ", 0) == 0);
  }
  CHECK(run("gate --shard 3/2").code == 2);
  CHECK(run("gate --merge " + dir + "/g.toml").code == 2);
}

TEST_CASE("cli.converge.slopes") {
  const Run r = run("converge --format json");
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["reference_bits"].get<int>() >= 4 * 256);
  int equivalent = 0, mutants = 0;
  for (const auto& s : j["series"]) {
    const std::string impl = s["impl"];
    CAPTURE(impl);
    REQUIRE(s["points"].size() == 8);
    if (impl.rfind("mutant.", 0) == 0) {
      CHECK(s["tail_slope"].get<double>() > -0.1);  // plateau: not equivalent
      CHECK(s["points"][7][1].get<double>() > 1e-3);
      ++mutants;
    } else {
      CHECK(s["slope"].get<double>() >= -1.1);
      CHECK(s["slope"].get<double>() <= -0.9);
      ++equivalent;
    }
  }
  CHECK(equivalent == 6);
  CHECK(mutants == 2);
}

TEST_CASE("cli.certify.exit_codes") {
  CHECK(run("certify --preset tiny --seqlens 0,17,40 --sq 2 --norm unified").code == 0);
  const Run r = run("certify --preset tiny --seqlens 0,17,40 --sq 2 --mutant group_map_mod");
  CHECK(r.code == 1);
  CHECK(r.out.find("refuted exactly: content score differs at") != std::string::npos);
  CHECK(run("certify --preset tiny --mutant nope").code == 2);
}

TEST_CASE("cli.report.refuses_an_inaccurate_reference") {
  // At 64 bits the reference agrees with its 128-bit run on ~60 bits: enough for bf16 (28
  // required) but not for fp64 (73 required), so the report is refused (exit 1).
  CHECK(run("report --preset tiny --seqlen 9 --profiles bf16 --ref-bits 64").code == 0);
  const Run r = run("report --preset tiny --seqlen 9 --profiles fp64 --ref-bits 64");
  CHECK(r.code == 1);
  CHECK(r.out.find("refused") != std::string::npos);
}

TEST_CASE("cli.golden_audit.kernel_level") {
  const std::string dir = "/tmp/qkmla_cli_kernel_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  REQUIRE(run("golden --preset tiny --profile bf16 --level kernel --seqlens 0,17,40 --sq 2 -o " +
              dir + "/k.safetensors")
              .code == 0);
  const qkmla::CaseFile k =
      qkmla::read_case(dir + "/k.safetensors");  // validates the kernel-level shapes
  CHECK(k.k.cfg.level == qkmla::Level::Kernel);
  CHECK(k.k.has("q_latent"));
  CHECK(k.k.has("alpha_k"));
  CHECK(k.metadata.count("qkmla.baseline") == 1);
  qkmla::SafetensorsFile o;
  for (const char* t : {"latent_out", "lse"}) {
    o.tensors[t] = k.refs.at(std::string("ref.") + t);
    o.tensors[t].dtype = qkmla::DType::F32;
    for (double& v : o.tensors[t].data) v = double(float(v));
  }
  qkmla::write_safetensors(dir + "/o.safetensors", o);
  CHECK(run("audit " + dir + "/k.safetensors " + dir + "/o.safetensors").code == 0);
  o.tensors["latent_out"].at({2, 1, 3, 7}) *=
      1.5;  // one element, 50 % off: rel_l2 ~ 10x the baseline
  qkmla::write_safetensors(dir + "/bad.safetensors", o);
  const Run r = run("audit " + dir + "/k.safetensors " + dir + "/bad.safetensors");
  CHECK(r.code == 1);
  CHECK(r.out.find("worst [2,1,3,7]") != std::string::npos);
}

TEST_CASE("cli.bench_without_device_exits_2") {
  std::string why;
  if (qkmla::gpu::device_available(&why)) return;  // on a GPU machine the bench runs (label gpu)
  const Run r = run("bench --contexts 4096 --reps 3");
  CHECK(r.code == 2);
  CHECK(r.out.find("needs a CUDA device") != std::string::npos);
  CHECK(run("bench --reps 0").code == 2);  // bad flag: exit 2 before any device question
}

TEST_CASE("cli.bench.table_renders_every_column_without_a_device") {
  // The bench runs only on a device; its table must not fail there for a format slip.
  qkmla::gpu::BenchRow a;
  a.context = 4096, a.ms_norm = 0.125, a.ms_plain = 0.12, a.overhead_pct = 4.1667;
  a.gbs_norm = 1234, a.hbm_fraction = 0.257, a.cache_bytes = 19.9e6, a.cache_bytes_alpha = 20.9e6;
  a.pages_per_split = 3, a.splits = 22, a.partial_bytes = 5.79e6;
  qkmla::gpu::BenchOptions o;
  o.pages_per_split = 3;
  const std::string md = qkmla::render_bench({a, a}, "how", "dev", o, true);
  const std::string text = qkmla::render_bench({a}, "how", "dev", o, false);
  CHECK(md.find("3 pages per split (--pages-per-split)") != std::string::npos);
  CHECK(md.find("| 4096 | 0.1250 | 0.000 | 0.1200 | 0.000 | +4.17 | 1234 | 25.7% | 19.9 | 1.00 | "
                "3 | 22 | 5.79 |") != std::string::npos);
  CHECK(text.find("partial_MB") != std::string::npos);
  CHECK(text.find("     3     22       5.79") != std::string::npos);
  o.pages_per_split = 0;
  CHECK(qkmla::render_bench({a}, "how", "dev", o, false).find("the plan's") != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(qkmla::bench_json({a, a}, "how", "dev"));
  CHECK(j["device"] == "dev");
  REQUIRE(j["rows"].size() == 2);
  CHECK(j["rows"][1]["ms_qknorm"] == 0.125);
  CHECK(j["rows"][0]["splits"] == 22);
  CHECK(j["rows"][0]["cache_bytes_with_alpha_k"] == 20.9e6);
}

TEST_CASE("cli.report_fp8_and_gpu_rows") {
  // The fp8 profile's CPU rows, the kernels' model rows and the quantization row, and one line
  // saying why no device row appears (without a device).
  const Run r = run("report --preset tiny --seqlens 65,0 --sq 2 --profiles bf16,fp8 --format json");
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  std::set<std::string> impls;
  for (const auto& row : j["rows"]) impls.insert(row["impl"].get<std::string>());
  for (const char* id : {"cpu.explicit.fp8", "cpu.absorbed.fp8", "gpu.model.fp8",
                         "gpu.model.explicit.fp8", "gpu.model.bf16", "quant.fp8"})
    CHECK(impls.count(id) == 1);
  std::string why;
  if (!qkmla::gpu::device_available(&why)) {
    REQUIRE(j["notes"].size() >= 1);
    CHECK(j["notes"][0].get<std::string>().rfind("no CUDA device: GPU rows skipped", 0) == 0);
  } else {
    CHECK(impls.count("gpu.absorbed.fp8") == 1);
  }
}

TEST_CASE("cli.golden_audit.fp8_module_and_kernel_level") {
  // fp8 cases carry e4m3 codes and per-token scales; a third party (here: the GPU kernels' model at
  // module level, cpu.kernel at kernel level) is judged against the reference on the dequantized
  // cache. Ignoring the scales must fail the audit.
  const std::string dir = "/tmp/qkmla_cli_fp8_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  REQUIRE(
      run("golden --preset tiny --profile fp8 --seqlens 0,70 --sq 2 -o " + dir + "/m.safetensors")
          .code == 0);
  const qkmla::CaseFile m = qkmla::read_case(dir + "/m.safetensors");
  REQUIRE(m.k.get("kv_c").dtype == qkmla::DType::F8_E4M3);
  auto write_outputs = [&](const qkmla::gpu::GpuOutputs& g, const std::string& path) {
    const qkmla::Outputs o = qkmla::impl::from_gpu(m.k, g);
    qkmla::SafetensorsFile f;
    f.tensors["out"] = o.tensors.at("out");
    f.tensors["lse"] = o.tensors.at("lse");
    qkmla::write_safetensors(path, f);
  };
  const qkmla::gpu::GpuCase gc = qkmla::impl::to_gpu_case(m.k);
  write_outputs(qkmla::gpu::run_model(gc, {}), dir + "/good.safetensors");
  Run r = run("audit " + dir + "/m.safetensors " + dir + "/good.safetensors --label gpu_model");
  CAPTURE(r.out);
  CHECK(r.code == 0);
  qkmla::gpu::GpuCase no_scale = gc;
  for (float& s : no_scale.kv_c_scale) s = std::isnan(s) ? s : 1.0f;
  write_outputs(qkmla::gpu::run_model(no_scale, {}), dir + "/bad.safetensors");
  CHECK(run("audit " + dir + "/m.safetensors " + dir + "/bad.safetensors").code == 1);

  REQUIRE(run("golden --preset tiny --profile fp8 --level kernel --seqlens 0,70 --sq 2 -o " + dir +
              "/k.safetensors")
              .code == 0);
  const qkmla::CaseFile k = qkmla::read_case(dir + "/k.safetensors");
  REQUIRE(k.k.has("kv_c_scale"));
  const qkmla::Outputs ko = qkmla::impl::cpu_kernel(k.k);
  qkmla::SafetensorsFile f;
  f.tensors["latent_out"] = ko.tensors.at("latent_out");
  f.tensors["lse"] = ko.tensors.at("lse");
  qkmla::write_safetensors(dir + "/ko.safetensors", f);
  r = run("audit " + dir + "/k.safetensors " + dir + "/ko.safetensors");
  CAPTURE(r.out);
  CHECK(r.code == 0);
}

// Requests too big for the machine are refused before any allocation, naming the size needed,
// what is available, and the flag that reduces it; absurd sizes are refused by the config check.
TEST_CASE("cli.resource_limits_refused_with_what_would_fit") {
  const Run big = run("report --profile bf16 --seqlen 3000000");
  CAPTURE(big.out);
  CHECK(big.code == 2);
  CHECK(big.out.find("too big: this report needs about") != std::string::npos);
  CHECK(big.out.find("available") != std::string::npos);
  CHECK(big.out.find("--seqlen") != std::string::npos);
  const Run profiles = run("report --preset tiny --batch 1000000");
  CAPTURE(profiles.out);
  CHECK(profiles.code == 2);
  CHECK(profiles.out.find("5 cases at once") != std::string::npos);
  CHECK(profiles.out.find("--profile (one profile at a time") != std::string::npos);
#if !defined(__SANITIZE_ADDRESS__)  // ASan reserves terabytes of shadow: no run under ulimit -v
  // 300k tokens: the model says ~5.3 GB, above the 4 GB address space (it would fit otherwise).
  const Run limited = run_raw("ulimit -v 4000000; " + std::string(QKMLA_BINARY) +
                              " report --profile bf16 --seqlen 300000");
  CAPTURE(limited.out);
  CHECK(limited.code == 2);
  CHECK(limited.out.find("ulimit -v") != std::string::npos);
#endif
  const Run absurd = run("golden --preset tiny --batch 16000000 --seqlen 2000000000 -o /dev/null");
  CAPTURE(absurd.out);
  CHECK(absurd.code == 2);
  CHECK(absurd.out.find("more than 2^46") != std::string::npos);
  const Run batch = run("golden --preset tiny --batch 2000000000 -o /dev/null");
  CAPTURE(batch.out);
  CHECK(batch.code == 2);
  CHECK(batch.out.find("at most 16777216 sequences") != std::string::npos);
  for (const char* cmd : {"golden --preset tiny --seqlen 2000000000 -o /dev/null",
                          "certify --preset deepseek-v3 --seqlen 90000000",
                          // certify holds its products whole (~115 GB here): it had failed in an
                          // allocation (internal error: std::bad_alloc) before
                          "certify --preset deepseek-v3 --seqlen 100000",
                          "converge --preset tiny --seqlen 900000000"}) {
    const Run r = run(cmd);
    CAPTURE(cmd);
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("too big") != std::string::npos);
  }
}

// The memory model (harness/resources.cpp) against the peak RSS of one child (wait4's rusage): it
// must not underestimate, and stay within 3x (a model that says 100x would refuse what fits).
// The model is of the Release build's memory; AddressSanitizer's shadow and redzones triple it.
// --estimate-memory prints the model's estimate (the profiles held at once with the exact products
// of one wave of truths, or the largest profile at the largest of --contexts) and runs nothing.
TEST_CASE("cli.report.estimate_memory_prints_the_model") {
  qkmla::MlaConfig c = qkmla::config_for(qkmla::find_preset("paper-decode"), 1);
  c.seqlens.assign(1, 300000), c.profile = qkmla::Profile::BF16;
  c.set_default_scale();
  auto bytes_in = [](const std::string& out) {
    const size_t at = out.find("estimated peak ");
    REQUIRE(at != std::string::npos);
    return std::stod(out.substr(at + 15));
  };
  // 300k tokens: a report would take minutes; the estimate returns at once.
  const Run one = run("report --profile bf16 --seqlen 300000 --estimate-memory");
  CHECK(one.code == 0);
  CHECK(bytes_in(one.out) == doctest::Approx(qkmla::case_peak_bytes(c)).epsilon(1e-9));
  const Run two = run("report --profile bf16,fp16 --seqlen 300000 --estimate-memory");
  CHECK(bytes_in(two.out) == doctest::Approx(2 * qkmla::case_peak_bytes(c)).epsilon(1e-9));
  const Run ctx = run("report --profile bf16 --contexts 4096,300000 --estimate-memory");
  CHECK(ctx.code == 0);
  CHECK(bytes_in(ctx.out) == doctest::Approx(qkmla::case_peak_bytes(c)).epsilon(1e-9));
  // The default report: five profiles whose truths run in waves of 2, 2 and 1, so only one wave's
  // exact products count. With five cases of one shape and profile (P each): 5 case_peak_bytes -
  // 3 P. P from the model itself: a third case adds its bytes but its products (a wave of its own).
  c.seqlens.assign(1, 4096);
  std::vector<qkmla::MlaConfig> five;
  for (auto p : {qkmla::Profile::FP64, qkmla::Profile::FP32, qkmla::Profile::BF16,
                 qkmla::Profile::FP16, qkmla::Profile::FP8})
    five.push_back(c), five.back().profile = p;
  const Run dflt = run("report --estimate-memory");
  CHECK(dflt.code == 0);
  CHECK(bytes_in(dflt.out) == doctest::Approx(qkmla::report_peak_bytes(five, 2)).epsilon(1e-9));
  const double single = qkmla::case_peak_bytes(c);
  const std::vector<qkmla::MlaConfig> pair(2, c), triple(3, c);
  const double products =
      single - (qkmla::report_peak_bytes(triple, 2) - qkmla::report_peak_bytes(pair, 2));
  CHECK(products > 0.5 * single);  // the products dominate a 4096-token case
  CHECK(qkmla::report_peak_bytes(pair, 2) == doctest::Approx(2 * single).epsilon(1e-12));
  CHECK(qkmla::report_peak_bytes(std::vector<qkmla::MlaConfig>(5, c), 2) ==
        doctest::Approx(5 * single - 3 * products).epsilon(1e-9));
}

TEST_CASE("cli.resource_model_bounds_the_measured_peak"
#if defined(__SANITIZE_ADDRESS__)
          * doctest::skip()
#endif
) {
  qkmla::MlaConfig c = qkmla::config_for(qkmla::find_preset("tiny"), 1);
  c.batch = 60, c.seqlens.assign(60, 512), c.profile = qkmla::Profile::BF16;
  c.set_default_scale();
  const double predicted = qkmla::case_peak_bytes(c);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1), dup2(devnull, 2);
    execl(QKMLA_BINARY, QKMLA_BINARY, "report", "--preset", "tiny", "--batch", "60", "--seqlen",
          "512", "--profile", "bf16", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  rusage ru{};
  REQUIRE(wait4(pid, &status, 0, &ru) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const double measured = double(ru.ru_maxrss) * 1024;  // Linux: kilobytes
  CAPTURE(predicted);
  CAPTURE(measured);
  CHECK(predicted >= measured);
  CHECK(predicted <= 3 * measured);
}
