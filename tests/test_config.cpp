// config.*: the validator names the field and the rule; JSON round trip; strict keys.
#include <doctest/doctest.h>

#include "helpers.hpp"

using namespace qkmla;

namespace {
std::string error_field(const MlaConfig& c) {
  try {
    c.validate();
  } catch (const ConfigError& e) {
    return e.field;
  }
  return "";
}
}  // namespace

TEST_CASE("config.validator_names_field_and_rule") {
  MlaConfig c = test::tiny_config(Profile::BF16, {5});
  c.set_default_scale();
  CHECK(error_field(c) == "");
  MlaConfig bad = c;
  bad.groups = 3;
  CHECK(error_field(bad) == "groups");
  bad = c;
  bad.s_q = 2;
  bad.seqlens = {1};
  CHECK(error_field(bad) == "seqlens");  // 0 < T_b < S_q
  bad = c;
  bad.eps = 0;
  CHECK(error_field(bad) == "eps");
  bad.allow_zero_eps = true;
  CHECK(error_field(bad) == "");
  bad = c;
  bad.d_r = 7;
  CHECK(error_field(bad) == "d_r");
  bad = c;
  bad.seqlens = {5, 5};
  CHECK(error_field(bad) == "seqlens");  // batch 1
  MlaConfig g = c;  // the message names the rule broken, and it must throw (not a silent pass)
  g.groups = 3;
  CHECK_THROWS_WITH_AS(g.validate(), doctest::Contains("heads % groups"), ConfigError);
}

TEST_CASE("config.json_roundtrip_and_strict_keys") {
  MlaConfig c = test::tiny_config(Profile::FP16, {3, 0, 8}, 2, NormMode::Unified, 99);
  c.rope_order = RopeOrder::RopeThenNorm;
  c.rope_style = RopeStyle::Half;
  c.causal = false;
  c.set_default_scale();
  const MlaConfig back = config_from_json(config_to_json(c));
  CHECK(config_to_json(back) == config_to_json(c));
  std::string typo = config_to_json(c);
  typo.replace(typo.find("\"causal\""), 8, "\"casual\"");
  CHECK_THROWS_WITH_AS(config_from_json(typo), doctest::Contains("casual: unknown config key"),
                       ConfigError);
  std::string wrong = config_to_json(c);
  wrong.replace(wrong.find("\"heads\":4"), 9, "\"heads\":\"4\"");
  CHECK_THROWS_WITH_AS(config_from_json(wrong), doctest::Contains("heads: must be an integer"),
                       ConfigError);
  // Never silently truncated: a fractional or out-of-range integer is refused.
  for (const char* bad : {"\"heads\":4.5", "\"heads\":4294967300", "\"heads\":true"}) {
    std::string w = config_to_json(c);
    w.replace(w.find("\"heads\":4"), 9, bad);
    CAPTURE(w);
    CHECK_THROWS_WITH_AS(config_from_json(w), doctest::Contains("heads:"), ConfigError);
  }
  CHECK_THROWS_AS(config_from_json("{\"heads\": 4}"), ConfigError);  // missing keys
  CHECK_THROWS_AS(config_from_json("not json"), ConfigError);
}

TEST_CASE("config.presets_match_spec") {
  const Preset& p = find_preset("paper-g8");
  CHECK(p.heads == 16);
  CHECK(p.groups == 8);
  CHECK(p.latent_rank == 512);
  // conventions §8's six, and the shape classes of issue 11: NoPE (d_r = 0) and G < H (G = 1).
  CHECK(presets().size() == 10);
  for (const char* name :
       {"tiny", "paper-decode", "paper-g8", "deepseek-v3", "deepseek-v2-lite", "kimi-k2"})
    CHECK_NOTHROW(find_preset(name));
  CHECK(find_preset("nope-h10").d_r == 0);
  CHECK(find_preset("tiny-nope").d_r == 0);
  CHECK(find_preset("paper-g1").groups == 1);
  CHECK(find_preset("tiny-g1").groups == 1);
  CHECK_THROWS_AS(find_preset("nope"), ConfigError);
}
