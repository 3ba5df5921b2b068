// qkmla gate (CI verdicts over a matrix, sharded and mergeable) and qkmla mutants (kill matrix).
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "cli/provenance.hpp"
#include "core/impl_id.hpp"
#include "gate/kill_matrix.hpp"
#include "gate/run_gate.hpp"
#include "impl/mutants.hpp"
#include "io/safetensors.hpp"

namespace qkmla::cli {

namespace {

struct GateFlags {
  std::string config, junit, format = "table", output, shard = "1/1";
  std::vector<std::string> merge;
  int threads = 2;
};

void parse_shard(const std::string& s, int& k, int& n) {
  if (std::sscanf(s.c_str(), "%d/%d", &k, &n) != 2 || n < 1 || k < 1 || k > n)
    throw ConfigError("shard", "--shard must be K/N with 1 <= K <= N (got '" + s + "')");
}

GateConfig load_config(const std::string& path) {
  return path.empty() ? parse_gate_config_text(default_gate_config_text(),
                                               "default gate config (src/gate/default.toml)")
                      : parse_gate_config(path);
}

}  // namespace

Runner add_gate(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<GateFlags>();
  auto* cmd = app.add_subcommand("gate",
                                 "CI gate: run a matrix of cases x implementations, apply the "
                                 "budgets, exit 1 on a failed verdict");
  cmd->add_option("--config", f->config,
                  "gate matrix (TOML); default: the built-in src/gate/default.toml")
      ->check(CLI::ExistingFile);
  cmd->add_option("--junit", f->junit, "write JUnit XML (one testcase per verdict) to FILE");
  cmd->add_option("--format", f->format, "table|md|json (json: shard results for --merge)")
      ->check(CLI::IsMember({"table", "md", "json"}))
      ->capture_default_str();
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  cmd->add_option("--shard", f->shard, "run shard K of N of the matrix (K/N)")
      ->capture_default_str();
  cmd->add_option("--merge", f->merge,
                  "combine shard results (files written with --format json) into one verdict")
      ->check(CLI::ExistingFile);
  cmd->add_option("--threads", f->threads, "worker threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  return [f, command_line] {
    GateResults r;
    if (!f->merge.empty()) {
      for (const std::string& path : f->merge) merge_into(r, results_from_json(path));
    } else {
      int k = 1, n = 1;
      parse_shard(f->shard, k, n);
      r = run_gate(load_config(f->config), k, n, f->threads);
    }
    const std::string how = "Made by " + provenance(command_line, f->threads) + ".";
    const std::string summary = fmt::format("{} passed, {} failed\n", r.passed(), r.failed());
    if (!f->junit.empty())
      if (const int rc = write_output(junit_xml(r), f->junit, "--junit")) return rc;
    if (f->format == "json") {
      if (const int rc = write_output(results_json(r), f->output)) return rc;
      std::cerr << summary;
    } else if (const int rc = write_output(gate_markdown(r, how), f->output)) {
      return rc;
    } else if (!f->output.empty()) {
      std::cout << summary;
    }
    return r.failed() == 0 ? 0 : 1;
  };
}

namespace {
struct MutantFlags {
  std::vector<std::string> profiles{"fp64", "fp32", "bf16", "fp16", "fp8"};
  std::string config, format = "table", output;
  int threads = 2;
};
}  // namespace

Runner add_mutants(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<MutantFlags>();
  auto* cmd = app.add_subcommand(
      "mutants", "kill matrix: which mutants of conventions §7 the gate catches, per profile");
  cmd->add_option("--profiles", f->profiles, "profiles, comma separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp64", "fp32", "bf16", "fp16", "fp8", "fp8-block128"}));
  refuse_repeats(*cmd, f->profiles, "--profiles");
  cmd->add_option("--config", f->config,
                  "gate matrix (TOML) whose mutant entries are run; default: the built-in one")
      ->check(CLI::ExistingFile);
  cmd->add_option("--format", f->format, "table|json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  cmd->add_option("--threads", f->threads, "worker threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  return [f, command_line] {
    const GateConfig c = mutant_entries(load_config(f->config), f->profiles);
    const std::vector<KillCell> cells = kill_matrix(run_gate(c, 1, 1, f->threads), f->profiles);
    const std::string how = provenance(command_line, f->threads);
    const std::string text =
        f->format == "json"
            ? nlohmann::ordered_json{{"how", how}, {"cells", kill_matrix_json(cells)}}.dump(1) +
                  "\n"
            : "Made by " + how + ".\n\n" + kill_matrix_table(cells, f->profiles);
    if (const int rc = write_output(text, f->output)) return rc;
    return survived(cells) == 0 ? 0 : 1;
  };
}

}  // namespace qkmla::cli
