// libFuzzer target for the text input paths: the budget TOML (--budgets), the gate TOML (--config
// of `qkmla gate`), a config JSON object (the case's qkmla.config, --config files after TOML
// conversion) and the case flags on the command line into the config validator. The first byte
// picks the path, the rest is the text. Bad input must end in InputError / ConfigError /
// CLI::ParseError (exit 2 in the CLI, with a message), never a crash, a leak or undefined
// behaviour.
#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cli/case_flags.hpp"
#include "core/config.hpp"
#include "gate/gate_config.hpp"
#include "harness/budgets.hpp"
#include "io/safetensors.hpp"

namespace {

void budget_toml(const std::string& text) {
  qkmla::GateRule rule = qkmla::default_rule();
  qkmla::apply_budget_text(rule, text, "fuzz.toml");
}

void gate_toml(const std::string& text) {
  const qkmla::GateConfig c = qkmla::parse_gate_config_text(text, "fuzz.toml");
  size_t n = 1;  // expand only what a real run could hold
  for (const qkmla::GateEntry& e : c.entries)
    n += e.presets.size() * e.scenarios.size() * e.profiles.size() * e.norms.size() *
         e.rope_orders.size() * e.seeds.size();
  if (n < 100000) qkmla::expand_jobs(c);
}

void config_json(const std::string& text) {
  qkmla::MlaConfig c = qkmla::config_from_json(text);
  qkmla::apply_config_json(c, text);
}

// Whitespace-separated words as argv. A word naming --config would read a file from disk: skipped,
// so a run depends only on its input.
void case_flags(const std::string& text) {
  std::vector<std::string> args;
  std::istringstream words(text);
  for (std::string w; words >> w && args.size() < 64;)
    if (w.find("config") == std::string::npos) args.push_back(w);
  CLI::App app{"fuzz"};
  qkmla::cli::CaseFlags f;
  qkmla::cli::add_case_flags(app, f, 64);
  try {
    qkmla::cli::parse_args(app, args);
  } catch (const CLI::ParseError&) {
    return;
  }
  qkmla::cli::build_config(f, 64);
  qkmla::cli::build_profiles(f, {qkmla::Profile::BF16});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        budget_toml(text);
        break;
      case 1:
        gate_toml(text);
        break;
      case 2:
        config_json(text);
        break;
      default:
        case_flags(text);
        break;
    }
  } catch (const qkmla::InputError&) {
  } catch (const qkmla::ConfigError&) {
  }
  return 0;
}
