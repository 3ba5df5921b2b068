#include "gate/gate_config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "core/generator.hpp"
#include "core/presets.hpp"
#include "io/safetensors.hpp"
#include "io/toml_text.hpp"

namespace qkmla {

namespace {

template <class T>
std::vector<T> list(const std::string& path, const std::string& where, const toml::table& t,
                    const char* key, std::vector<T> fallback) {
  const toml::node* n = t.get(key);
  if (!n) return fallback;
  const toml::array* a = n->as_array();
  if (!a) throw InputError(path, where + "." + key, "must be an array");
  std::vector<T> out;
  for (const toml::node& x : *a) {
    const auto v = x.value<T>();
    if (!v) throw InputError(path, where + "." + key, "has an element of the wrong type");
    out.push_back(*v);
  }
  if (out.empty()) throw InputError(path, where + "." + key, "must not be empty");
  return out;
}

// A value named twice in one list would run (or judge) the same jobs twice, under one name.
template <class T>
void refuse_repeats(const std::string& path, const std::string& where, const char* key,
                    const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (v[i] == v[j])
        throw InputError(path, where + "." + key, fmt::format("names {} twice", v[i]));
}

}  // namespace

GateConfig parse_gate_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "file", "cannot be opened");
  return parse_gate_config_text(
      {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}, path);
}

const std::string& default_gate_config_text() {
  static const std::string text =
#include "gate/default_toml.inc"
      ;
  return text;
}

GateConfig parse_gate_config_text(const std::string& text, const std::string& path) {
  const toml::table t = parse_toml(text, path);
  static const std::set<std::string> top = {"ref_bits",          "tensors", "baseline_k",
                                            "baseline_k_source", "budget",  "entry"};
  for (const auto& [key, node] : t)
    if (!top.count(std::string(key.str())))
      throw InputError(path, std::string(key.str()), "unknown key");
  GateConfig c;
  c.source = path;
  c.rule = default_rule();
  apply_budget_text(c.rule, text, path);  // baseline_k and [[budget]] live in the same file
  c.ref_bits = int(t["ref_bits"].value_or(int64_t(113)));
  if (c.ref_bits < 64 || c.ref_bits > 4096)
    throw InputError(path, "ref_bits", "must be in [64, 4096]");
  c.tensors = list<std::string>(path, "", t, "tensors", c.tensors);
  const toml::array* entries = t["entry"].as_array();
  if (!entries || entries->empty()) throw InputError(path, "entry", "needs at least one [[entry]]");
  static const std::set<std::string> keys = {
      "name",  "presets", "scenarios", "profiles", "norms", "rope_orders", "impls",
      "seeds", "seqlens", "sq",        "expect",   "topk",  "attn_sink"};
  for (size_t i = 0; i < entries->size(); ++i) {
    const toml::table* e = (*entries)[i].as_table();
    const std::string where = fmt::format("entry[{}]", i);
    if (!e) throw InputError(path, where, "must be a table");
    for (const auto& [key, node] : *e)
      if (!keys.count(std::string(key.str())))
        throw InputError(path, where + "." + std::string(key.str()), "unknown key");
    GateEntry g;
    g.name = (*e)["name"].value_or(where);
    g.presets = list<std::string>(path, where, *e, "presets", {"tiny"});
    g.scenarios = list<std::string>(path, where, *e, "scenarios", {"normal"});
    g.profiles = list<std::string>(path, where, *e, "profiles", {"fp64", "fp32", "bf16", "fp16"});
    g.norms = list<std::string>(path, where, *e, "norms", {"blockwise"});
    g.rope_orders = list<std::string>(path, where, *e, "rope_orders", {"norm_then_rope"});
    g.impls = list<std::string>(path, where, *e, "impls", {"cpu.absorbed*"});
    for (int64_t s : list<int64_t>(path, where, *e, "seeds", {1})) {
      if (s < 0) throw InputError(path, where + ".seeds", fmt::format("{} is negative", s));
      g.seeds.push_back(uint64_t(s));
    }
    for (int64_t s : list<int64_t>(path, where, *e, "seqlens", {0, 17, 40}))
      g.seqlens.push_back(int(s));
    g.sq = int((*e)["sq"].value_or(int64_t(1)));
    g.topk = int((*e)["topk"].value_or(int64_t(0)));
    if (g.topk < 0) throw InputError(path, where + ".topk", "must be >= 0");
    g.attn_sink = (*e)["attn_sink"].value_or(false);
    const std::string expect = (*e)["expect"].value_or(std::string("pass"));
    if (expect != "pass" && expect != "fail")
      throw InputError(path, where + ".expect", "must be \"pass\" or \"fail\"");
    g.expect_pass = expect == "pass";
    refuse_repeats(path, where, "presets", g.presets);
    refuse_repeats(path, where, "scenarios", g.scenarios);
    refuse_repeats(path, where, "profiles", g.profiles);
    refuse_repeats(path, where, "norms", g.norms);
    refuse_repeats(path, where, "rope_orders", g.rope_orders);
    refuse_repeats(path, where, "impls", g.impls);
    refuse_repeats(path, where, "seeds", g.seeds);
    for (const GateEntry& other : c.entries)
      if (other.name == g.name)
        throw InputError(path, where + ".name",
                         "'" + g.name + "' names another entry too (test names would collide)");
    for (const auto& sc : g.scenarios) {
      const auto& known = scenario_names();
      if (std::find(known.begin(), known.end(), sc) == known.end())
        throw InputError(
            path, where + ".scenarios",
            fmt::format("unknown scenario '{}' (known: {})", sc, fmt::join(known, ", ")));
    }
    try {  // names are checked now, not halfway through a long run
      for (const auto& p : g.presets) find_preset(p);
      for (const auto& p : g.profiles) parse_profile(p);
      for (const auto& n : g.norms) parse_norm(n);
      for (const auto& r : g.rope_orders) parse_rope_order(r);
    } catch (const ConfigError& err) {
      throw InputError(path, where + "." + err.field, err.what());
    }
    c.entries.push_back(std::move(g));
  }
  return c;
}

std::vector<GateJob> expand_jobs(const GateConfig& c) {
  std::vector<GateJob> jobs;
  for (size_t ei = 0; ei < c.entries.size(); ++ei) {
    const GateEntry& e = c.entries[ei];
    for (const auto& preset : e.presets)
      for (const auto& scenario : e.scenarios)
        for (const auto& profile : e.profiles)
          for (const auto& norm : e.norms)
            for (const auto& order : e.rope_orders)
              for (uint64_t seed : e.seeds) {
                MlaConfig cfg = config_for(find_preset(preset), 1);
                cfg.seqlens = e.seqlens;
                cfg.batch = int(e.seqlens.size());
                cfg.s_q = e.sq;
                cfg.topk = e.topk;
                cfg.attn_sink = e.attn_sink;
                cfg.scenario = scenario;
                cfg.profile = parse_profile(profile);
                cfg.norm = parse_norm(norm);
                cfg.rope_order = parse_rope_order(order);
                cfg.seed = seed;
                const std::string label = fmt::format(
                    "{}/{}/{}/{}/{}/seed{}{}{}", preset, scenario, profile, norm, order, seed,
                    e.topk ? fmt::format("/topk{}", e.topk) : "", e.attn_sink ? "/sink" : "");
                jobs.push_back({ei, cfg, label});
              }
  }
  return jobs;
}

}  // namespace qkmla
