// The case flags every case-building command accepts (conventions §11).
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace qkmla::cli {

struct CaseFlags {
  std::string preset = "paper-decode";
  std::string config_file;  // --config: JSON or TOML with conventions §9 keys (a partial config)
  std::optional<int> heads, groups, latent_rank, d_c, d_r, d_v;
  std::optional<int> batch;
  std::optional<int> seqlen;
  std::vector<int> seqlens;
  int sq = 1;
  std::string norm = "blockwise", rope_order = "norm_then_rope", rope_style = "interleaved";
  std::optional<double> eps, softmax_scale;
  bool causal = true;
  std::optional<int> topk;  // conventions §1.5
  bool attn_sink = false;
  std::string scenario = "normal";
  uint64_t seed = 1;
  std::vector<std::string> profiles;  // --profile / --profiles
  const CLI::App* app = nullptr;      // which flags were given (set by add_case_flags)
};

void add_case_flags(CLI::App& app, CaseFlags& f, int default_seqlen);

// Refuses, when `app` has parsed, a list flag that names one value twice (it would run twice and
// print its rows twice). `values` must outlive the parse. One per app (CLI11 keeps one callback).
void refuse_repeats(CLI::App& app, const std::vector<std::string>& values, const std::string& flag);

// app.parse over `args` (in order, without the program name). What CLI11's value conversions
// throw besides its own errors (std::stoll's std::out_of_range for
// --no-causal=99999999999999999999) becomes a CLI::ConversionError naming the arguments: every bad
// flag is a CLI::ParseError.
void parse_args(CLI::App& app, const std::vector<std::string>& args);
// The preset's dims, then the --config file's keys, then every flag given on the command line.
// Throws ConfigError naming the key when the combination is invalid, InputError for a bad file.
MlaConfig build_config(const CaseFlags& f, int default_seqlen);
std::vector<Profile> build_profiles(const CaseFlags& f, const std::vector<Profile>& defaults);

// Only what was given (flags, --config file, --preset's dims), as a JSON object of conventions §9
// keys: the overrides of a config read from elsewhere (golden --inputs).
std::string given_overrides_json(const CaseFlags& f);

// A --config file's keys as a JSON object text (TOML files are converted); InputError naming the
// file when it cannot be read or parsed.
std::string config_file_json(const std::string& path);

}  // namespace qkmla::cli
