// io.safetensors.*: round trip of every dtype, and malformed files rejected with the file, the
// tensor and the problem named.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "helpers.hpp"
#include "io/case_io.hpp"
#include "io/safetensors.hpp"

using namespace qkmla;

namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("qkmla_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               uint64_t len_override = 0) {
  std::ofstream o(path, std::ios::binary);
  const uint64_t n = len_override ? len_override : header.size();
  o.write(reinterpret_cast<const char*>(&n), 8);
  o << header;
  o << std::string(data_bytes, '\0');
}

std::string read_error(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("io.safetensors.roundtrip_all_dtypes") {
  SafetensorsFile f;
  f.metadata["k"] = "v";
  f.tensors["a64"] = Tensor(DType::F64, {2, 3}, 0.1);
  f.tensors["a32"] = Tensor(DType::F32, {3}, 0.5);
  f.tensors["a16"] = Tensor(DType::F16, {2, 2}, -1.5);
  f.tensors["abf"] = Tensor(DType::BF16, {1}, 3.0);
  f.tensors["af8"] = Tensor(DType::F8_E4M3, {4}, 448.0);
  f.tensors["ai"] = Tensor(DType::I32, {2}, -7);
  f.tensors["empty"] = Tensor(DType::F32, {0, 5});
  const std::string p = tmp_path("roundtrip.safetensors");
  write_safetensors(p, f);
  const SafetensorsFile g = read_safetensors(p);
  CHECK(g.metadata.at("k") == "v");
  for (const auto& [name, t] : f.tensors) {
    CAPTURE(name);
    CHECK(g.tensors.at(name).dtype == t.dtype);
    CHECK(g.tensors.at(name).shape == t.shape);
    CHECK(g.tensors.at(name).data == t.data);
  }
}

TEST_CASE("io.safetensors.case_roundtrip") {
  const Case k = generate_case(test::tiny_config(Profile::BF16, {0, 5}, 1));
  const std::string p = tmp_path("case.safetensors");
  write_case(p, k, {{"ref.out", Tensor(DType::F64, {2, 1, 4, 16}, 0.25)}});
  const CaseFile f = read_case(p);
  CHECK(config_to_json(f.k.cfg) == config_to_json(k.cfg));
  CHECK(f.refs.at("ref.out").data[3] == 0.25);
  for (const auto& [name, t] : k.tensors) {
    const Tensor& u = f.k.get(name);
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isnan(t[i])) REQUIRE(u[i] == t[i]);
  }
}

TEST_CASE("io.safetensors.malformed") {
  const std::string p = tmp_path("bad.safetensors");
  {
    std::ofstream o(p, std::ios::binary);
    o << "abc";
  }
  CHECK(read_error(p).find("truncated") != std::string::npos);
  write_raw(p, "{}", 0, 1000);
  CHECK(read_error(p).find("runs past the end") != std::string::npos);
  write_raw(p,
            "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
            "\"y\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
            12);
  CHECK(read_error(p).find("overlaps") != std::string::npos);
  // An empty tensor at another's offset holds no bytes: not an overlap (zoo seed 95001), in
  // either order of the header.
  for (const char* name : {"a", "z"}) {
    write_raw(p,
              "{\"m\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"" +
                  std::string(name) +
                  "\": {\"dtype\": \"F32\", \"shape\": [2, 0], \"data_offsets\": [4, 4]}}",
              8);
    CHECK(read_error(p).empty());
  }
  write_raw(p, "{\"x\": {\"dtype\": \"F7\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
  CHECK(read_error(p).find("x: unsupported dtype 'F7'") != std::string::npos);
  write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8);
  CHECK(read_error(p).find("x: holds 8 bytes") != std::string::npos);
  write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 80]}}", 8);
  CHECK(read_error(p).find("outside the data section") != std::string::npos);
  write_raw(p, "{\"x\": ", 0);
  CHECK(read_error(p).find("not valid JSON") != std::string::npos);
  CHECK(read_error(tmp_path("does_not_exist")).find("cannot be opened") != std::string::npos);
}

TEST_CASE("io.case.config_and_shape_mismatch") {
  const Case k = generate_case(test::tiny_config(Profile::FP32, {2, 4}, 1));
  const std::string p = tmp_path("case_bad.safetensors");
  Case wrong = k;
  wrong.tensors["w_uk"] = Tensor(DType::F32, {32, 31});
  write_case(p, wrong, {});
  CHECK_THROWS_WITH_AS(read_case(p), doctest::Contains("w_uk: shape [32, 31] does not match"),
                       InputError);
  wrong = k;
  wrong.tensors["seqlens"][1] = 3;
  write_case(p, wrong, {});
  CHECK_THROWS_WITH_AS(read_case(p), doctest::Contains("seqlens"), InputError);
  wrong = k;
  wrong.tensors.erase("gamma_rk");
  write_case(p, wrong, {});
  CHECK_THROWS_WITH_AS(read_case(p), doctest::Contains("gamma_rk: missing tensor"), InputError);
  wrong = k;
  wrong.tensors["q_nope"][5] = NAN;
  write_case(p, wrong, {});
  CHECK_THROWS_WITH_AS(read_case(p), doctest::Contains("q_nope: non-finite value"), InputError);
}
