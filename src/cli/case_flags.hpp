// The case flags every case-building command accepts (SPEC §11).
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace qkmla::cli {

struct CaseFlags {
  std::string preset = "paper-decode";
  std::optional<int> batch;
  std::optional<int> seqlen;
  std::vector<int> seqlens;
  int sq = 1;
  std::string norm = "blockwise", rope_order = "norm_then_rope", rope_style = "interleaved";
  std::optional<double> eps, softmax_scale;
  bool causal = true;
  std::string scenario = "normal";
  uint64_t seed = 1;
  std::vector<std::string> profiles;  // --profile / --profiles
};

void add_case_flags(CLI::App& app, CaseFlags& f, int default_seqlen);
// Throws ConfigError naming the flag's field when the combination is invalid.
MlaConfig build_config(const CaseFlags& f, int default_seqlen);
std::vector<Profile> build_profiles(const CaseFlags& f, const std::vector<Profile>& defaults);

}  // namespace qkmla::cli
