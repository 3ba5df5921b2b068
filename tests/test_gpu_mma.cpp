// gpu.mma.*: the parametrised MMA accumulation model and its fitter (gpu/model/mma_model.hpp), on
// synthetic probe files made by the model itself with known parameters, and on the tiles an H200
// returned (tests/data/mma-probe-h200-seed1000.bin).
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "gpu/model/mma_model.hpp"

using namespace qkmla::gpu::mma;

namespace {

// Four tiles of every class for `kind`, their D computed by the model with `p`.
std::vector<Tile> synthetic(const MmaParams& p, MmaKind kind, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<Tile> tiles;
  for (int cls = 0; cls < 4; ++cls)
    for (int i = 0; i < 4; ++i) {
      Tile t;
      make_tile(t, kind, TileClass(cls), g);
      mma_tile(p, t);
      tiles.push_back(t);
    }
  return tiles;
}

std::vector<MmaRecord> all_records(const std::vector<Tile>& tiles) {
  std::vector<MmaRecord> r;
  for (const Tile& t : tiles)
    for (const MmaRecord& x : records(t)) r.push_back(x);
  return r;
}

std::string temp_file(const char* name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

}  // namespace

TEST_CASE("gpu.mma.fitter_recovers_known_parameters") {
  const MmaParams known[] = {{8, true, 24, false, false},  // Hopper-like: truncation throughout
                             {4, true, 26, false, true},   // Ampere-like groups of four
                             {16, false, 30, true, true},  // c added last, rounded alignment
                             {2, true, 25, true, false},
                             hopper_fitted(),  // aligned by ea + eb: what the H200 does
                             {4, true, 24, true, true, true}};
  uint64_t seed = 1;
  for (const MmaParams& p : known)
    for (MmaKind kind : {MmaKind::MmaBF16, MmaKind::MmaFP16}) {
      CAPTURE(p.str());
      CAPTURE(int(kind));
      const std::string path = temp_file("qkmla_mma_synthetic.bin");
      write_probe(path, synthetic(p, kind, seed++));
      const std::vector<Tile> back = read_probe(path);
      std::remove(path.c_str());
      REQUIRE(back.size() == 16);
      const FitResult r = fit(all_records(back), parameter_grid());
      CHECK(r.records == 16 * 128);
      CHECK(r.mismatches == 0);
      CHECK(r.best == p);
      REQUIRE(r.exact.size() == 1);  // identified: no other set of the grid explains the data
      CHECK(r.exact[0] == p);
    }
}

TEST_CASE("gpu.mma.fitter_reports_an_unidentifiable_parameter_as_several_exact_sets") {
  // Aligned to 22 bits, a two-product group's sum fits fp32's 24 bits almost always, so the final
  // rounding is not seen: the fitter must say so (two exact sets) and agree on everything else.
  const MmaParams p{2, true, 22, true, false};
  const FitResult r = fit(all_records(synthetic(p, MmaKind::MmaBF16, 7)), parameter_grid());
  CHECK(r.mismatches == 0);
  REQUIRE(r.exact.size() == 2);
  for (const MmaParams& e : r.exact) {
    CHECK(e.group == p.group);
    CHECK(e.c_first == p.c_first);
    CHECK(e.align_bits == p.align_bits);
    CHECK(e.align_round == p.align_round);
  }
  CHECK(r.exact[0].final_round != r.exact[1].final_round);
}

TEST_CASE("gpu.mma.fitter_counts_what_no_parameter_set_explains") {
  const MmaParams p{8, true, 24, false, false};
  std::vector<Tile> tiles = synthetic(p, MmaKind::WgmmaBF16, 99);
  tiles[3].d[5] = std::nextafter(tiles[3].d[5], 1e30f);  // one element off by an ulp
  const FitResult r = fit(all_records(tiles), parameter_grid());
  CHECK(r.best == p);
  CHECK(r.mismatches == 1);
  CHECK(r.exact.empty());
}

TEST_CASE("gpu.mma.model_differs_between_parameters_on_adversarial_tiles") {
  // The adversarial classes are what tell the parameters apart: on them, truncation and
  // rounding, and narrow and wide alignment, give different sums.
  std::mt19937_64 g(5);
  Tile t;
  make_tile(t, MmaKind::MmaBF16, TileClass::Cancellation, g);
  Tile u = t;
  mma_tile({8, true, 24, false, false}, t);
  mma_tile({8, true, 40, true, true}, u);
  int differ = 0;
  for (int i = 0; i < kM * kN; ++i) differ += t.d[i] != u.d[i];
  CHECK(differ > 0);
  // Exponents far apart: a wide-aligned, rounded model is the correctly rounded sum here.
  const float a[2] = {1.0f, 0x1p-30f}, b[2] = {1.0f, 1.0f};
  CHECK(mma_dot({2, true, 40, true, true}, a, b, 2, 0.0f) == 1.0f);
  CHECK(mma_dot({2, true, 40, true, true}, a, b, 2, -1.0f) == 0x1p-30f);
  CHECK(mma_dot({2, true, 24, false, true}, a, b, 2, -1.0f) == 0.0f);  // the small term lost
}

TEST_CASE("gpu.mma.probe_file_rejects_a_truncated_tile") {
  const std::string path = temp_file("qkmla_mma_truncated.bin");
  write_probe(path, synthetic({16, true, 24, false, true}, MmaKind::MmaFP16, 3));
  std::filesystem::resize_file(path, kTileBytes * 2 + 100);
  CHECK_THROWS_WITH(read_probe(path), doctest::Contains("truncated tile 2"));
  std::remove(path.c_str());
  CHECK_THROWS(read_probe(path));
}

TEST_CASE("gpu.mma.h200_probe_is_the_fitted_model_and_no_exact_exponent_model") {
  // 768 tiles (256 per instruction: mma.sync bf16, mma.sync fp16, wgmma bf16), random and
  // adversarial, run on an H200 on 2026-12-04 (reports/device-h200-2026-12-04.md).
  const std::vector<Tile> tiles =
      read_probe(std::string(QKMLA_VENDORED_DATA) + "/mma-probe-h200-seed1000.bin");
  REQUIRE(tiles.size() == 768);
  long differ = 0, total = 0;
  for (const Tile& t : tiles)
    for (const MmaRecord& r : records(t)) {
      differ += mma_dot(hopper_fitted(), r.a, r.b, kK, r.c) != r.d;
      ++total;
    }
  CHECK(total == 768 * 128);
  CHECK(differ == 0);
  // The same data refutes every exact-exponent model of the grid: the best one (26 bits) leaves
  // thousands of elements unexplained. A small subset keeps the search to a second.
  std::vector<MmaRecord> recs;
  for (size_t i = 0; i < tiles.size(); i += 16)
    for (const MmaRecord& r : records(tiles[i])) recs.push_back(r);
  std::vector<MmaParams> exact_exponent;
  for (const MmaParams& p : parameter_grid())
    if (!p.nominal_exponent) exact_exponent.push_back(p);
  const FitResult without = fit(recs, exact_exponent);
  CHECK(without.exact.empty());
  CHECK(without.mismatches > 0);
  const FitResult with = fit(recs, parameter_grid());
  CHECK(with.mismatches == 0);
  REQUIRE(with.exact.size() == 1);
  CHECK(with.exact[0] == hopper_fitted());
}
