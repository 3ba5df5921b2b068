// judge.design.fp8_query_and_p: an all-FP8 MLA decode kernel (FlashMLA PR #54's fp8 path, aiter's
// fp8-Q decode, Modular's SM100 fp8 kernel) quantizes its query to e4m3 with a dynamic scale and
// casts P to e4m3 before the P.V product. No default candidate rounds that coarsely (it would
// let a few-% bug pass every bf16 design); a user declares it, `--design q_latent=fp8,p=fp8`,
// and the design's samples must then carry those roundings.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "audit_helpers.hpp"
#include "core/dtype.hpp"
#include "harness/golden.hpp"
#include "impl/attention_core.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/kernel_level.hpp"
#include "impl/profile_math.hpp"

using namespace qkmla;

TEST_CASE("judge.design.fp8_query_and_p") {
  const Design d = parse_design("q_latent=fp8,p=fp8", Profile::FP8, Form::Absorbed);
  CHECK(d.q == DType::F8_E4M3);
  CHECK(d.p == DType::F8_E4M3);
  CHECK(parse_design(to_string(d), Profile::FP8, Form::Absorbed) == d);  // it reads back
  CHECK_THROWS_AS(parse_design("out=fp8", Profile::FP8, Form::Absorbed), ConfigError);
  CHECK_THROWS_AS(parse_design("q_latent=fp8", Profile::FP8, Form::Explicit), ConfigError);

  // one scale per row: amax maps to 448 exactly, every value lands on s times the e4m3 grid
  std::vector<double> a = {3.0, -0.1234, 1e-9}, b = {0.5};
  impl::quantize_row_e4m3(a, b);
  const double s = 3.0 / 448;
  CHECK(a[0] == 3.0);
  for (double x : {a[1], a[2], b[0]}) CHECK(round_to(DType::F8_E4M3, x / s) * s == x);
  CHECK(std::abs(a[1] + 0.1234) <= 0.1234 / 16);  // 3 mantissa bits: relative error <= 2^-4
  CHECK(a[2] == 0);                               // far below e4m3's subnormals: flushed
  std::vector<double> zeros = {0.0, 0.0}, none;
  impl::quantize_row_e4m3(zeros, none);
  CHECK(zeros == std::vector<double>{0.0, 0.0});

  // the points reach the arithmetic at both levels, round far more than the spec design, and a
  // correct run of the design passes its declaration but not the undeclared candidates
  for (Level level : {Level::Module, Level::Kernel}) {
    MlaConfig c =
        test::tiny_config(Profile::FP8, {0, 37, 64}, 2, NormMode::Blockwise, test::seed(555638));
    CAPTURE(c.seed);
    CAPTURE(int(level));
    Golden g = make_golden(generate_case(c), level, 113, "test");
    REQUIRE(g.truth.ok());
    const CaseFile cf{g.k, g.refs, g.metadata};
    const Form f = level == Level::Kernel ? Form::Kernel : Form::Absorbed;
    const std::string declared = "q_latent=fp8,p=fp8";
    const Design spec = spec_design(c.profile, f), fp8 = parse_design(declared, c.profile, f);
    Design q_only = spec;
    q_only.q = DType::F8_E4M3;
    auto run = [&](const Design& x) {
      return level == Level::Kernel ? impl::cpu_kernel(cf.k, x)
                                    : impl::cpu_absorbed(cf.k, {{Variant::Default, {}, x}})[0];
    };
    const std::string t = level == Level::Kernel ? "latent_out" : "out";
    const Tensor& truth = cf.refs.at("ref." + t);
    auto err = [&](const Outputs& o) {
      return compare(o.tensors.at(t), truth, DType::BF16, valid_mask(cf.k, t)).rel_l2;
    };
    const Outputs base = run(spec), with_q = run(q_only), both = run(fp8);
    CHECK(err(with_q) > 4 * err(base));                           // e4m3's 2^-4 against bf16's 2^-8
    CHECK(both.tensors.at(t).data != with_q.tensors.at(t).data);  // P's e4m3 cast moves it too
    const std::map<std::string, Tensor> outs = {{t, both.tensors.at(t)},
                                                {"lse", both.tensors.at("lse")}};
    CHECK(test::audit(cf, outs, declared).pass());
    CHECK_FALSE(test::audit(cf, outs).pass());
  }
}
