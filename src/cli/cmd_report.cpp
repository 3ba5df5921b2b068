#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "cli/provenance.hpp"
#include "core/presets.hpp"
#include "report/report.hpp"

namespace qkmla::cli {

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

Runner add_presets(CLI::App& app) {
  auto format = std::make_shared<std::string>("table");
  auto* cmd = app.add_subcommand("presets", "list the model presets and their dims");
  cmd->add_option("--format", *format, "table|json")->check(CLI::IsMember({"table", "json"}));
  return [format] {
    std::string s;
    if (*format == "json") {
      s = "[";
      for (size_t i = 0; i < presets().size(); ++i) {
        const Preset& p = presets()[i];
        s += fmt::format(
            "{}{{\"name\": \"{}\", \"heads\": {}, \"groups\": {}, \"latent_rank\": {}, \"d_c\": "
            "{}, "
            "\"d_r\": {}, \"d_v\": {}}}",
            i ? ", " : "", p.name, p.heads, p.groups, p.latent_rank, p.d_c, p.d_r, p.d_v);
      }
      s += "]\n";
    } else {
      s = fmt::format("{:<18} {:>4} {:>4} {:>5} {:>5} {:>5} {:>5}  {}\n", "preset", "H", "G", "r",
                      "d_c", "d_r", "d_v", "notes");
      for (const Preset& p : presets())
        s += fmt::format("{:<18} {:>4} {:>4} {:>5} {:>5} {:>5} {:>5}  {}\n", p.name, p.heads,
                         p.groups, p.latent_rank, p.d_c, p.d_r, p.d_v, p.notes);
    }
    std::cout << s;
    return 0;
  };
}

namespace {
struct ReportFlags {
  CaseFlags c;
  int ref_bits = 113;
  int check_bits = 0;
  int threads = 2;
  std::string format = "table", output;
};
}  // namespace

Runner add_report(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<ReportFlags>();
  auto* cmd = app.add_subcommand(
      "report", "per-precision error report of every implementation against the reference");
  add_case_flags(*cmd, f->c, 4096);
  cmd->add_option("--ref-bits", f->ref_bits, "reference precision P in bits")
      ->check(CLI::Range(64, 4096))
      ->capture_default_str();
  cmd->add_option("--check-bits", f->check_bits,
                  "precision of the reference's check run (default P + 64)")
      ->check(CLI::Range(65, 8192));
  cmd->add_option("--threads", f->threads, "worker threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--format", f->format, "table|md|json|csv")
      ->check(CLI::IsMember({"table", "md", "json", "csv"}))
      ->capture_default_str();
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  return [f, command_line] {
    ReportOptions opts;
    opts.cfg = build_config(f->c, 4096);
    opts.profiles = build_profiles(f->c, opts.profiles);
    opts.ref_bits = f->ref_bits;
    opts.check_bits = f->check_bits;
    if (opts.check_bits && opts.check_bits <= opts.ref_bits)
      throw ConfigError("check-bits", "must exceed --ref-bits");
    opts.threads = f->threads;
    if (isatty(2))
      opts.progress = [](const std::string& s) { std::cerr << "[qkmla] " << s << "\n"; };
    const Report r = run_report(opts);
    const std::string how = provenance(command_line, opts.threads);
    std::string text;
    if (f->format == "json")
      text = render_json(r, how);
    else if (f->format == "md")
      text = render_markdown(r, how);
    else if (f->format == "csv")
      text = render_csv(r);
    else
      text = render_table(r, how);
    if (const int rc = write_output(text, f->output)) return rc;
    if (!r.reference_ok()) {
      std::cerr
          << "qkmla report: refused: the reference agrees with its check run on fewer bits than "
             "required (stored precision + 20); raise --ref-bits\n";
      return 1;
    }
    return 0;
  };
}

}  // namespace qkmla::cli
