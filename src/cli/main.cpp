// qkmla: the command-line front end. Exit codes: 0 ok/pass, 1 a verdict failed, 2 bad usage or
// bad input (with a message naming the field, file or tensor).
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/case_flags.hpp"
#include "cli/provenance.hpp"
#include "core/presets.hpp"
#include "io/safetensors.hpp"
#include "report/report.hpp"

using namespace qkmla;

namespace {

int write_output(const std::string& text, const std::string& path) {
  if (path.empty()) {
    std::cout << text;
    return 0;
  }
  std::ofstream o(path);
  if (!o) {
    std::cerr << "qkmla: --output " << path << ": cannot be written\n";
    return 2;
  }
  o << text;
  return 0;
}

int cmd_presets(const std::string& format) {
  std::string s;
  if (format == "json") {
    s = "[";
    for (size_t i = 0; i < presets().size(); ++i) {
      const Preset& p = presets()[i];
      s += fmt::format("{}{{\"name\": \"{}\", \"heads\": {}, \"groups\": {}, \"latent_rank\": {}, \"d_c\": {}, "
                       "\"d_r\": {}, \"d_v\": {}}}", i ? ", " : "", p.name, p.heads, p.groups, p.latent_rank, p.d_c, p.d_r, p.d_v);
    }
    s += "]\n";
  } else {
    s = fmt::format("{:<18} {:>4} {:>4} {:>5} {:>5} {:>5} {:>5}  {}\n", "preset", "H", "G", "r", "d_c", "d_r", "d_v", "notes");
    for (const Preset& p : presets())
      s += fmt::format("{:<18} {:>4} {:>4} {:>5} {:>5} {:>5} {:>5}  {}\n", p.name, p.heads, p.groups, p.latent_rank,
                       p.d_c, p.d_r, p.d_v, p.notes);
  }
  std::cout << s;
  return 0;
}

struct ReportFlags {
  cli::CaseFlags c;
  int ref_bits = 113;
  int threads = 2;
  std::string format = "table", output;
};

int cmd_report(const ReportFlags& f, const std::string& command_line) {
  ReportOptions opts;
  opts.cfg = cli::build_config(f.c, 4096);
  opts.profiles = cli::build_profiles(f.c, opts.profiles);
  opts.ref_bits = f.ref_bits;
  opts.threads = f.threads;
  if (isatty(2)) opts.progress = [](const std::string& s) { std::cerr << "[qkmla] " << s << "\n"; };
  const Report r = run_report(opts);
  const std::string how = cli::provenance(command_line, opts.threads);
  std::string text;
  if (f.format == "json") text = render_json(r, how);
  else if (f.format == "md") text = render_markdown(r, how);
  else if (f.format == "csv") text = render_csv(r);
  else text = render_table(r, how);
  if (const int rc = write_output(text, f.output)) return rc;
  if (!r.reference_ok()) {
    std::cerr << "qkmla report: refused: the reference agrees with its check run on fewer bits than "
                 "required (stored precision + 20); raise --ref-bits\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qkmla: numerical verification of QK-Normed MLA (explicit vs absorbed, every precision)"};
  app.require_subcommand(1);
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);

  std::string presets_format = "table";
  auto* presets_cmd = app.add_subcommand("presets", "list the model presets and their dims");
  presets_cmd->add_option("--format", presets_format, "table|json")->check(CLI::IsMember({"table", "json"}));

  ReportFlags rf;
  auto* report_cmd = app.add_subcommand("report", "per-precision error report of every implementation against the reference");
  cli::add_case_flags(*report_cmd, rf.c, 4096);
  report_cmd->add_option("--ref-bits", rf.ref_bits, "reference precision P in bits (checked at 2P)")
      ->check(CLI::Range(64, 4096))->capture_default_str();
  report_cmd->add_option("--threads", rf.threads, "worker threads")->check(CLI::Range(1, 64))->capture_default_str();
  report_cmd->add_option("--format", rf.format, "table|md|json|csv")->check(CLI::IsMember({"table", "md", "json", "csv"}))->capture_default_str();
  report_cmd->add_option("--output,-o", rf.output, "write to FILE instead of stdout");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "qkmla: " << e.what() << "\n(run 'qkmla --help' or 'qkmla <command> --help')\n";
    return 2;
  }
  try {
    if (presets_cmd->parsed()) return cmd_presets(presets_format);
    if (report_cmd->parsed()) return cmd_report(rf, command_line);
  } catch (const ConfigError& e) {
    std::cerr << "qkmla: invalid case: " << e.what() << "\n";
    return 2;
  } catch (const InputError& e) {
    std::cerr << "qkmla: bad input: " << e.what() << "\n";
    return 2;
  }
  return 2;
}
