// impl.sum_order.chunk_tokens, judge.yardstick.declared_kv_chunk, render.audit.kv_chunk_hint: a
// declared chunk length
// (`qkmla audit --kv-chunk N`) cuts every attention row into chunks of N tokens merged by their
// lse, in place of the yardstick's 2-4 splits. A chunked prefill with a small workspace merges
// many stored partials, whose error grows with their number (zoo style vllm_mla_prefill, seed
// 107333: 7-19 chunks, out bias 5.24x the 2-4-split samples'; zoo.many_chunks runs it).
#include <doctest/doctest.h>

#include <string>

#include "harness/yardstick.hpp"
#include "helpers.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/profile_math.hpp"
#include "render/audit_view.hpp"

using namespace qkmla;

namespace {

struct OrderScope {  // a yardstick order for the scope's lifetime
  explicit OrderScope(impl::SumOrder o) { impl::sum_order() = o; }
  ~OrderScope() { impl::sum_order() = {}; }
};

impl::SumOrder chunks_of(int n) {
  impl::SumOrder o;
  o.chunk = n;
  return o;
}

}  // namespace

TEST_CASE("impl.sum_order.chunk_tokens") {
  impl::SumOrder o;
  CHECK_FALSE(o.splitting());
  CHECK(o.chunk_tokens(100) == 0);
  o.splits = 3;  // ceil(n / 3) tokens a chunk, no split below 3 tokens
  CHECK(o.splitting());
  CHECK(o.chunk_tokens(10) == 4);
  CHECK(o.chunk_tokens(3) == 1);
  CHECK(o.chunk_tokens(2) == 0);
  o = chunks_of(4);  // a declared length: every row longer than it, whatever its length
  CHECK(o.splitting());
  CHECK(o.chunk_tokens(37) == 4);
  CHECK(o.chunk_tokens(5) == 4);
  CHECK(o.chunk_tokens(4) == 0);
  CHECK_FALSE(o.splits > 1);
}

TEST_CASE("judge.yardstick.declared_kv_chunk") {
  // the merged design of the explicit chunked family (partials stored), on fp16 tiny_keys rows
  // of 37 and 64 tokens
  const Design d = parse_design("p=stored,exp2=yes,partials=stored", Profile::FP16, Form::Absorbed);
  MlaConfig c =
      test::tiny_config(Profile::FP16, {0, 37, 64}, 2, NormMode::Blockwise, test::seed(107333));
  c.scenario = "tiny_keys";
  CAPTURE(c.seed);
  const Case k = generate_case(c);
  auto out = [&](impl::SumOrder o) {
    OrderScope scope(o);
    return impl::cpu_absorbed(k, {{Variant::Default, {}, d}})[0].tensors.at("out").data;
  };
  const std::vector<double> forward = out({});
  CHECK(out(chunks_of(64)) == forward);  // no row longer than a chunk: nothing merged
  const std::vector<double> many = out(chunks_of(4));
  CHECK(many != forward);
  for (int splits : {2, 3, 4}) {
    impl::SumOrder o;
    o.splits = splits;
    CHECK(many != out(o));
  }
  // the yardstick: as many samples, its split orders now in chunks of 4 (their out samples move)
  const Outputs truth = impl::cpu_absorbed(
      k, {{Variant::Default, {}, accumulate_design(c.profile, Form::Absorbed)}})[0];
  const TruthOf of = [&](const std::string& t) {
    return truth.tensors.count(t) ? &truth.tensors.at(t) : nullptr;
  };
  const Yardstick split = measure_yardstick(k, std::vector<Design>{d}, of, {"out"});
  const Yardstick chunked = measure_yardstick(k, {{"chunked", d}}, of, {"out"}, 4);
  REQUIRE(split.samples.size() == chunked.samples.size());
  for (size_t n = 0; n < split.samples.size(); ++n) {
    CAPTURE(n);
    const double a = split.samples[n].rel_l2.at("out"), b = chunked.samples[n].rel_l2.at("out");
    if (split.samples[n].id.order < 4)
      CHECK(a == b);  // the same unsplit orders
    else
      CHECK(a != b);
  }
}

// An undeclared explicit audit whose out fails on a row scale names the declaration; a declared
// one, one without explicit candidates, or one failing elsewhere does not.
TEST_CASE("render.audit.kv_chunk_hint") {
  AuditResult r;
  r.forms = {"absorbed", "explicit"};
  TensorAudit out;
  out.j.tensor = "out";
  out.j.v.pass = false;
  StructureCheck bias;
  bias.stat = "bias", bias.pass = false;
  out.structure = {bias};
  r.tensors = {out};
  const std::string hint = "declare its chunk length with --kv-chunk N";
  CHECK(audit_text(r, false).find(hint) != std::string::npos);
  r.kv_chunk = 4;
  CHECK(audit_text(r, false).find(hint) == std::string::npos);
  r.kv_chunk = 0;
  r.forms = {"absorbed"};
  CHECK(audit_text(r, false).find(hint) == std::string::npos);
  r.forms = {"explicit"};
  r.tensors[0].structure[0].stat = "worst_head";
  CHECK(audit_text(r, false).find(hint) == std::string::npos);
  r.tensors[0].structure[0].stat = "row_bias";
  CHECK(audit_text(r, false).find(hint) != std::string::npos);
}
