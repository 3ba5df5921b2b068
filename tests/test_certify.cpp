// certify.* and converge.*: exact equivalence, exact refutation of every semantic mutant, and the
// precision ladder's slopes.
#include <doctest/doctest.h>

#include "helpers.hpp"
#include "impl/mutants.hpp"
#include "reference/certify.hpp"

using namespace qkmla;

namespace {
MlaConfig certify_config(const std::string& preset, std::vector<int> seqlens, NormMode norm,
                         RopeOrder order) {
  MlaConfig c =
      test::tiny_config(Profile::BF16, std::move(seqlens), 2, norm, test::seed(71), preset);
  c.rope_order = order;
  return c;
}
}  // namespace

TEST_CASE("certify.tiny_exactly_equivalent") {
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified})
    for (RopeOrder order : {RopeOrder::NormThenRope, RopeOrder::RopeThenNorm})
      for (Profile p : {Profile::BF16, Profile::FP32, Profile::FP64}) {
        MlaConfig c = certify_config("tiny", {0, 2, 17, 40}, norm, order);
        c.profile = p;
        CAPTURE(config_to_json(c));
        const ref::CertifyResult r = ref::certify(generate_case(c));
        CHECK_FALSE(r.refuted);
        CHECK(r.first == "");
        CHECK(r.content_scores == 4 * (1 + 2 + 16 + 17 + 39 + 40));  // H * visible (i, t) pairs
        CHECK(r.key_statistics == 2 * (2 + 17 + 40));
        CHECK(r.value_paths == 3 * 2 * 4 * 16);
      }
}

TEST_CASE("certify.paper_decode_256_exactly_equivalent") {
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified}) {
    const ref::CertifyResult r = ref::certify(
        generate_case(certify_config("paper-decode", {256}, norm, RopeOrder::NormThenRope)));
    CHECK_FALSE(r.refuted);
    CHECK(r.content_scores == 16 * (255 + 256));
  }
}

TEST_CASE("certify.every_semantic_mutant_refuted") {
  const Case k = generate_case(
      certify_config("tiny", {0, 17, 40}, NormMode::Blockwise, RopeOrder::NormThenRope));
  // The shipped mutants themselves (impl/mutants.cpp: the objects the gate runs), not copies.
  for (const impl::Mutant& m : impl::mutants()) {
    CAPTURE(m.name);
    if (!impl::mutant_not_applicable(m, k.cfg).empty()) continue;  // top-k, sinks: test_sparse_sink
    const ref::CertifyResult r = ref::certify(k, m.p);
    if (m.p.rounding_only())
      CHECK_FALSE(r.refuted);  // identical in exact arithmetic
    else {
      CHECK(r.refuted);
      CHECK(r.first.find("differs") != std::string::npos);
    }
  }
}
