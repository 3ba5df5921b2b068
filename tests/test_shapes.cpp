// shapes.*: any MLA shape (NoPE, G < H, G = 1), plain MLA (norm none), shape flags and --config,
// golden --inputs, and the refusal of bad inputs with file, tensor and problem named (exit 2).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_run.hpp"
#include "harness/truth.hpp"
#include "helpers.hpp"
#include "io/case_io.hpp"
#include "io/safetensors.hpp"
#include "reference/certify.hpp"

using namespace qkmla;

namespace {

using qkmla::test::Run;
using qkmla::test::run;
using qkmla::test::run_raw;

std::string tmp(const std::string& name) {
  const std::string dir = "/tmp/qkmla_shapes_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

// The input tensors of a generated case, written as a user would (no metadata).
std::string user_inputs(const MlaConfig& cfg, const std::string& name) {
  const Case k = generate_case(cfg);
  SafetensorsFile f;
  f.tensors = k.tensors;
  const std::string path = tmp(name);
  write_safetensors(path, f);
  return path;
}

}  // namespace

TEST_CASE("shapes.reference_agrees_and_certifies_for_every_shape_class") {
  // NoPE (d_r = 0), G = 1, G < H, plain MLA: the truth is accurate and absorption is exact.
  struct Class {
    const char* preset;
    NormMode norm;
  };
  for (const Class& c :
       {Class{"tiny-nope", NormMode::Blockwise}, Class{"tiny-nope", NormMode::Unified},
        Class{"tiny-g1", NormMode::Blockwise}, Class{"tiny", NormMode::None},
        Class{"tiny-nope", NormMode::None}}) {
    MlaConfig cfg =
        test::tiny_config(Profile::BF16, {0, 7, 19}, 2, c.norm, test::seed(101), c.preset);
    CAPTURE(config_to_json(cfg));
    const Case k = generate_case(cfg);
    TruthOptions o;
    o.absorbed = true;
    const Truth t = compute_truth(k, o);
    CHECK(t.ok());
    CHECK(t.agreeing_bits > 100);
    const ref::CertifyResult r = ref::certify(k);
    CHECK_FALSE(r.refuted);
    CHECK(r.content_scores > 0);
    CHECK(r.key_statistics == (c.norm == NormMode::None ? 0 : cfg.groups * (7 + 19)));
  }
}

TEST_CASE("shapes.flags_and_config_file") {
  Run r =
      run("report --preset tiny --heads 6 --groups 3 --d-r 0 --latent-rank 24 --seqlens 0,5 "
          "--profiles fp32 --format json");
  CAPTURE(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("\"heads\": 6") != std::string::npos);
  CHECK(r.out.find("\"d_r\": 0") != std::string::npos);
  // Bad shapes: exit 2 naming the key and the problem.
  r = run("report --preset tiny --heads 6 --groups 4 --profiles fp32");
  CHECK(r.code == 2);
  CHECK(r.out.find("groups: heads % groups must be 0") != std::string::npos);
  r = run("report --preset tiny --d-r 7 --profiles fp32");
  CHECK(r.code == 2);
  CHECK(r.out.find("d_r: must be even") != std::string::npos);
  // A TOML config with conventions §9 keys; flags given override it; an unknown key is refused.
  const std::string toml = tmp("c.toml");
  std::ofstream(toml)
      << "heads = 4\ngroups = 1\nlatent_rank = 16\nd_c = 8\nd_r = 0\nd_v = 8\nnorm = \"none\"\n";
  r = run("golden --config " + toml + " --seqlens 3,6 --profile fp32 -o " + tmp("g.safetensors"));
  CAPTURE(r.out);
  REQUIRE(r.code == 0);
  const CaseFile cf = read_case(tmp("g.safetensors"));
  CHECK(cf.k.cfg.groups == 1);
  CHECK(cf.k.cfg.norm == NormMode::None);
  CHECK(cf.k.cfg.softmax_scale == 1.0 / std::sqrt(8.0));  // NoPE: 1/sqrt(d_c)
  std::ofstream(toml) << "heads = 4\ngruops = 2\n";
  r = run("golden --config " + toml + " -o " + tmp("g2.safetensors"));
  CHECK(r.code == 2);
  CHECK(r.out.find(toml) != std::string::npos);
  CHECK(r.out.find("gruops: unknown config key") != std::string::npos);
}

TEST_CASE("shapes.golden_inputs_reproduces_the_generated_reference") {
  // The inputs of a generated case, written without a config: golden --inputs infers the config
  // from shapes and dtypes and must give the same reference, bit for bit.
  for (const auto& [preset, norm] :
       {std::pair{"tiny", NormMode::Blockwise}, std::pair{"tiny-nope", NormMode::Unified},
        std::pair{"tiny-g1", NormMode::None}}) {
    MlaConfig cfg = test::tiny_config(Profile::BF16, {0, 9, 21}, 2, norm, test::seed(102), preset);
    const std::string in = user_inputs(cfg, "in.safetensors");
    const std::string gen = tmp("gen.safetensors"), from = tmp("from.safetensors");
    const std::string flags = std::string("--preset ") + preset + " --norm " + to_string(norm) +
                              " --seqlens 0,9,21 --sq 2 --profile bf16 --seed " +
                              std::to_string(cfg.seed);
    REQUIRE(run("golden " + flags + " -o " + gen).code == 0);
    const Run r = run("golden --inputs " + in + " -o " + from);
    CAPTURE(r.out);
    REQUIRE(r.code == 0);
    const CaseFile a = read_case(gen), b = read_case(from);
    REQUIRE(a.refs.size() == b.refs.size());
    for (const auto& [name, t] : a.refs) {
      CAPTURE(name);
      REQUIRE(b.refs.count(name));
      CHECK(t.shape == b.refs.at(name).shape);
      int64_t differ = 0;
      for (int64_t i = 0; i < t.numel(); ++i)
        differ +=
            !(t[i] == b.refs.at(name)[i] || (std::isnan(t[i]) && std::isnan(b.refs.at(name)[i])));
      CHECK(differ == 0);
    }
    CHECK(b.metadata.at("qkmla.inputs").find("inferred from shapes and dtypes") !=
          std::string::npos);
  }
}

TEST_CASE("shapes.golden_inputs_refuses_bad_inputs") {
  MlaConfig cfg = test::tiny_config(Profile::BF16, {0, 9}, 1, NormMode::Blockwise, test::seed(103));
  const Case k = generate_case(cfg);
  auto expect = [&](SafetensorsFile f, const std::string& extra, const std::string& tensor,
                    const std::string& problem) {
    const std::string path = tmp("bad.safetensors");
    write_safetensors(path, f);
    const Run r = run("golden --inputs " + path + " " + extra + " -o " + tmp("out.safetensors"));
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(path) != std::string::npos);
    CHECK(r.out.find(tensor) != std::string::npos);
    CHECK(r.out.find(problem) != std::string::npos);
  };
  SafetensorsFile good;
  good.tensors = k.tensors;
  SafetensorsFile f = good;
  f.tensors.erase("w_uk");
  expect(f, "", "w_uk", "missing tensor");
  f = good;
  f.tensors["gamma_ck"] = Tensor(DType::BF16, {3}, 1.0);
  expect(f, "", "gamma_ck", "does not match the config");
  f = good;
  f.tensors["w_uv"] = Tensor(DType::BF16, {32, 33}, 0.0);
  expect(f, "", "w_uv", "not a multiple of G");
  f = good;
  f.tensors["q_nope"][5] = std::nan("");
  expect(f, "", "q_nope", "non-finite value");
  expect(good, "--d-r 7", "d_r", "must be even");
  expect(good, "--groups 3", "groups", "heads % groups must be 0");
  f = good;
  f.metadata["qkmla.format"] = "1";
  f.metadata["qkmla.config"] = "{\"heads\": 4, \"colour\": 2}";
  expect(f, "", "colour", "unknown config key");
  f = good;
  f.tensors["q_nope"][3] = 1.0 + std::ldexp(1.0, -20);  // not a bf16 value
  f.tensors["q_nope"].dtype = DType::F32;
  expect(f, "--profile bf16", "q_nope", "not representable in BF16");
  // ... unless asked to round, which the case records.
  const std::string path = tmp("round.safetensors");
  write_safetensors(path, f);
  const Run r = run("golden --inputs " + path + " --profile bf16 --round-inputs -o " +
                    tmp("rounded.safetensors"));
  CAPTURE(r.out);
  REQUIRE(r.code == 0);
  CHECK(read_case(tmp("rounded.safetensors"))
            .metadata.at("qkmla.inputs")
            .find("\"rounded_values\":1") != std::string::npos);
}
