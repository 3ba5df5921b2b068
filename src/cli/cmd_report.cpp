#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "cli/progress.hpp"
#include "cli/provenance.hpp"
#include "harness/resources.hpp"
#include "io/safetensors.hpp"
#include "render/presets_view.hpp"
#include "report/charts.hpp"
#include "report/contexts.hpp"
#include "report/report.hpp"

namespace qkmla::cli {

Runner add_presets(CLI::App& app) {
  auto format = std::make_shared<std::string>("table");
  auto* cmd = app.add_subcommand("presets", "list the model presets and their dims");
  cmd->add_option("--format", *format, "table|json")->check(CLI::IsMember({"table", "json"}));
  return [format] {
    std::cout << (*format == "json" ? presets_json() : presets_table());
    return 0;
  };
}

namespace {
struct ReportFlags {
  CaseFlags c;
  int ref_bits = 113;
  int check_bits = 0;
  int threads = 2;
  std::string format = "table", output, plot;
  std::vector<int> contexts;
  ReportView view;
  bool estimate = false;
};

// --estimate-memory: the memory model's estimate for the cases held at once, and what is available.
int print_estimate(const std::vector<MlaConfig>& at_once, int threads, const std::string& what) {
  const double need = report_peak_bytes(at_once, threads);
  std::string source;
  const double have = available_bytes(&source);
  std::cout << fmt::format("{}: estimated peak {:.0f} bytes ({}); available {} ({})\n", what, need,
                           human_bytes(need), human_bytes(have), source);
  return 0;
}

// --contexts: the report at each context, one profile at a time.
int run_contexts(const ReportFlags& f, ReportOptions opts, const std::string& command_line) {
  if (f.format == "html" || f.format == "csv")
    throw ConfigError("format", "--contexts prints table, md or json");
  std::vector<int> contexts = f.contexts;
  std::sort(contexts.begin(), contexts.end());
  contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());  // one column each
  MlaConfig largest = opts.cfg;
  largest.seqlens.assign(size_t(largest.batch), contexts.back());
  if (f.estimate) {  // one profile at a time: the largest of them
    std::vector<MlaConfig> each;
    for (Profile p : opts.profiles) each.push_back(largest), each.back().profile = p;
    const auto worst = std::max_element(each.begin(), each.end(), [](const auto& a, const auto& b) {
      return case_peak_bytes(a) < case_peak_bytes(b);
    });
    return print_estimate({*worst}, f.threads,
                          fmt::format("--contexts up to {} tokens", contexts.back()));
  }
  require_memory({largest}, fmt::format("--contexts up to {} tokens", contexts.back()),
                 "smaller --contexts (each context runs one profile at a time)");
  opts.progress = {};
  const ContextSweep s = run_context_sweep(opts, contexts, progress_bar());
  const std::string how = provenance(command_line, opts.threads);
  if (!f.plot.empty())
    if (std::string err = write_context_charts(s, f.plot); !err.empty())
      throw InputError(f.plot, "plot", err);
  const std::string text = f.format == "json" ? render_context_json(s, how)
                                              : render_context_table(s, how, f.format == "md");
  if (const int rc = write_output(text, f.output)) return rc;
  if (!s.reference_ok()) {
    std::cerr << "qkmla report: refused: the reference agrees with its check run on fewer bits "
                 "than required at some context; raise --ref-bits\n";
    return 1;
  }
  return 0;
}

// The charts as SVG documents (drawn to `path`, or to a temporary file for HTML only).
std::vector<std::string> charts(const Report& r, const std::string& path, bool want) {
  if (path.empty() && !want) return {};
  const std::string where = path.empty() ? (std::filesystem::temp_directory_path() /
                                            ("qkmla-report-" + std::to_string(::getpid()) + ".svg"))
                                               .string()
                                         : path;
  if (std::string err = write_report_charts(r, where); !err.empty())
    throw InputError(where, "plot", err);
  std::vector<std::string> svgs;
  for (const std::string& f : chart_paths(where)) {
    std::ifstream in(f);
    svgs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (path.empty()) std::filesystem::remove(f);
  }
  return svgs;
}
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
  cmd->add_option("--format", f->format, "table|md|html|json|csv (html: one self-contained file)")
      ->check(CLI::IsMember({"table", "md", "html", "json", "csv"}))
      ->capture_default_str();
  cmd->add_flag("--wide", f->view.wide,
                "every column (max_abs, cos_diff, bound, nonfinite, seconds, worst element)");
  cmd->add_flag("--worst-first", f->view.worst_first,
                "within each profile, the rows with the largest ratio first");
  cmd->add_option("--plot", f->plot,
                  "draw rel_l2 of out and lse by implementation and profile: FILE.svg and "
                  "FILE-lse.svg (gnuplot)");
  cmd->add_option("--contexts", f->contexts,
                  "error against context: the report at each of these tokens per sequence "
                  "(comma separated), one profile at a time; --plot draws rel_l2 and max_ulp of "
                  "out against context per profile")
      ->delimiter(',')
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))
      ->excludes("--wide")
      ->excludes("--worst-first");
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  cmd->add_flag("--estimate-memory", f->estimate,
                "print the peak memory the report is estimated to need (bytes) and what is "
                "available, and exit without running it");
  return [f, command_line] {
    ReportOptions opts;
    opts.cfg = build_config(f->c, 4096);
    opts.profiles = build_profiles(f->c, opts.profiles);
    opts.ref_bits = f->ref_bits;
    opts.check_bits = f->check_bits;
    if (opts.check_bits && opts.check_bits <= opts.ref_bits)
      throw ConfigError("check-bits", "must exceed --ref-bits");
    opts.threads = f->threads;
    if (!f->contexts.empty()) return run_contexts(*f, opts, command_line);
    if (isatty(2))
      opts.progress = [](const std::string& s) { std::cerr << "[qkmla] " << s << "\n"; };
    std::vector<MlaConfig> at_once;  // the report holds every profile's case at once
    for (Profile p : opts.profiles) at_once.push_back(opts.cfg), at_once.back().profile = p;
    if (f->estimate) return print_estimate(at_once, opts.threads, "this report");
    require_report_memory(
        at_once, opts.threads, "this report",
        at_once.size() > 1
            ? "--profile (one profile at a time: " + human_bytes(case_peak_bytes(opts.cfg)) +
                  "), a shorter --seqlen or fewer --batch sequences"
            : "a shorter --seqlen or fewer --batch sequences");
    const Report r = run_report(opts);
    const std::string how = provenance(command_line, opts.threads);
    const std::vector<std::string> svgs = charts(r, f->plot, f->format == "html");
    std::string text;
    if (f->format == "json")
      text = render_json(r, how);
    else if (f->format == "md")
      text = render_markdown(r, how, f->view);
    else if (f->format == "html")
      text = render_html(r, how, f->view, svgs);
    else if (f->format == "csv")
      text = render_csv(r);
    else
      text = render_table(r, how, f->view);
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
