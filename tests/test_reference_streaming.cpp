// reference.streaming.*: the exact products formed a block of tokens at a time (reference/dots.hpp)
// give the reference the same bits as the products formed whole, whether the runs share the blocks
// or form them again, and the streamed reference holds no per-token keys or values.
#include <doctest/doctest.h>

#include <algorithm>

#include "core/parallel.hpp"
#include "helpers.hpp"
#include "outputs_helpers.hpp"
#include "reference/mp.hpp"
#include "reference/reference.hpp"

using namespace qkmla;
using test::check_identical;

namespace {

// The remainders Dots::method() reports ("..., N remainders, ..." per product), summed.
int64_t remainders(const std::string& method) {
  int64_t sum = 0;
  for (size_t at = method.find(" remainders"); at != std::string::npos;
       at = method.find(" remainders", at + 1)) {
    const size_t start = method.rfind(' ', at - 1) + 1;
    sum += std::stoll(method.substr(start, at - start));
  }
  return sum;
}

}  // namespace

TEST_CASE("reference.streaming.blocks_equal_whole_products") {
  const uint64_t s = test::seed(1201);
  CAPTURE(s);
  // Two sequences over several 64-token blocks (one partial), an empty one, S_q 2, three norms;
  // the products by sliced GEMMs (X.5) and by extraction (X.1-X.2); fp64 data leaves X.5
  // remainders (values deeper than their slices), whose terms must not depend on the blocks either.
  for (const Profile profile : {Profile::BF16, Profile::FP64})
    for (const bool sliced : {true, false})
      for (NormMode norm : {NormMode::Blockwise, NormMode::Unified, NormMode::None}) {
        CAPTURE(to_string(profile));
        CAPTURE(sliced);
        CAPTURE(int(norm));
        const Case k = generate_case(test::tiny_config(profile, {300, 0, 129}, 2, norm, s));
        const ref::Dots whole(k, {0, 4, int64_t(1) << 30, sliced});
        REQUIRE_FALSE(whole.streaming());
        CHECK((whole.method().find("sliced") != std::string::npos) == sliced);
        if (sliced && profile == Profile::FP64) CHECK(remainders(whole.method()) > 0);
        // Two cached blocks: the absorbed run, running beside the explicit one, evicts blocks the
        // explicit run reads later, so both sharing and re-forming happen. The absorbed run shares
        // its rows between two threads, the whole one does not: the same bits.
        const ref::Dots blocks(k, {64, 2, int64_t(1) << 30, sliced});
        ref::PrecisionScope scope(113);
        const Outputs ex_whole = ref::ref_explicit(k, whole, true);
        const Outputs ab_whole = ref::ref_absorbed(k, whole);
        Outputs ex_blocks, ab_blocks;
        run_parallel({[&] { ex_blocks = ref::ref_explicit(k, blocks, true); },
                      [&] { ab_blocks = ref::ref_absorbed(k, blocks, Variant::Default, {}, 2); }},
                     2);
        check_identical(ex_whole, ex_blocks);
        check_identical(ab_whole, ab_blocks);
        // 5 + 0 + 3 blocks of k0c read by both runs (the values read none, X.8): each formed at
        // least once, some twice after eviction.
        CHECK(blocks.blocks_formed() >= 8);
      }
}

// A long context's cache held as floats (Tensor::compact, report's compact_latent_values): the
// reference reads the same values through Tensor::rows, whole or streamed, single or paired runs.
TEST_CASE("reference.streaming.compact_cache_same_bits") {
  const uint64_t s = test::seed(1205);
  CAPTURE(s);
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified}) {
    CAPTURE(int(norm));
    const Case k = generate_case(test::tiny_config(Profile::BF16, {300, 0, 129}, 2, norm, s));
    Case c = k;
    REQUIRE(compact_long_context(c, 0));
    REQUIRE(c.get("kv_c").is_compact());
    for (const char* name : {"k_pe", "rope_cos", "rope_sin"}) CHECK(c.get(name).is_compact());
    CHECK(c.get("kv_c").data.empty());
    for (const int64_t block : {int64_t(0), int64_t(64)}) {
      CAPTURE(block);
      const ref::Dots dk(k, {block, 4}), dc(c, {block, 4});
      ref::PrecisionScope scope(113);
      check_identical(ref::ref_explicit(k, dk, true), ref::ref_explicit(c, dc, true));
      check_identical(ref::ref_absorbed(k, dk), ref::ref_absorbed(c, dc));
      check_identical(ref::ref_absorbed(k, dk, Variant::GramAlphaK),
                      ref::ref_absorbed(c, dc, Variant::GramAlphaK));
      if (block == 0) continue;
      const ref::Dots pk(k, {block, 4}), pc(c, {block, 4});
      const auto [kp, kc] = ref::ref_explicit_pair(k, pk, true, 113, 177, 2);
      const auto [cp, cc] = ref::ref_explicit_pair(c, pc, true, 113, 177, 2);
      check_identical(kp, cp);
      check_identical(kc, cc);
    }
  }
}

