// reference.shared_data.*: our reference reproduces the cases an independent implementation
// computed (tests/data/README.md), vendored in tests/data; configured with QKMLA_INDEPENDENT_DATA
// (a folder of the originals), the copy must also be identical to them.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "io/case_io.hpp"
#include "reference/mp.hpp"
#include "reference/reference.hpp"

using namespace qkmla;

namespace {

// max over valid positions of |x - y| / max(|y|, tiny); NaN positions must coincide.
double max_rel(const Tensor& x, const Tensor& y) {
  REQUIRE(x.shape == y.shape);
  double worst = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    if (std::isnan(y[i])) continue;  // alpha_k past T_b: not compared
    if (std::isinf(y[i])) {
      CHECK(x[i] == y[i]);
      continue;
    }
    worst = std::max(worst, std::fabs(x[i] - y[i]) / std::max(std::fabs(y[i]), 1e-300));
  }
  return worst;
}

void check_file(const std::string& name) {
  const std::string path = std::string(QKMLA_VENDORED_DATA) + "/" + name;
  REQUIRE(std::filesystem::exists(path));
  const CaseFile f = read_case(path);
  ref::PrecisionScope scope(128);
  const ref::Dots d = ref::exact_dots(f.k);
  const Outputs ex = ref::ref_explicit(f.k, d, true);
  const Outputs ab = ref::ref_absorbed(f.k, d);
  for (const Outputs* o : {&ex, &ab})
    for (const char* t : {"out", "lse", "alpha_q", "latent_out", "alpha_k"}) {
      CAPTURE(to_string(o->id));
      CAPTURE(t);
      CHECK(max_rel(o->tensors.at(t), f.refs.at(std::string("ref.") + t)) <= 1e-12);
    }
}

}  // namespace

TEST_CASE("reference.shared_data.tiny_blockwise_bf16") {
  check_file("tiny-blockwise-bf16.safetensors");
}
TEST_CASE("reference.shared_data.tiny_unified_half_fp32") {
  check_file("tiny-unified-half-fp32.safetensors");
}
TEST_CASE("reference.shared_data.tiny_noncausal_fp64") {
  check_file("tiny-noncausal-fp64.safetensors");
}

TEST_CASE("reference.shared_data.copy_is_current" *
          doctest::skip(std::string(QKMLA_INDEPENDENT_DATA).empty())) {
  const std::filesystem::path shared(QKMLA_INDEPENDENT_DATA);
  REQUIRE(std::filesystem::exists(shared));
  int compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(shared)) {
    if (entry.path().extension() != ".safetensors") continue;
    const std::filesystem::path copy =
        std::filesystem::path(QKMLA_VENDORED_DATA) / entry.path().filename();
    CAPTURE(copy.string());
    REQUIRE(std::filesystem::exists(copy));
    std::ifstream a(entry.path(), std::ios::binary), b(copy, std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(a), {}) ==
          std::string(std::istreambuf_iterator<char>(b), {}));
    ++compared;
  }
  CHECK(compared >= 3);
}
