// `qkmla gate` configuration (TOML): a matrix of presets x scenarios x profiles x norms x rope
// orders x seeds, each entry naming the implementations it judges and what it expects of them.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"
#include "harness/budgets.hpp"

namespace qkmla {

struct GateEntry {
  std::string name;
  std::vector<std::string> presets, scenarios, profiles, norms, rope_orders, impls;
  std::vector<uint64_t> seeds;
  std::vector<int> seqlens;
  int sq = 1;
  int topk = 0;             // conventions §1.5: sparse top-k (0: dense)
  bool attn_sink = false;   // conventions §1.5: per-head sink logits
  bool expect_pass = true;  // "pass": every verdict passes; "fail": every mutant is killed
};

struct GateConfig {
  std::string source;  // the file it came from (or the built-in default's name), for messages
  int ref_bits = 113;
  std::vector<std::string> tensors{"out", "lse", "alpha_k", "latent_out"};
  GateRule rule;
  std::vector<GateEntry> entries;
};

// One unit of work: a case and the implementation patterns judged on it.
struct GateJob {
  size_t entry = 0;
  MlaConfig cfg;
  std::string label;  // "tiny/normal/bf16/blockwise/norm_then_rope/seed1"
};

GateConfig parse_gate_config(const std::string& path);  // InputError naming file and key
GateConfig parse_gate_config_text(const std::string& text, const std::string& name);
const std::string& default_gate_config_text();          // src/gate/default.toml, compiled in
std::vector<GateJob> expand_jobs(const GateConfig& c);  // deterministic order

}  // namespace qkmla