TEST_CASE("reference.streaming.compact_refuses_what_a_float_cannot_hold") {
  Case k = generate_case(test::tiny_config(Profile::FP64, {40}, 1));
  CHECK_FALSE(compact_long_context(k, 0));  // F64 values
  Case q = generate_case(test::tiny_config(Profile::FP8, {40}, 1));
  CHECK_FALSE(compact_long_context(q, 0));  // fp8 codes: the dequantized cache is what is read
  Case b = generate_case(test::tiny_config(Profile::BF16, {40}, 1));
  CHECK_FALSE(compact_long_context(b, b.get("kv_c").numel() + 1));  // below the size asked for
  CHECK_FALSE(b.get("kv_c").is_compact());
  Tensor t(DType::F64, {2, 3}, 0.5);
  CHECK_THROWS_AS(t.compact(), std::logic_error);
}

TEST_CASE("reference.streaming.long_cases_stream") {
  const Case k = generate_case(test::tiny_config(Profile::BF16, {5000}, 1));
  // a [5000, G*d_c] product: whole under a large budget, streamed under a small one.
  CHECK_FALSE(ref::exact_dots(k).streaming());
  CHECK(ref::exact_dots(k, 1 << 20).streaming());
}

// A block that cannot be formed (a latent value outside exact_matmul's range, X.1) fails the run
// with the product's own error, whether the run forms that block itself, a helper thread formed
// it ahead, or the paired runs' share tasks did; nothing hangs waiting for it.
TEST_CASE("reference.streaming.unformable_block_fails_the_run") {
  for (int64_t bad_token : {5, 70, 140}) {  // the first block, a prefetched one, the last one
    CAPTURE(bad_token);
    Case k = generate_case(test::tiny_config(Profile::FP32, {150}, 1));
    k.tensors.at("kv_c").at({0, bad_token, 3}) = 1e-300;  // below 2^-400
    const ref::Dots blocks(k, {64, 2});
    ref::PrecisionScope scope(113);
    CHECK_THROWS_AS(ref::ref_explicit(k, blocks, false), std::domain_error);
    CHECK_THROWS_AS(ref::ref_absorbed(k, blocks), std::domain_error);
    // the paired runs form blocks ahead in their share tasks (S.4), on 1 and 2 threads
    for (int threads : {1, 2}) {
      const ref::Dots paired(k, {64, 4});
      CHECK_THROWS_AS(ref::ref_explicit_pair(k, paired, false, 113, 177, threads),
                      std::domain_error);
    }
  }
}

// ref_explicit_pair (S.4): the P run and its check take turns on each block, on two threads each,
// and give the bits of two separate runs while forming every block once.
TEST_CASE("reference.streaming.paired_runs_form_each_block_once") {
  const uint64_t s = test::seed(1202);
  CAPTURE(s);
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified}) {
    CAPTURE(int(norm));
    const Case k = generate_case(test::tiny_config(Profile::BF16, {300, 0, 129}, 2, norm, s));
    const ref::Dots whole = ref::exact_dots(k);
    const ref::Dots blocks(k, {64, 4});
    Outputs p, check;
    {
      ref::PrecisionScope scope(113);
      p = ref::ref_explicit(k, whole, true);
    }
    {
      ref::PrecisionScope scope(177);
      check = ref::ref_explicit(k, whole, false);
    }
    const auto [pp, pc] = ref::ref_explicit_pair(k, blocks, true, 113, 177, 2);
    check_identical(p, pp);
    check_identical(check, pc);
    // 5 + 0 + 3 blocks of k0c: each formed once, not once per run.
    CHECK(blocks.blocks_formed() == 8);
  }
}

// S.4's prefetch: with products of more than one 512-column tile (here 3: 1280 columns), the tiles
// of the block read next are formed by different share tasks of the two runs' phases, several at
// once; the runs still give the bits of separate runs on whole products, each block formed once.
TEST_CASE("reference.streaming.prefetched_tiles_give_whole_products_bits") {
  const uint64_t s = test::seed(1204);
  CAPTURE(s);
  MlaConfig c = test::tiny_config(Profile::BF16, {200, 70}, 2, NormMode::Blockwise, s);
  c.heads = c.groups = 8, c.d_c = c.d_v = 160;
  c.set_default_scale();
  const Case k = generate_case(c);
  const ref::Dots whole = ref::exact_dots(k);
  Outputs p, check;
  {
    ref::PrecisionScope scope(113);
    p = ref::ref_explicit(k, whole, true);
  }
  {
    ref::PrecisionScope scope(177);
    check = ref::ref_explicit(k, whole, false);
  }
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    const ref::Dots blocks(k, {64, 4});
    REQUIRE(blocks.method().find("sliced") != std::string::npos);
    const auto [pp, pc] = ref::ref_explicit_pair(k, blocks, true, 113, 177, threads);
    check_identical(p, pp);
    check_identical(check, pc);
    CHECK(blocks.blocks_formed() == 4 + 2);  // 4 + 2 blocks of k0c
  }
}

// X.5 against X.1-X.2 end to end: for bf16 and fp32 data every exact product has fewer than P bits,
// so both ways of forming the products enter MPFR exactly and the reference's bits agree.
TEST_CASE("reference.streaming.sliced_and_extracted_products_agree") {
  const uint64_t s = test::seed(1203);
  CAPTURE(s);
  for (Profile prof : {Profile::BF16, Profile::FP32}) {
    CAPTURE(int(prof));
    const Case k = generate_case(test::tiny_config(prof, {200, 77}, 2, NormMode::Unified, s));
    const ref::Dots sliced(k, {0, 4, int64_t(1) << 30, true});
    const ref::Dots extracted(k, {0, 4, int64_t(1) << 30, false});
    REQUIRE(sliced.method() != extracted.method());
    ref::PrecisionScope scope(113);
    check_identical(ref::ref_explicit(k, sliced, true), ref::ref_explicit(k, extracted, true));
    check_identical(ref::ref_absorbed(k, sliced), ref::ref_absorbed(k, extracted));
  }
}

// S.5: ref.absorbed's latent core splits the tokens into one chunk per thread and forms the exact
// latent scores 256 tokens at a time; any split gives the same bits. Contexts over several score
// blocks (one partial), an empty sequence, S_q 3; the three norms, the Gram variant and a mutant
// that reads the previous token's alpha_k (across chunk borders).
TEST_CASE("reference.streaming.absorbed_chunks_give_the_same_bits") {
  const uint64_t s = test::seed(1211);
  CAPTURE(s);
  Perturbation shifted;
  shifted.alpha_k_shift = -1;
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified, NormMode::None}) {
    CAPTURE(int(norm));
    const Case k = generate_case(test::tiny_config(Profile::BF16, {700, 0, 257}, 3, norm, s));
    const ref::Dots d = ref::exact_dots(k);
    ref::PrecisionScope scope(113);
    const Variant v = norm == NormMode::None ? Variant::Default : Variant::GramAlphaK;
    const Outputs one = ref::ref_absorbed(k, d), one_v = ref::ref_absorbed(k, d, v),
                  one_p = ref::ref_absorbed(k, d, Variant::Default, shifted);
    for (int threads : {2, 3, 5}) {
      CAPTURE(threads);
      check_identical(one, ref::ref_absorbed(k, d, Variant::Default, {}, threads));
      check_identical(one_v, ref::ref_absorbed(k, d, v, {}, threads));
      check_identical(one_p, ref::ref_absorbed(k, d, Variant::Default, shifted, threads));
    }
  }
}

// A.3 from ref.explicit's alpha_k (reference.hpp, KeptAlphaK): the same bits as ref.absorbed's
// own keys, whole or streamed (the pair's P run), for every norm; at 53 bits the outputs hold
// every bit of alpha_k. A perturbed run or the Gram variant keeps forming its own statistic.
TEST_CASE("reference.absorbed.explicit_alpha_k_gives_the_same_bits") {
  const uint64_t s = test::seed(1212);
  CAPTURE(s);
  Perturbation from_latent;
  from_latent.key_stat_from_latent = true;
  for (NormMode norm : {NormMode::Blockwise, NormMode::Unified, NormMode::None}) {
    for (Profile profile : {Profile::BF16, Profile::FP64}) {
      CAPTURE(int(norm));
      CAPTURE(int(profile));
      const Case k = generate_case(test::tiny_config(profile, {300, 0, 129}, 2, norm, s));
      const ref::Dots whole = ref::exact_dots(k);
      for (int bits : {53, 113}) {
        CAPTURE(bits);
        const ref::KeptAlphaK kept = ref::new_kept_alpha_k(), paired = ref::new_kept_alpha_k();
        ref::ref_explicit_pair(k, ref::Dots(k, {64, 4}), false, bits, bits + 64, 2, paired.get());
        const ref::PrecisionScope scope(bits);
        const Outputs ex = ref::ref_explicit(k, whole, false, 2, {kept.get()});
        const Outputs own = ref::ref_absorbed(k, whole);
        check_identical(own, ref::ref_absorbed(k, whole, Variant::Default, {}, 2, kept.get()));
        check_identical(own, ref::ref_absorbed(k, whole, Variant::Default, {}, 1, paired.get()));
        if (norm != NormMode::None) {
          const std::vector<double>&a = ex.tensors.at("alpha_k").data,
                &b = own.tensors.at("alpha_k").data;  // NaN past each sequence's end
          CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end(),
                           [](double x, double y) { return x == y || (x != x && y != y); }));
          check_identical(
              ref::ref_absorbed(k, whole, Variant::Default, from_latent),
              ref::ref_absorbed(k, whole, Variant::Default, from_latent, 1, kept.get()));
          check_identical(ref::ref_absorbed(k, whole, Variant::GramAlphaK),
                          ref::ref_absorbed(k, whole, Variant::GramAlphaK, {}, 1, kept.get()));
        }
      }
    }
  }
}
